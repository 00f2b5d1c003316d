"""The exit-code contract of ``python -m kilocard.train`` (and so of every Slurm job kilocard runs).

The batch script decides on these codes alone: DONE ends the chain, RETRY requeues (or leaves the
next chain link to continue), anything in NO_RETRY stops the chain and leaves the job FAILED; BUSY (a
second job on a run directory another job is writing) ends only that job: no requeue and no FAILED
marker, since the run directory belongs to the writer that holds its lock.

| code | name       | meaning                                                           | Slurm action        |
|------|------------|-------------------------------------------------------------------|---------------------|
| 0    | DONE       | trained to trainer.train_iters (or found the run already finished) | none; chain ends    |
| 75   | RETRY      | stopped at a step boundary after a committed save (USR1/TERM)     | requeue / next link |
| 76   | FAULT      | a rank died or hung; the last committed step is intact            | requeue / next link |
| 2    | BAD_CONFIG | frozen config missing/altered, or a resume with a changed model    | fail, do not retry  |
| 3    | BAD_CKPT   | the checkpoint to resume from failed its integrity check           | fail, do not retry  |
| 4    | BUSY       | another writer holds the run directory's lock (kilocard.runlock)  | end this job only   |
| 1    | CRASH      | any other error (a bug, NaN loss, disk full): a person must look   | fail, do not retry  |
"""

from __future__ import annotations

DONE = 0
CRASH = 1
BAD_CONFIG = 2
BAD_CKPT = 3
BUSY = 4
RETRY = 75
FAULT = 76

RETRYABLE = frozenset({RETRY, FAULT})
NO_RETRY = frozenset({CRASH, BAD_CONFIG, BAD_CKPT, BUSY})
