"""The exit-code contract of ``python -m kilocard.train`` (and so of every Slurm job kilocard runs).

The batch script decides on these codes alone: DONE ends the chain, RETRY requeues (or leaves the
next chain link to continue), anything in NO_RETRY stops the chain and leaves the job FAILED; BUSY (a
second job on a run directory another job is writing) ends only that job: no requeue and no FAILED
marker, since the run directory belongs to the writer that holds its lock.

``TABLE`` below is the one list of codes: the batch script's comment block and its ``EXIT_*``
variables (``kilocard.launch.render``), the run summary (``kilocard.rundir.progress``) and the
verbs' help (``kilocard.commands.exits``) take their names from it.

In-job restarts (``launcher.max_restarts`` > 0): a restarting launcher (NVRx ``ft_launcher``,
torchrun) restarts every rank after any non-zero exit and reports only 0 or 1 itself. So each rank
writes its code to ``$KILOCARD_EXIT_DIR/rank_<RANK>`` and, when ``$KILOCARD_INJOB_RESTARTS`` is set,
exits non-zero only for codes in ``RESTART_IN_JOB`` (a fault: restart the ranks in the allocation);
a deliberate end (DONE, RETRY, BAD_CONFIG, ...) exits 0 so the launcher ends instead of repeating it.
The run's code is then ``from_exit_dir(EXIT_DIR, launcher_code)``; the batch script gets it with
``python -m kilocard.exitcodes EXIT_DIR LAUNCHER_CODE``.

BAD_NODE: every rank ends with it when a node of the job failed its health check (the node is in the
run directory's blocklist); it is not restarted in the job (the allocation holds the same node), the
batch script of an in-job run excludes the listed nodes from the job and requeues it.
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = 0
CRASH = 1
BAD_CONFIG = 2
BAD_CKPT = 3
BUSY = 4
RETRY = 75
FAULT = 76
BAD_NODE = 77

RETRYABLE = frozenset({RETRY, FAULT, BAD_NODE})
NO_RETRY = frozenset({CRASH, BAD_CONFIG, BAD_CKPT, BUSY})
RESTART_IN_JOB = frozenset({FAULT})
"""Codes on which a restarting launcher should restart the ranks inside the allocation."""
INJOB_ENV = "KILOCARD_INJOB_RESTARTS"
"""Set (to ``launcher.max_restarts``) for ranks under a restarting launcher: see the module docstring."""


@dataclass(frozen=True)
class ExitCode:
    """One row of the exit-code contract."""

    code: int
    """The process exit status."""
    name: str
    """Its name (the module constant of the same name holds ``code``)."""
    meaning: str
    """What ended the run with it."""
    script: str
    """What the batch script does on it."""
    note: str = ""
    """A few words the run summary adds to the name (empty: the name says it)."""


TABLE = (
    ExitCode(
        DONE, "DONE", "trained to trainer.train_iters, or the run was already complete", "DONE marker, chain ends"
    ),
    ExitCode(
        RETRY,
        "RETRY",
        "stopped at a step boundary after a committed save (USR1/TERM)",
        "requeue / next link",
        "stopped after a committed save",
    ),
    ExitCode(FAULT, "FAULT", "a rank died or hung; the last committed step is intact", "requeue / next link"),
    ExitCode(
        BAD_CONFIG,
        "BAD_CONFIG",
        "frozen config missing/altered, or resume with a changed model",
        "FAILED marker, no retry",
    ),
    ExitCode(
        BAD_CKPT, "BAD_CKPT", "the checkpoint to resume from failed its integrity check", "FAILED marker, no retry"
    ),
    ExitCode(
        BUSY,
        "BUSY",
        "another job holds the run directory's lock",
        "this job ends, no marker",
        "another writer holds the run directory",
    ),
    ExitCode(CRASH, "CRASH", "any other error (bug, NaN loss, disk full)", "FAILED marker, no retry"),
    ExitCode(
        BAD_NODE,
        "BAD_NODE",
        "a node failed its health check (kilocard/train/health.py)",
        "exclude the blocklist's nodes, requeue / next link",
        "a node failed its health check",
    ),
)
"""Every code of the contract, in the order the batch script's comment block lists them."""
BY_CODE = {row.code: row for row in TABLE}
"""``TABLE`` by code."""


def describe(code: int) -> str:
    """``NAME`` or ``NAME (note)`` for a code of the table; ``""`` for any other status."""
    row = BY_CODE.get(code)
    if row is None:
        return ""
    return f"{row.name} ({row.note})" if row.note else row.name


def listing() -> str:
    """``0 DONE, 75 RETRY, ...``: every code of the table by number and name."""
    return ", ".join(f"{row.code} {row.name}" for row in TABLE)


SEVERITY = (BAD_CONFIG, BAD_CKPT, BUSY, BAD_NODE, CRASH, FAULT, RETRY)
"""Which rank's code wins, first first, when ranks end differently."""


def combine(codes: list[int], launcher_code: int) -> int:
    """The run's code from its ranks' recorded codes and the launcher's own exit status.

    A launcher that ended the ranks itself for a hang (``FAULT``) wins; with no recorded code the
    launcher's status decides (0 DONE, anything else CRASH); else the most severe recorded code.
    Every rank recording 0 under a failed launcher means a rank died after recording: FAULT.
    """
    if launcher_code == FAULT:
        return FAULT
    if not codes:
        return DONE if launcher_code == 0 else CRASH
    for severe in SEVERITY:
        if severe in codes:
            return severe
    if any(c != 0 for c in codes):
        return CRASH
    return DONE if launcher_code == 0 else FAULT


def from_exit_dir(exit_dir: str, launcher_code: int) -> int:
    """``combine`` over the ``rank_*`` files in ``exit_dir`` (a file that is not an integer is ignored)."""
    import glob
    import os

    codes = []
    for path in glob.glob(os.path.join(exit_dir, "rank_*")):
        with open(path) as f:
            text = f.read().strip()
        if text.lstrip("-").isdigit():
            codes.append(int(text))
    return combine(codes, launcher_code)


def _main(argv: list[str]) -> int:
    """``python -m kilocard.exitcodes EXIT_DIR LAUNCHER_CODE``: print the run's code."""
    if len(argv) != 2 or not argv[1].lstrip("-").isdigit():
        print("usage: python -m kilocard.exitcodes EXIT_DIR LAUNCHER_CODE", flush=True)
        return 2
    print(from_exit_dir(argv[0], int(argv[1])), flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
