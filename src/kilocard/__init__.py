"""kilocard: from a named recipe to a validated, reproducible Megatron-Core run on Slurm."""

__version__ = "0.1.0"
