#!/usr/bin/env python3
"""Fit the step-time model's free parameters once, on the rows of baselines/published.yaml.

The search is ``kilocard.calibration.fit.fit`` (coordinate search from several seeded starts, every
parameter in its physical range) and ``fit.cold_fit`` (from the middle of every range, with basin
hops); the lower loss wins. Prints the fitted values to paste into
src/kilocard/perf/efficiency.py (FITTED) and the errors per row.

With ``--folds`` it writes the cross-validation's fold fits instead (``baselines/published.folds.json``,
read by ``kilocard baselines``): for each source, ``fit.cold_fit`` of every other source's rows, from the
middle of the ranges (never from FITTED), with the ids of the rows each was fitted on.

    .venv/bin/python scripts/fit_perf_model.py [--file baselines/published.yaml] [--starts 6]
    .venv/bin/python scripts/fit_perf_model.py --folds [--jobs 2] [--refresh]

``--refresh`` refines each stored fold fit with one coordinate search on the current rows instead (for a
change to the rows' configurations; a fold of a new or regrouped source still gets its cold fit).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import get_context

from kilocard.calibration.baselines import baselines_file, compare_row, error_stats, load_rows
from kilocard.calibration.crossval import fold_values, folds_file, load_fold_fits, source_group
from kilocard.calibration.fit import HOPS, cold_fit, fit, free_values, loss, targets
from kilocard.perf.efficiency import FITTED, PHYSICAL_RANGES, with_values


def fold_fit(args: tuple[str | None, str]) -> tuple[str, dict]:
    """The stored fit of the fold that holds out ``group`` of baselines file ``file``."""
    file, group = args
    t0 = time.monotonic()
    train = [t for t in targets([r for r in load_rows(file) if r.complete]) if source_group(t.row) != group]
    values = cold_fit(train)
    train_loss = loss(values, train)
    print(f"{group}: {len(train)} rows, loss {train_loss:.4f}, {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return group, {
        "trained_on": sorted(t.row.id for t in train),
        "train_loss": round(train_loss, 6),
        "values": {k: float(f"{v:.6g}") for k, v in sorted(values.items())},
    }


def refresh_fold(args: tuple[str | None, str]) -> tuple[str, dict]:
    """The stored fit of the fold that holds out ``group``, refreshed on the current rows: one coordinate
    search from its previous stored values (which never saw the held-out rows), as ``kilocard baselines``
    refines a fold, to the cold fit's tolerance. Rows added to the other sources since join its training
    set; a fold whose stored fit saw any row it now holds out (a new or regrouped source) is fitted cold."""
    file, group = args
    t0 = time.monotonic()
    scored = targets([r for r in load_rows(file) if r.complete])
    train = [t for t in scored if source_group(t.row) != group]
    held = {t.row.id for t in scored} - {t.row.id for t in train}
    stored = load_fold_fits(baselines_file(file)).get(group)
    if stored is None or not held or stored.trained_on & held or set(stored.values) != set(free_values()):
        return fold_fit(args)  # no previous fit that never saw these rows: a cold fit
    values = fit(train, starts=1, start=fold_values(stored))
    train_loss = loss(values, train)
    print(
        f"{group}: {len(train)} rows, refreshed, loss {train_loss:.4f}, {time.monotonic() - t0:.0f}s", file=sys.stderr
    )
    return group, {
        "trained_on": sorted(t.row.id for t in train),
        "train_loss": round(train_loss, 6),
        "values": {k: float(f"{v:.6g}") for k, v in sorted(values.items())},
    }


def write_folds(file: str | None, jobs: int, refresh: bool = False) -> int:
    """Compute every fold's cold fit (``jobs`` in parallel) and write them next to the baselines file."""
    groups = list(dict.fromkeys(source_group(t.row) for t in targets([r for r in load_rows(file) if r.complete])))
    with get_context("spawn").Pool(jobs) as pool:
        folds = dict(pool.map(refresh_fold if refresh else fold_fit, [(file, g) for g in groups]))
    how = (
        "one coordinate search on the current rows from the previous stored fit (scripts/fit_perf_model.py "
        "--folds --refresh), that fit "
        if refresh
        else ""
    )
    doc = {
        "about": "Cross-validation fold fits of the rows beside this file: for each source group, "
        f"{how}kilocard.calibration.fit.cold_fit (hops={HOPS}, seed 0) of the other groups' rows, from the middle of "
        "every parameter's range. Written by scripts/fit_perf_model.py --folds.",
        "folds": folds,
    }
    out = folds_file(baselines_file(file))
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out} ({len(folds)} folds)")
    return 0


def range_line(name: str, value: float) -> str:
    """``name = value`` with the physical range the fit kept it in, and whether it sits on a bound (the
    rows ask for more of that effect than its range allows: docs/perf_model.md lists such parameters)."""
    lo, hi = PHYSICAL_RANGES[name.split(".")[-1]]
    bound = "  (at its lower bound)" if value <= lo else "  (at its upper bound)" if value >= hi else ""
    return f"{name} = {value:.4g}  range [{lo:g}, {hi:g}]{bound}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=None)
    ap.add_argument("--starts", type=int, default=6, help="coordinate searches from perturbed starts")
    ap.add_argument("--folds", action="store_true", help="write the cross-validation's fold fits instead")
    ap.add_argument("--jobs", type=int, default=2, help="folds fitted in parallel (with --folds)")
    ap.add_argument(
        "--refresh",
        action="store_true",
        help="with --folds: refine each stored fold fit on the current rows (one search) instead of a cold fit",
    )
    args = ap.parse_args(argv)
    if args.folds:
        return write_folds(args.file, args.jobs, args.refresh)
    rows = [r for r in load_rows(args.file) if r.complete]
    scored = targets(rows)
    warm = fit(scored, starts=args.starts, log=lambda line: print(line, file=sys.stderr))
    cold = cold_fit(scored)
    warm_loss, cold_loss = loss(warm, scored), loss(cold, scored)
    print(f"from FITTED: loss {warm_loss:.5f}; cold with hops: {cold_loss:.5f}", file=sys.stderr)
    values = warm if warm_loss <= cold_loss else cold
    params = with_values(FITTED, values)
    for name, v in sorted(values.items()):
        print(range_line(name, v))
    comps = [compare_row(r, {}, params) for r in rows]
    for c in comps:
        print(
            f"{c.id:28s} published {c.published_tflops_per_gpu:7.1f}  predicted {c.predicted_tflops_per_gpu:7.1f}  "
            f"{c.rel_error:+.1%}"
        )
    stats = error_stats(comps)
    print(f"mean |error| {stats['mean_abs_rel_error']:.2%}  max |error| {stats['max_abs_rel_error']:.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
