"""``kilocard baselines``: published MFU baselines against the performance model."""

from __future__ import annotations

import argparse
import json
import sys

from kilocard.commands import exits
from kilocard.commands.report import fail
from kilocard.perf.baselines import (
    Comparison,
    Row,
    baselines_file,
    compare_all,
    load_rows,
    render_json,
    render_text,
)
from kilocard.perf.crossval import folds_file, load_fold_fits, with_cross_validation
from kilocard.perf.fit import targets
from kilocard.perf.series import render_series_text, series_checks, series_json
from kilocard.perf.trust import Kind, by_kind, by_kind_lines, kind_json, traits

HELP = "published MFU baselines vs the performance model"
#: Shown under ``kilocard baselines --help`` (each parsed by tests/commands/test_cli_help.py).
EXAMPLES = (
    "kilocard baselines",
    "kilocard baselines --format json",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``--file``, ``--format``."""
    p.add_argument("--file", default=None, help="a baselines YAML in the same format")
    p.add_argument("--format", choices=("text", "json"), default="text", help="a table (text) or one JSON document")


def execute(args: argparse.Namespace) -> int:
    """Print the comparison, in sample and cross-validated, and the scaling series; 2 on an unreadable
    baselines file."""
    try:
        rows, file = load_rows(args.file), baselines_file(args.file)
        folds = load_fold_fits(file)
        if not folds:
            print(
                f"kilocard baselines: no stored fold fits ({folds_file(file)}): each fold is fitted from the middle "
                f"of the ranges (up to ~35 s a source; `scripts/fit_perf_model.py --file {file} --folds` stores them)",
                file=sys.stderr,
            )
        comps = with_cross_validation(compare_all(args.file), rows, folds)
    except (ValueError, KeyError, TypeError) as e:
        return fail("baselines", str(e), exits.USAGE)
    series = series_checks(rows, comps)
    kinds = kinds_of(rows, comps)
    if args.format == "json":
        doc = json.loads(render_json(comps))
        doc["series"] = series_json(series)
        doc["by_kind"] = [kind_json(k) for k in kinds]
        print(json.dumps(doc, indent=1))
    else:
        parts = (render_text(comps), "\n".join(by_kind_lines(kinds)), render_series_text(series))
        print("\n".join(part for part in parts if part))
    return exits.OK


def kinds_of(rows: list[Row], comps: list[Comparison]) -> list[Kind]:
    """The scored rows' errors by kind (GPU family, dense/MoE, GEMM width)."""
    kind = {t.row.id: traits(t.inputs) for t in targets(rows)}
    scored = [c for c in comps if c.rel_error is not None and c.id in kind]
    return by_kind([(kind[c.id], c.rel_error or 0.0, c.cv_rel_error) for c in scored])
