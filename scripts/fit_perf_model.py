#!/usr/bin/env python3
"""Fit the step-time model's free parameters once, on the rows of baselines/published.yaml.

The search is ``kilocard.perf.fit.fit`` (coordinate search from several seeded starts, every
parameter in its physical range). Prints the fitted values to paste into
src/kilocard/perf/efficiency.py (FITTED) and the errors per row.

    .venv/bin/python scripts/fit_perf_model.py [--file baselines/published.yaml] [--starts 6]
"""

from __future__ import annotations

import argparse
import sys

from kilocard.perf.baselines import compare_row, error_stats, load_rows
from kilocard.perf.efficiency import FITTED, with_values
from kilocard.perf.fit import fit, targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=None)
    ap.add_argument("--starts", type=int, default=6, help="coordinate searches from perturbed starts")
    args = ap.parse_args(argv)
    rows = [r for r in load_rows(args.file) if r.complete]
    values = fit(targets(rows), starts=args.starts, log=lambda line: print(line, file=sys.stderr))
    params = with_values(FITTED, values)
    for name, v in sorted(values.items()):
        print(f"{name} = {v:.4g}")
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
