"""``kilocard budget``: from GPUs x days (or FLOPs) to model size, tokens, batch, layout and concurrent jobs.

``gpus=``, ``days=`` and ``flops=`` are budget arguments written like overrides and taken out before
Hydra composes the recipe. Exit 0 when a candidate has a layout, 1 when none has, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys

from kilocard.commands import exits
from kilocard.commands.common import add_config_args
from kilocard.commands.output import fail
from kilocard.config.compose import compose, to_run_config
from kilocard.planner.budget import budget_plan, plot_frontier, render_text, split_budget_args, to_json
from kilocard.rundir.targets import output_file, write_file
from kilocard.validate.packages import importable, install_hint

HELP = "from a compute budget (GPUs x days, or FLOPs) to model size, tokens, batch, layout and jobs"
#: Shown under ``kilocard budget --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard budget recipe=llama3_70b gpus=16384 days=50",
    "kilocard budget recipe=moe_10t gpus=500000 days=90 --format json",
    "kilocard budget recipe=llama3_8b flops=5.76e23 --plot frontier.png",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides with ``gpus=``/``days=``/``flops=``, ``--plot``, ``--format``."""
    add_config_args(p, multirun=False)
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the loss-vs-compute frontier into this PNG")
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")


def execute(args: argparse.Namespace) -> int:
    """Split the budget from the overrides, compose, evaluate the family's sizes, print, optionally plot."""
    try:
        budget, overrides = split_budget_args(list(args.overrides))
    except ValueError as e:
        return fail("budget", str(e), exits.USAGE)
    png = output_file("--plot", args.plot) if args.plot is not None else None  # before any work
    if args.plot and not importable("matplotlib"):
        return fail("budget", f"--plot {args.plot}: needs matplotlib ({install_hint('plots')})", exits.USAGE)
    cfg = to_run_config(compose(overrides))
    try:
        result = budget_plan(cfg, budget)
    except ValueError as e:
        return fail("budget", str(e), exits.USAGE)
    print(json.dumps(to_json(result), indent=1) if args.format == "json" else render_text(result))
    if png is not None:
        with write_file(png, "--plot") as tmp:
            plot_frontier(result, str(tmp))
        print(f"wrote {png}", file=sys.stderr)
    return exits.OK if result.pick is not None else exits.INVALID
