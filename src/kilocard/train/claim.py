"""One writer per run directory, seen from the ranks: rank 0 claims the lock, every rank learns the verdict.

Under ``kilocard run`` the launcher already holds the lock and passes its token in
``KILOCARD_RUN_LOCK``; under Slurm (no token) rank 0 takes the lock itself for the job's lifetime.
Every rank gets the same verdict, so all of them exit with the same code (``BUSY``) and the batch
script sees one code, not a mix of BUSY and the FAULT of ranks whose peer went away.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed as dist

from kilocard.base.say import say
from kilocard.rundir.lock import TOKEN_ENV, LockUnsupported, RunDirBusy, RunLock, claim


def claim_run_dir(run_dir: Path, wait_s: float, save_root: Path | None = None) -> list[RunLock]:
    """Rank 0 claims ``run_dir`` (process group up), and ``save_root`` (a checkpoint directory outside the run
    directory) when given; raise ``RunDirBusy`` on every rank when another writer has either.

    An earlier start of this same Slurm job gets up to ``wait_s`` to let go (``runlock.claim``); the other
    ranks wait in the verdict's broadcast, so ``wait_s`` must stay inside the collective timeout.

    Returns the locks rank 0 took itself (none under ``kilocard run``, whose launcher holds them). A lock's
    descriptor is never closed by the garbage collector, so it lasts until ``release`` or the end of the process.
    """
    verdict: list[str | None] = [None]
    locks: list[RunLock] = []
    if dist.get_rank() == 0:
        dirs = [(run_dir, "run directory")] + ([(save_root, "checkpoint directory")] if save_root else [])
        try:
            for directory, what in dirs:
                directory.mkdir(parents=True, exist_ok=True)
                lock = _claim_one(directory, wait_s, what)
                if lock is not None:
                    locks.append(lock)
        except RunDirBusy as e:
            verdict = [str(e)]
            for lock in locks:
                lock.release()
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise RunDirBusy(verdict[0])
    return locks


def _claim_one(directory: Path, wait_s: float, what: str) -> RunLock | None:
    """``claim`` one directory; a filesystem without flock is a warning, not a refusal."""
    try:
        return claim(directory, os.environ.get(TOKEN_ENV), wait_s, what)
    except LockUnsupported as e:
        say(f"[rank 0] kilocard.train: warning: {e}", sys.stderr)
        return None
