#!/usr/bin/env python3
"""Structure in the performance model's signed errors over the scored rows of baselines/published.yaml.

For each scored row: its features (GPU family, GEMM dtype and FP8 recipe, dense or MoE, TP/PP/VP/CP/EP/DP,
MBS, GBS, micro-batches per step, sequence, hidden, layers, recompute, source, GPUs, tokens per GPU per
micro-batch) and the predicted step's component shares (``StepTime.breakdown`` over the step time), with
its signed in-sample error (predicted - published) / published. Prints the mean signed error of each
value of each categorical feature and the rank correlation of each numeric feature with the error: a
feature whose groups differ, or which correlates, points at a mechanism the model lacks. Analysis only:
nothing here feeds the model.

    PYTHONPATH=src .venv/bin/python scripts/perf_residuals.py [--file F] [--only 'prec == "fp8"'] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

import numpy as np

from kilocard.calibration.baselines import compare_row, load_rows, row_inputs
from kilocard.calibration.crossval import source_group
from kilocard.perf.predict import predict_prepared
from kilocard.perf.steptime import microbatches

CATEGORICAL = ("source", "family", "prec", "moe", "tp", "pp", "vp", "cp", "ep", "mbs", "recompute", "seq")
"""Features whose rows are grouped by value."""


def row_features(file: str | None) -> list[dict[str, Any]]:
    """One dict per scored row: id, signed error ``err``, features and ``s_<component>`` step shares."""
    out = []
    for row in load_rows(file):
        comp = compare_row(row, {})
        if comp.rel_error is None:
            continue
        inputs = row_inputs(row, comp.convention)
        pred = predict_prepared(inputs)
        lay, ft, shape = inputs.layout, inputs.features, inputs.shape
        shares = {f"s_{k}": v / pred.step_time_s for k, v in pred.breakdown.items()}
        recipe = f"fp8-{ft.fp8_recipe}" if ft.precision in ("fp8", "fp4") else ft.precision
        out.append(
            dict(id=row.id, err=comp.rel_error, source=source_group(row), family=inputs.hardware.family)
            | dict(prec=recipe, moe=int(ft.num_experts > 0), tp=lay.tp, pp=lay.pp, vp=lay.vp or 1, cp=lay.cp)
            | dict(ep=lay.ep, dp=lay.dp, mbs=ft.mbs, gbs=ft.gbs, m=microbatches(lay, ft), seq=shape.seq)
            | dict(hidden=shape.hidden, layers=shape.layers, recompute=ft.recompute, gpus=lay.world_size)
            | dict(tokens=ft.mbs * shape.seq / lay.cp / lay.tp)
            | shares
        )
    return out


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ties broken by order)."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    return float(np.corrcoef(rx, ry)[0, 1])


def report(rows: list[dict[str, Any]]) -> str:
    """Group means of the categorical features, rank correlations of the numeric ones (strongest first)."""
    err = np.array([r["err"] for r in rows])
    lines = [f"{len(rows)} rows: mean |error| {np.abs(err).mean():.1%}, mean signed error {err.mean():+.1%}"]
    for key in CATEGORICAL:
        groups: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            groups[str(r[key])].append(r["err"])
        cells = [f"{v}: {np.mean(e):+.1%} ({len(e)})" for v, e in sorted(groups.items())]
        lines.append(f"[{key}] " + "  ".join(cells))
    numeric = [k for k, v in rows[0].items() if isinstance(v, int | float) and k not in ("err", "moe")]
    corr = []
    for key in numeric:
        x = np.array([float(r.get(key, 0.0)) for r in rows])
        if x.std() > 0:
            corr.append((rank_correlation(x, err), key))
    corr.sort(key=lambda c: -abs(c[0]))
    lines.extend(f"  {key:16s} rank correlation with the error {c:+.2f}" for c, key in corr)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=None, help="baselines file (default: the shipped one)")
    ap.add_argument("--only", default=None, help="Python expression over a row's features, e.g. 'moe == 0'")
    ap.add_argument("--json", default=None, help="also write the per-row features to this file")
    args = ap.parse_args(argv)
    rows = row_features(args.file)
    if args.only:
        rows = [r for r in rows if eval(args.only, {}, dict(r))]  # noqa: S307 - the analyst's own filter
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
