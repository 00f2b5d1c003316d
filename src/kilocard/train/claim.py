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

from kilocard.rundir.lock import TOKEN_ENV, LockUnsupported, RunDirBusy, RunLock, claim


def claim_run_dir(run_dir: Path, wait_s: float) -> RunLock | None:
    """Rank 0 claims ``run_dir`` (process group up); raise ``RunDirBusy`` on every rank when another writer has it.

    An earlier start of this same Slurm job gets up to ``wait_s`` to let go (``runlock.claim``); the other
    ranks wait in the verdict's broadcast, so ``wait_s`` must stay inside the collective timeout.

    Returns the lock when rank 0 took it itself, else ``None``. The lock's descriptor is never closed
    by the garbage collector, so the lock lasts until ``release`` or the end of the process.
    """
    verdict: list[str | None] = [None]
    lock = None
    if dist.get_rank() == 0:
        try:
            lock = claim(run_dir, os.environ.get(TOKEN_ENV), wait_s)
        except RunDirBusy as e:
            verdict = [str(e)]
        except LockUnsupported as e:
            print(f"[rank 0] kilocard.train: warning: {e}", file=sys.stderr, flush=True)
    dist.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise RunDirBusy(verdict[0])
    return lock
