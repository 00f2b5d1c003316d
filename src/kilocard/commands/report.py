"""``kilocard report RUN_DIR [--format json] [--plot FILE]``: measured against predicted against published.

The figures come from the run's own records and its frozen config (``kilocard.rundir.reproduction``);
this verb prints them and draws the picture: TFLOP/s per GPU of every step with the predicted and
published lines, the steps left out of the medians marked. ``--format json`` prints ``measured``,
``predicted`` and ``published`` (each ``{"tflops_per_gpu", "mfu"}``; ``published`` is null when the
recipe names no baseline), ``convention``, ``steps_used``, ``excluded``, the two ratios, the measured and
predicted step time and the prediction's ``breakdown_s``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kilocard.commands import exits
from kilocard.commands.output import fail
from kilocard.rundir.events import BadRecord
from kilocard.rundir.freeze import FrozenConfigError
from kilocard.rundir.reproduction import NotSteady, Reproduction, load, text_lines
from kilocard.rundir.targets import output_file, write_file

HELP = "what a run reproduced: measured vs predicted vs published TFLOP/s per GPU and MFU, with a picture"
#: Shown under ``kilocard report --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard report runs/tiny_gpt-20261203-101500",
    "kilocard report runs/tiny_gpt-20261203-101500 --format json --plot tflops.png",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``RUN_DIR``, ``--format text|json``, ``--plot FILE``."""
    p.add_argument("run_dir", help="the run directory (local or Slurm)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json")
    p.add_argument("--plot", metavar="FILE", help="also draw TFLOP/s per step to FILE (.png, .svg, .pdf)")


def plot(rep: Reproduction, out: Path) -> None:
    """TFLOP/s per GPU of each step; predicted and published lines; left-out steps hollow and labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    used = [(s, v) for s, v in rep.per_step if s not in rep.excluded]
    ax.plot(*zip(*used, strict=True), "o", color="tab:blue", label="measured (steady state)")
    for why, marker in (("warm-up", "s"), ("checkpoint", "D"), ("evaluation", "^")):
        pts = [(s, v) for s, v in rep.per_step if rep.excluded.get(s) == why]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker, mfc="none", color="tab:gray", label=f"left out: {why}")
    ax.axhline(rep.measured.tflops_per_gpu or 0, color="tab:blue", ls=":", label="measured median")
    if rep.predicted and rep.predicted.tflops_per_gpu:
        ax.axhline(rep.predicted.tflops_per_gpu, color="tab:orange", ls="--", label="predicted")
    if rep.published and rep.published.tflops_per_gpu:
        ax.axhline(rep.published.tflops_per_gpu, color="tab:green", ls="-.", label=f"published {rep.baseline_id or ''}")
    ax.set_xlabel("step")
    ax.set_ylabel(f"TFLOP/s per GPU ({rep.convention})")
    ax.set_ylim(bottom=0)
    ax.set_title("measured vs predicted vs published")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def execute(args: argparse.Namespace) -> int:
    """``kilocard report``."""
    run_dir = Path(args.run_dir)
    out = output_file("--plot", args.plot) if args.plot is not None else None  # before any work
    if not run_dir.is_dir():
        return fail("report", f"RUN_DIR: {run_dir} is not a directory (expected a kilocard run directory)", exits.USAGE)
    try:
        rep = load(run_dir)
    except (FrozenConfigError, BadRecord) as e:
        return fail("report", f"RUN_DIR: {e}", exits.USAGE)
    except NotSteady as e:
        return fail("report", f"{run_dir}: {e}; train more steps", exits.INVALID)
    if out is not None:
        with write_file(out, "--plot") as tmp:
            plot(rep, tmp)
    print(json.dumps(rep.to_json(), indent=1) if args.format == "json" else "\n".join(text_lines(rep)))
    return exits.OK
