"""``kilocard baselines``: published MFU baselines against the performance model."""

from __future__ import annotations

import argparse

from kilocard.commands import exits
from kilocard.commands.report import fail
from kilocard.perf.baselines import compare_all, load_rows, render_json, render_text
from kilocard.perf.crossval import with_cross_validation

HELP = "published MFU baselines vs the performance model"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--file``, ``--format``."""
    p.add_argument("--file", default=None, help="a baselines YAML in the same format")
    p.add_argument("--format", choices=("text", "json"), default="text")


def execute(args: argparse.Namespace) -> int:
    """Print the comparison, in sample and cross-validated; 2 on an unreadable baselines file."""
    try:
        comps = with_cross_validation(compare_all(args.file), load_rows(args.file))
    except (ValueError, KeyError, TypeError) as e:
        return fail("baselines", str(e), exits.USAGE)
    print(render_json(comps) if args.format == "json" else render_text(comps))
    return exits.OK
