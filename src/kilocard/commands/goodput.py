"""``kilocard goodput RUN_DIR [--format json]``: where a run's wall time went, against Young/Daly.

The figures come from the run's own records (``kilocard.rundir.goodput_report``); this verb only
prints them. ``--format json`` prints exactly ``{"wall_s", "productive_s", "goodput", "checkpoint_s":
{"local", "persistent"}, "eval_s", "faults": [{"step", "kind", "seconds_to_detect", "seconds_to_resume",
"steps_recomputed", "seconds_lost"}]}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kilocard.commands import exits
from kilocard.commands.output import fail
from kilocard.rundir.events import BadRecord
from kilocard.rundir.freeze import FrozenConfigError
from kilocard.rundir.goodput_report import NoRecords, RunGoodput, report

HELP = "where a run's time went: steps, checkpoints, each fault; goodput vs the Young/Daly prediction"
#: Shown under ``kilocard goodput --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = ("kilocard goodput runs/tiny_gpt-20260101-120000",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``RUN_DIR``, ``--format text|json``."""
    p.add_argument("run_dir", help="the run directory")
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def text_lines(r: RunGoodput) -> list[str]:
    """The report as aligned text lines."""
    rows = [
        ("wall time", _s(r.wall_s)),
        ("productive step time", f"{_s(r.productive_s)} ({r.steps} steps, median {_s(r.median_step_s)})"),
        ("checkpoints (persistent)", f"{_s(r.checkpoint_persistent_s)} (median save {_s(r.median_save_s)})"),
        ("checkpoints (local)", f"{_s(r.checkpoint_local_s)} (median save {_ms(r.median_local_save_s)})"),
        ("evaluation", f"{_s(r.eval_s)} ({r.evals} evaluations, {r.eval_share:.1%} of step + evaluation time)"),
        ("launch attempts", str(r.attempts)),
        ("faults", str(len(r.faults))),
        ("goodput", f"{r.goodput:.1%}"),
    ]
    if r.predicted is not None and r.predicted_goodput is not None:
        rows.append(
            (
                "Young/Daly prediction",
                f"{r.predicted_goodput:.2%} at a checkpoint every {_s(r.checkpoint_interval_s)} "
                f"(job MTBF {r.predicted.job_mtbf_s / 3600:.3g} h at Llama 3's failure rate; "
                f"optimal interval {_s(r.predicted.optimal_interval_s)})",
            )
        )
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    for f in r.faults:
        origin = f"{f.resumed_tier} step {f.resumed_step}" if f.resumed_tier else f"step {f.resumed_step}"
        lines.append(
            f"fault at step {f.step} ({f.kind}): detected in {_s(f.seconds_to_detect)}, resumed from {origin} in "
            f"{_s(f.seconds_to_resume)}, {f.steps_recomputed} step(s) recomputed, {_s(f.seconds_lost)} lost"
        )
    return lines


def execute(args: argparse.Namespace) -> int:
    """``kilocard goodput``."""
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        return fail(
            "goodput", f"RUN_DIR: {run_dir} is not a directory (expected a kilocard run directory)", exits.USAGE
        )
    try:
        r = report(run_dir)
    except (NoRecords, FrozenConfigError, BadRecord) as e:
        return fail("goodput", f"RUN_DIR: {e}", exits.USAGE)
    if args.format == "json":
        print(json.dumps(r.to_json(), indent=1))
    else:
        print("\n".join(text_lines(r)))
    return exits.OK
