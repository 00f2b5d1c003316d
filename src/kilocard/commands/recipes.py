"""``kilocard recipes``: the table of recipes (model, parameters, GPUs, precision, baseline)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from kilocard.base.table import text_table
from kilocard.commands import exits
from kilocard.recipes import RecipeRow, catalog_rows, human

HELP = "table of the recipes: model, params, GPUs, precision, baseline and its published figure"
#: Shown under ``kilocard recipes --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard recipes",
    "kilocard recipes --format json",
)
HEADER = ("recipe", "family", "model", "params", "active", "GPUs", "cluster", "precision", "baseline", "published")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--format text|json``."""
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")


def table_lines(rows: list[RecipeRow]) -> list[str]:
    """The catalog as aligned text columns under a header."""
    table = [HEADER] + [
        (
            r.name,
            r.family,
            r.model,
            human(r.params),
            human(r.active_params),
            str(r.gpus),
            r.cluster,
            r.precision,
            r.baseline or "-",
            r.published,
        )
        for r in rows
    ]
    return text_table(table)


def execute(args: argparse.Namespace) -> int:
    """Print the catalog."""
    rows = catalog_rows()
    if args.format == "json":
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print("\n".join(table_lines(rows)))
    return exits.OK
