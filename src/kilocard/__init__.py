"""kilocard: from a named recipe to a validated, reproducible Megatron-Core run on Slurm.

The public Python API (``compose``, ``validate``, ``predict``, ``load_run_config`` and their types) is
``kilocard.api``. ``import kilocard`` imports nothing else (no torch, Megatron-Core or Hydra).
"""

__version__ = "0.1.0"
