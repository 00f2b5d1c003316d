"""One writer per run directory: an OS lock on ``<run_dir>/.lock`` (``fcntl.flock``).

``kilocard run`` takes the lock before it starts torchrun and hands its token to the ranks in
``KILOCARD_RUN_LOCK``; rank 0 of a Slurm job (no token) takes the lock itself. A checkpoint directory
outside the run directory (``checkpoint.save``) is locked the same way, with the same token. A second writer is
refused at once with the holder named. The kernel drops the lock when its holder dies, so a stale
lock never blocks; the holder info in the file (host, pid, Slurm job id) is only informational.
A requeued Slurm job that finds its own earlier start still holding the lock (a process of that start
not yet gone: Slurm's teardown, an unkillable task) waits for it up to ``EARLIER_START_WAIT_S``
before it gives up as busy (``claim``).
On a shared filesystem the lock needs flock support across nodes (NFSv4, Lustre ``-o flock``);
where the filesystem refuses flock, ``LockUnsupported`` says so and the callers run unlocked
with a warning, as before the lock existed.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = ".lock"
"""The lock file inside a run directory."""
TOKEN_ENV = "KILOCARD_RUN_LOCK"
"""Token of the launcher that holds the lock for the ranks it started."""
EARLIER_START_WAIT_S = 180.0
"""Seconds a requeued Slurm job waits for an earlier start of the same job to release the lock (Slurm's
KillWait, 30 s by default, plus its UnkillableStepTimeout, 60 s, with room to spare)."""


class RunDirBusy(Exception):
    """Another live process holds the run directory's lock."""


class LockUnsupported(Exception):
    """The run directory's filesystem has no ``flock`` (e.g. Lustre mounted without ``-o flock``)."""


@dataclass
class RunLock:
    """A held lock; ``release`` (or the process's exit) frees it."""

    path: Path
    """The lock file."""
    fd: int
    """Open descriptor that carries the flock."""
    token: str
    """Identity handed to the ranks (``KILOCARD_RUN_LOCK``)."""

    def release(self) -> None:
        """Clear the holder info and drop the lock."""
        if self.fd < 0:
            return
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = -1


def holder_info(token: str) -> dict[str, str | int | None]:
    """Who takes the lock: host, pid, Slurm job id (when in a job), start time and token."""
    return {
        "host": platform.node(),
        "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT", "0") if "SLURM_JOB_ID" in os.environ else None,
        "since": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "token": token,
    }


def describe(info: dict) -> str:
    """The holder in words (``pid 12 on host n1, Slurm job 7, since ...``)."""
    if not info:
        return "a process that has not written its name yet"
    job = f", Slurm job {info['slurm_job_id']}" if info.get("slurm_job_id") else ""
    if job and info.get("slurm_restart_count") is not None:
        job += f" (restart {info['slurm_restart_count']})"
    return f"pid {info.get('pid')} on host {info.get('host')}{job}, since {info.get('since')}"


def read_holder(run_dir: Path) -> dict:
    """The holder info in the lock file (empty when none or unreadable)."""
    try:
        info = json.loads((run_dir / LOCK_FILE).read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def acquire(run_dir: Path, token: str | None = None, what: str = "run directory") -> RunLock:
    """Take the lock of ``run_dir`` (a ``what``: also a checkpoint directory outside the run directory) now
    or raise ``RunDirBusy`` naming the holder."""
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RunDirBusy(busy_message(run_dir, read_holder(run_dir), what)) from None
    except OSError as e:
        os.close(fd)
        raise LockUnsupported(
            f"{path}: the filesystem refuses flock ({e.strerror}); one writer per run directory is not "
            f"enforced here (mount it with flock support, e.g. Lustre -o flock, to have it)"
        ) from None
    token = token or uuid.uuid4().hex
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(holder_info(token)) + "\n").encode())
    return RunLock(path=path, fd=fd, token=token)


def busy_message(run_dir: Path, info: dict, what: str = "run directory") -> str:
    """One line: the directory (a ``what``), its holder, and what to do."""
    return (
        f"{what} {run_dir} is in use by another writer ({describe(info)}); "
        f"one writer per {what}: wait for it to end or stop it, then resume"
    )


def claim(
    run_dir: Path, token: str | None, wait_s: float = EARLIER_START_WAIT_S, what: str = "run directory"
) -> RunLock | None:
    """Rank 0's check: ``None`` when the launcher with ``token`` holds the lock, else the lock taken here.

    When the holder is an earlier start of this same Slurm job (requeued), wait up to ``wait_s`` for it
    to go. Raises ``RunDirBusy`` when another writer holds it; ``LockUnsupported`` passes through.
    """
    try:
        return acquire(run_dir, what=what)
    except RunDirBusy:
        holder = read_holder(run_dir)
        if token and holder.get("token") == token:
            return None
        if not earlier_start_of_this_job(holder, os.environ):
            raise
    print(
        f"kilocard: run directory {run_dir} is still held by an earlier start of this job ({describe(holder)}); "
        f"waiting up to {wait_s:.0f}s for it to exit",
        file=sys.stderr,
        flush=True,
    )
    return acquire_within(run_dir, wait_s, what=what)


def earlier_start_of_this_job(holder: Mapping, env: Mapping[str, str]) -> bool:
    """Whether ``holder`` is this Slurm job before its last requeue (same job id, other restart count)."""
    job = env.get("SLURM_JOB_ID")
    if not job or str(holder.get("slurm_job_id")) != job:
        return False
    return str(holder.get("slurm_restart_count")) != env.get("SLURM_RESTART_COUNT", "0")


def acquire_within(run_dir: Path, wait_s: float, poll_s: float = 1.0, what: str = "run directory") -> RunLock:
    """``acquire``, retried every ``poll_s`` until ``wait_s`` has passed; then its ``RunDirBusy``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return acquire(run_dir, what=what)
        except RunDirBusy:
            if time.monotonic() >= deadline:
                raise
        time.sleep(poll_s)
