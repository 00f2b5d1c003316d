"""``kilocard runs [ROOT | RUN_DIR] [--format json]``: the runs under a runs root, newest first, or one run in full.

Each run's state (running, queued, chained, done, failed, retry, fault, ...), newest and committed
step, loss, measured MFU, ETA, wall time and the command that continues it, read from the run
directories alone (``kilocard.launch.runs``; Slurm's queue added where ``squeue`` answers). ROOT
defaults to ``cluster.shared_fs``'s default (``runs``). A directory under ROOT that cannot be read as a
run is one line on stderr and is skipped; the others are listed. ``--format json`` prints a list of
objects (one object for a RUN_DIR) with the keys of ``RunInfo``: ``run_dir``, ``state``, ``step``,
``committed_step``, ``train_iters``, ``loss``, ``mfu``, ``eta_s``, ``resume_command`` and more.
Exit 0; 2 when ROOT is not a directory or RUN_DIR cannot be read.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from kilocard.base.table import text_table
from kilocard.commands import exits
from kilocard.commands.goodput import finite
from kilocard.commands.output import fail
from kilocard.config.schema import ClusterConfig
from kilocard.launch.runs import RunInfo, candidates, is_run_dir, read_all

HELP = "list the runs under a runs root (state, step, loss, MFU, ETA, how to continue each), or show one"
#: Shown under ``kilocard runs --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard runs",
    "kilocard runs /lustre/me/runs --format json",
    "kilocard runs runs/tiny_gpt-20260101-120000",
)
DEFAULT_ROOT = ClusterConfig.shared_fs
"""Where ``kilocard run`` puts run directories unless ``cluster.shared_fs`` says otherwise."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``[ROOT | RUN_DIR]``, ``--format text|json``."""
    p.add_argument(
        "path", nargs="?", default=DEFAULT_ROOT, help=f"a runs root (default: {DEFAULT_ROOT}) or one run directory"
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or JSON")


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(round(s)), 60)
    return f"{m // 60}:{m % 60:02d}:{sec:02d}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _step(r: RunInfo) -> str:
    return f"{'-' if r.step is None else r.step}/{r.train_iters}"


def table_lines(runs: list[RunInfo]) -> list[str]:
    """The listing: one row per run, then each run's command to continue it under its row."""
    rows = [("run", "state", "step", "committed", "loss", "MFU", "ETA", "wall", "recipe")]
    for r in runs:
        rows.append(
            (
                Path(r.run_dir).name,
                r.state,
                _step(r),
                "-" if r.committed_step is None else str(r.committed_step),
                _num(r.loss, ".4f"),
                _num(None if r.mfu is None else 100 * r.mfu, ".2f") + ("%" if r.mfu is not None else ""),
                _duration(r.eta_s),
                _duration(r.wall_s),
                r.recipe,
            )
        )
    lines = text_table(rows)
    continued = [f"  {Path(r.run_dir).name}: {r.resume_command}" for r in runs if r.resume_command]
    return lines + (["", "continue with:", *continued] if continued else [])


def _committed(r: RunInfo) -> str:
    """The newest intact committed step, and the tracker's step when that one lost its manifest."""
    shown = "none" if r.committed_step is None else str(r.committed_step)
    if r.tracker_step is None:
        return shown
    return f"{shown} (the tracker names step {r.tracker_step}, whose manifest is missing)"


def detail_lines(r: RunInfo) -> list[str]:
    """One run in full: every field, one per line."""
    created = _dt.datetime.fromtimestamp(r.created, _dt.UTC).isoformat(timespec="seconds")
    rows = [
        ("run dir", r.run_dir),
        ("state", f"{r.state} ({r.detail})"),
        ("recipe", r.recipe),
        ("launcher", r.launcher + (f" (jobs {' '.join(map(str, r.job_ids))})" if r.job_ids else "")),
        ("created", created),
        ("step", _step(r)),
        ("committed step", _committed(r)),
        ("loss", _num(r.loss, ".4f")),
        ("step time (median)", _num(r.step_time_s, ".3f") + (" s" if r.step_time_s is not None else "")),
        ("TFLOP/s per GPU (median)", _num(r.tflops_per_gpu, ".4g")),
        ("MFU (median)", "-" if r.mfu is None else f"{r.mfu:.2%}"),
        ("ETA", _duration(r.eta_s)),
        ("wall time", _duration(r.wall_s)),
        ("continue with", r.resume_command or "-"),
    ]
    width = max(len(k) for k, _ in rows)
    return [f"{k:<{width}}  {v}" for k, v in rows]


def show_one(run_dir: Path, fmt: str) -> int:
    """``kilocard runs RUN_DIR``."""
    runs, bad = read_all([run_dir])
    if bad:
        return fail("runs", f"RUN_DIR: {bad[0][0]}: {bad[0][1]}", exits.USAGE)
    r = runs[0]
    print(json.dumps(finite(r.to_json()), indent=1) if fmt == "json" else "\n".join(detail_lines(r)))
    return exits.OK


def execute(args: argparse.Namespace) -> int:
    """List the runs under ROOT, or show the one RUN_DIR."""
    path = Path(args.path)
    if not path.is_dir():
        return fail(
            "runs", f"{path}: not a directory (give a runs root, cluster.shared_fs, or a run directory)", exits.USAGE
        )
    if is_run_dir(path):
        return show_one(path, args.format)
    runs, bad = read_all(candidates(path))
    for d, why in bad:
        print(f"kilocard runs: skipped {d}: {why}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps([finite(r.to_json()) for r in runs], indent=1))
    elif runs:
        print("\n".join(table_lines(runs)))
    else:
        print(f"no runs under {path}")
    return exits.OK
