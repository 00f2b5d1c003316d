"""``kilocard plan``: rank the layouts the validator accepts by predicted throughput.

Exit 0 when at least one layout is accepted, 1 when none is, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys

from kilocard.commands import exits
from kilocard.commands.common import add_config_args, site_calibration
from kilocard.commands.output import fail
from kilocard.config.compose import compose, to_run_config
from kilocard.config.schema import RunConfig
from kilocard.planner.search import Plan, apply, plan, render_json, render_text
from kilocard.validate.packages import importable, install_hint

HELP = "rank the layouts that fit by predicted throughput"
#: Shown under ``kilocard plan --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = ("kilocard plan recipe=llama3_70b cluster=h100_dgx cluster.nodes=8 --top 5",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Overrides, ``--top``, ``--plot``, ``--format``."""
    add_config_args(p, multirun=False)
    p.add_argument("--top", type=int, default=10, help="how many layouts to list (default 10)")
    p.add_argument("--plot", default=None, metavar="PNG", help="also draw the ranking into this PNG (needs matplotlib)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")


def write_plots(result: Plan, cfg: RunConfig, png: str) -> None:
    """The ranking plot, and the schedule of the chosen layout (the overrides' own when valid, else the best)."""
    # matplotlib costs about a second to import: only ``--plot`` pays for it.
    from kilocard.planner.plots import plot_plan, plot_schedule, schedule_path

    plot_plan(result, png)
    shown = result.recipe or (result.top[0] if result.top else None)
    if shown is not None:
        plot_schedule(shown.candidate, apply(cfg, shown.candidate), schedule_path(png))
    print(f"wrote {png}" + (f" and {schedule_path(png)}" if shown is not None else ""), file=sys.stderr)


def execute(args: argparse.Namespace) -> int:
    """Search, print the ranking, optionally plot."""
    if args.top < 1:
        return fail("plan", f"--top: {args.top} must be at least 1", exits.USAGE)
    if args.plot and not importable("matplotlib"):  # before the search: nothing computed for nothing
        return fail("plan", f"--plot {args.plot}: needs matplotlib ({install_hint('plots')})", exits.USAGE)
    cfg = to_run_config(compose(list(args.overrides)))
    site, problem = site_calibration(cfg)
    if problem is not None:
        return fail("plan", f"{problem.field}={problem.value}: {problem.message}", exits.USAGE)
    try:
        result = plan(cfg, top=args.top, site=site)
    except ValueError as e:
        return fail("plan", str(e), exits.USAGE)
    print(render_json(result) if args.format == "json" else render_text(result))
    if args.plot:
        write_plots(result, cfg, args.plot)
    return exits.OK if result.top else exits.INVALID
