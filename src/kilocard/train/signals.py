"""Stop requests, the hang guard, and forked helpers that die with their rank.

SIGUSR1 (Slurm's ``--signal=USR1@lead``) and SIGTERM only set a flag; the loop all-reduces the
flag at every step boundary, so every rank stops after the SAME step even when the signal reached
only some of them. The watchdog thread ends a rank that makes no progress for
``trainer.hang_timeout_s`` with exit code FAULT, a message saying where it stalled and every
thread's Python stack (``faulthandler``), so the log shows the call each rank hung in.
``die_with_parent_in_forks`` makes every process a rank forks (Megatron-Core's checkpoint writer
processes) die when the rank dies, so a killed rank's sockets close and its peers fail fast.
The watchdog also kills every process the rank started (``kill_started_children``).
``record_exit`` leaves the rank's exit code where ``kilocard run`` reads it (the watchdog's too).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import time

from kilocard.base.lifeline import die_with_parent_in_forks
from kilocard.base.say import say
from kilocard.exitcodes import FAULT
from kilocard.rundir.names import EXIT_DIR_ENV

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
"""Signals that request a save-and-stop at the next step boundary."""
STARTUP_GRACE_S = 300.0
"""Seconds allowed before the first training step (imports, rendezvous, model build, checkpoint
load) when ``trainer.hang_timeout_s`` is shorter: a slow start is not a hang."""


class StopFlag:
    """Set by a stop signal; read at step boundaries."""

    def __init__(self) -> None:
        self.signal: int | None = None
        """The first stop signal received, or ``None``."""

    @property
    def requested(self) -> bool:
        """Whether a stop signal has arrived on this rank."""
        return self.signal is not None

    def install(self) -> None:
        """Route SIGUSR1 and SIGTERM to this flag (main thread only)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signal is None:
            self.signal = signum

    @staticmethod
    def settle() -> None:
        """The run's outcome is decided: ignore a later SIGUSR1 from here to the process's end.

        Slurm's USR1 may come after the last step. At exit CPython gives every signal it handled back its
        default disposition, which for SIGUSR1 is death (exit 138, read as a FAULT that requeues a finished
        run); an ignored signal stays ignored. SIGTERM keeps its handler: a cancel must still end the rank.
        """
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


class Watchdog:
    """A daemon thread that exits the process with FAULT when ``beat`` stops for ``timeout_s``."""

    def __init__(self, timeout_s: float, rank: int) -> None:
        self.timeout_s = timeout_s
        self.rank = rank
        self.where = "start-up"
        self.training = False
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kilocard-watchdog", daemon=True)

    def start(self) -> Watchdog:
        """Start watching (no-op when the timeout is not positive)."""
        if self.timeout_s > 0:
            self._thread.start()
        return self

    def beat(self, where: str) -> None:
        """Record progress; ``where`` names the phase now running (shown if it stalls)."""
        self.where = where
        self.training = self.training or where.startswith("step ")
        self._last = time.monotonic()

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()

    def _run(self) -> None:
        period = min(5.0, max(0.05, self.timeout_s / 10))
        while not self._stop.wait(period):
            idle = time.monotonic() - self._last
            if idle > (self.timeout_s if self.training else max(self.timeout_s, STARTUP_GRACE_S)):
                say(
                    f"[rank {self.rank}] kilocard.train: no progress for {idle:.0f}s in {self.where} "
                    f"(trainer.hang_timeout_s={self.timeout_s:g}); a rank hung or died; exiting FAULT ({FAULT})",
                    sys.stderr,
                )
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                kill_started_children()
                record_exit(FAULT)  # os._exit skips the entry's own record
                os._exit(FAULT)


def kill_started_children() -> None:
    """SIGKILL every process this rank started, and theirs (before an ``os._exit``).

    Megatron-Core's checkpoint writer starts a ``multiprocessing`` Manager by *spawn* (a fresh interpreter:
    ``die_with_parent_in_forks`` does not reach it), and forks writer processes; one stuck in the save the
    watchdog ends could outlive the rank. A normal exit shuts the Manager down; after ``os._exit`` it would
    live on, holding the rank's stdout (Slurm waits 60 s for the step's output to end), and a stuck writer
    would also keep the rank's run-directory lock (``kilocard.rundir.lock``), which the requeued job needs."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:  # it ended on its own meanwhile
            continue


def record_exit(code: int) -> None:
    """Leave this rank's exit code in ``$KILOCARD_EXIT_DIR/rank_<RANK>``, where ``kilocard run`` reads it
    (torchrun reports only 0 or 1); nothing when the variable is unset (Slurm reads the exit status)."""
    exit_dir = os.environ.get(EXIT_DIR_ENV)
    if exit_dir:
        with open(os.path.join(exit_dir, f"rank_{os.environ.get('RANK', '0')}"), "w") as f:
            f.write(f"{code}\n")


__all__ = ["StopFlag", "Watchdog", "die_with_parent_in_forks", "record_exit"]
