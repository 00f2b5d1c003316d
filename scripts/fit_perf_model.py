#!/usr/bin/env python3
"""Fit the step-time model's free parameters once, on the rows of baselines/published.yaml.

Coordinate search (no scipy): each free parameter in turn is scaled up and down by a step; a move
is kept when it lowers the loss (mean squared relative error of TFLOP/s per GPU plus the squared
worst error, over rows with full configurations); steps halve when nothing improves. Tied names
move together (one knee, one HBM efficiency for every GPU family); every parameter stays in its
physical range (PHYSICAL_RANGES). The loss has several minima, so the search runs from a few seeded
starting points and keeps the best. Prints the fitted values to paste into
src/kilocard/perf/efficiency.py (FITTED) and the errors per row.

    .venv/bin/python scripts/fit_perf_model.py [--file baselines/published.yaml]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence

from kilocard.perf.baselines import compare_row, error_stats, load_rows
from kilocard.perf.efficiency import FITTED, PHYSICAL_RANGES, flat, with_values

#: Free parameters; names in one tuple move together. Everything else stays at its stated value.
FREE: Sequence[Sequence[str]] = (
    ("ampere.gemm_efficiency",),
    ("hopper.gemm_efficiency",),
    ("ampere.gemm_knee", "hopper.gemm_knee"),
    ("ampere.hbm_efficiency", "hopper.hbm_efficiency"),
    ("hopper.flash_attention_efficiency",),
    ("network.nvlink_efficiency",),
    ("network.network_efficiency",),
    ("network.tp_overlap",),
    ("network.p2p_latency_s",),
)


def loss(values: dict[str, float], rows) -> float:
    params = with_values(FITTED, values)
    errs = [compare_row(r, {}, params).rel_error for r in rows]
    errs = [e for e in errs if e is not None]
    return sum(e * e for e in errs) / len(errs) + max(abs(e) for e in errs) ** 2


def clamp(name: str, v: float) -> float:
    lo, hi = PHYSICAL_RANGES[name.split(".")[-1]]
    return min(hi, max(lo, v))


def coordinate_search(values: dict[str, float], rows, rounds: int = 60) -> dict[str, float]:
    """Scale each free group up/down by ``step``; keep improvements; halve the step when none."""
    best = loss(values, rows)
    step = 0.2
    for _ in range(rounds):
        improved = False
        for group in FREE:
            for factor in (1 + step, 1 / (1 + step)):
                trial = dict(values)
                for name in group:
                    trial[name] = clamp(name, values[name] * factor if values[name] else step * 1e-3)
                trial_loss = loss(trial, rows)
                if trial_loss < best - 1e-12:
                    values, best, improved = trial, trial_loss, True
        if not improved:
            step /= 2
            if step < 1e-3:
                break
    return values


def fit(rows, starts: int = 6, seed: int = 0) -> dict[str, float]:
    """Best of ``starts`` coordinate searches: from FITTED, then from seeded perturbations of it
    (each tied group scaled by one log-uniform factor in [0.7, 1.4])."""
    base = {k: clamp(k, v) for k, v in flat(FITTED).items() if any(k in g for g in FREE)}
    rng = random.Random(seed)
    best_values, best_loss = None, float("inf")
    for i in range(starts):
        start = dict(base)
        if i:
            for group in FREE:
                factor = math.exp(rng.uniform(math.log(0.7), math.log(1.4)))
                for name in group:
                    start[name] = clamp(name, base[name] * factor)
        values = coordinate_search(start, rows)
        value_loss = loss(values, rows)
        print(f"start {i}: loss {value_loss:.5f}", file=sys.stderr)
        if value_loss < best_loss:
            best_values, best_loss = values, value_loss
    assert best_values is not None
    return best_values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=None)
    ap.add_argument("--starts", type=int, default=6, help="coordinate searches from perturbed starts")
    args = ap.parse_args(argv)
    rows = [r for r in load_rows(args.file) if r.complete]
    values = fit(rows, starts=args.starts)
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
