"""kilocard's trainer: ``python -m kilocard.train <run_dir>`` on every rank.

Modules: ``entry`` (the per-rank entry and its exit codes), ``megatron_adapter`` (the only place
that builds Megatron-Core objects), ``trainer`` (the step loop), ``ckpt_manager`` (save, commit,
async finalisation, resume on the ranks), ``ckpt_state`` (the sharded state dict and RNG of a step),
``signals`` (stop requests, hang guard, exit-code record), ``claim`` (rank 0 claims the run-dir
lock), ``dist_env`` (torchrun/Slurm rank variables). What a run directory holds (names, events,
metrics, checkpoint protocol, lock, frozen config, progress and goodput) is ``kilocard.rundir``,
shared with the launchers.
"""
