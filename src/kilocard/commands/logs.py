"""``kilocard logs RUN_DIR [--rank N] [--follow]``: a run's output, optionally one rank's.

The batch script writes every job of a run (requeues and chain links too) to
``<run_dir>/logs/slurm-<jobid>.out``; ranks are labelled by ``srun --label``, or with in-job restarts
by the ``ft_launcher`` of their node (``kilocard.launch.logs``; the frozen config says which).
``--rank N`` keeps rank N's lines and the batch script's own; ``--follow`` reads until ``DONE`` or
``FAILED`` appears. A local run's ``logs/train.log`` is read too; ``--follow`` ends there when its
``kilocard run`` has exited (``kilocard.launch.logs.ended``). ``--rank`` of a rank the run does not have
is exit 2 naming the ranks it has; a run with no output yet (or none from that rank) gets a note on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kilocard.commands import exits
from kilocard.commands.output import fail
from kilocard.config import ComposeError
from kilocard.launch.logs import Reader, ended, log_problem, rank_labels, select
from kilocard.launch.render import LOG_DIR

HELP = "print (or follow) a run's output (Slurm or local), optionally one rank's"
#: Shown under ``kilocard logs --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard logs runs/tiny_gpt-20260101-120000",
    "kilocard logs RUN_DIR --rank 0 --follow",
)
POLL_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``RUN_DIR``, ``--rank``, ``--follow``."""
    p.add_argument("run_dir", help="the run directory")
    p.add_argument("--rank", type=int, default=None, help="only this rank's lines (and the batch script's)")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep reading until the run ends (DONE or FAILED; a local run: its kilocard run exits)",
    )


def show(run_dir: Path, rank: int | None = None, follow: bool = False, poll_s: float = POLL_S) -> int:
    """Print the run's output (optionally one rank's); with ``follow``, until DONE or FAILED appears."""
    if not (run_dir / LOG_DIR).is_dir():
        why = f"{run_dir} has no {LOG_DIR}/ (expected a run directory written by kilocard sbatch or run)"
        return fail("logs", f"RUN_DIR: {why}", exits.USAGE)
    problem = log_problem(run_dir, follow)
    if problem:
        return fail("logs", problem, exits.USAGE)
    injob = False
    if rank is not None:
        try:
            injob, world = rank_labels(run_dir)
        except ComposeError as e:
            return fail("logs", f"RUN_DIR: {e} (--rank needs the run's frozen config)", exits.USAGE)
        if not 0 <= rank < world:
            there = "rank 0" if world == 1 else f"ranks 0-{world - 1}"
            return fail("logs", f"--rank {rank}: no such rank (the run has {there})", exits.USAGE)
    reader, first = Reader(run_dir), True
    while True:
        finished = ended(run_dir)  # checked before reading: no line is lost
        lines = list(select(reader.new_lines(), rank, injob))
        sys.stdout.writelines(lines)
        sys.stdout.flush()
        if first and not lines:
            print(_nothing_yet(run_dir, rank, reader.read_any(), follow and not finished), file=sys.stderr)
        first = False
        if not follow or finished:
            return exits.OK
        time.sleep(poll_s)


def _nothing_yet(run_dir: Path, rank: int | None, any_output: bool, waiting: bool) -> str:
    """The note when the first read shows nothing: the run has no output yet, or none from ``rank``."""
    what = f"no line from rank {rank} yet" if any_output else f"no output yet (a job or kilocard run writes {LOG_DIR}/)"
    return f"kilocard logs: {run_dir}: {what}{'; waiting for it' if waiting else ''}"


def execute(args: argparse.Namespace) -> int:
    """``kilocard logs``."""
    return show(Path(args.run_dir), rank=args.rank, follow=args.follow)
