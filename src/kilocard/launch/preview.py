"""``kilocard sbatch --dry-run`` / ``--test-only``: show or test the batch script without writing a run.

``--dry-run`` prints each script as it would be written (for the run directory it would get) and
writes nothing. ``--test-only`` renders it to a temporary file and asks slurmctld
(``sbatch --test-only``) when and where the job would start; nothing is written or submitted.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from kilocard.config.schema import RunConfig
from kilocard.launch.render import render_script
from kilocard.launch.rundir import base_name, runs_root, shared_fs_problem
from kilocard.launch.slurm import run_client, sbatch_argv
from kilocard.plan import LaunchPlan


def would_be_run_dir(cfg: RunConfig) -> Path:
    """The run directory ``kilocard sbatch`` would create now (before any ``-2`` suffix)."""
    return runs_root(cfg) / base_name(cfg)


def dry_run(runs: Sequence[tuple[RunConfig, LaunchPlan]], chain: int) -> str:
    """Every script as it would be written; nothing is written.

    Each starts with its ``#!`` line (``kilocard sbatch --dry-run > job.sh`` is a script ``sbatch`` takes),
    then comments: the run directory it would get and, when ``cluster.shared_fs`` is a shipped profile's
    placeholder or cannot be made, why writing the run would be refused.
    """
    parts = []
    for cfg, plan in runs:
        run_dir = would_be_run_dir(cfg)
        shebang, rest = render_script(cfg, plan, run_dir, chain).split("\n", 1)
        notes = [f"# run dir: {run_dir} (dry run: nothing written)"]
        problem = shared_fs_problem(cfg)
        if problem:  # a shipped profile's placeholder renders as is; writing the run is refused until it is set
            notes.append(f"# kilocard sbatch (without --dry-run) refuses this run root: {problem}")
        parts.append("\n".join([shebang, *notes, rest]))
    return "".join(parts)


def test_only(runs: Sequence[tuple[RunConfig, LaunchPlan]], chain: int) -> list[str]:
    """``sbatch --test-only`` of every script (from a temporary file): slurmctld's answer for each.

    Raises ``SlurmError`` when the client fails (no ``sbatch``, the controller refuses the script).
    """
    answers = []
    for cfg, plan in runs:
        with tempfile.TemporaryDirectory(prefix="kilocard-test-only-") as tmp:
            script = Path(tmp) / "submit.sbatch"
            script.write_text(render_script(cfg, plan, would_be_run_dir(cfg), chain))
            proc = run_client(sbatch_argv(script, parsable=False, test_only=True))
        answers.append((proc.stderr.strip() or proc.stdout.strip()).replace(str(script), "submit.sbatch"))
    return answers
