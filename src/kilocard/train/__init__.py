"""kilocard's trainer: ``python -m kilocard.train <run_dir>`` on every rank.

Modules: ``entry`` (the per-rank entry and its exit codes), ``megatron_adapter`` (the only place
that builds Megatron-Core objects), ``trainer`` (the step loop), ``checkpoint`` (commit, verify,
resume), ``signals`` (stop requests, hang guard), ``metrics`` (metrics.jsonl, TensorBoard,
TFLOP/s and MFU), ``dist_env`` (torchrun/Slurm rank variables).
"""
