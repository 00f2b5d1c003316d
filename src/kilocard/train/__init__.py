"""kilocard's trainer: ``python -m kilocard.train <run_dir>`` on every rank.

Modules: ``entry`` (the per-rank entry and its exit codes), ``megatron_adapter`` (the only place
that builds Megatron-Core objects), ``trainer`` (the step loop), ``ckpt_manager`` (save, commit,
async finalisation, resume on the ranks), ``checkpoint`` (the files: manifest, tracker, verify, which
step to resume), ``ckpt_state`` (the sharded state dict and RNG of a step), ``signals`` (stop requests,
hang guard, exit-code record), ``metrics`` (metrics.jsonl, TensorBoard, TFLOP/s and MFU),
``progress`` (live line, summary table), ``dist_env`` (torchrun/Slurm rank variables), ``names``
(file and variable names shared with the launchers; imports nothing).
"""
