"""Leave-one-source-out cross-validation of the fitted step-time model (``kilocard baselines``).

The rows of a baselines file are grouped by the document that published them (``source_group``).
Each group in turn is held out: the free parameters are refitted on the other groups' rows and the
held-out rows are predicted with that fit, which never saw them. The fit is ``kilocard.perf.fit``'s,
made fast: ``STARTS`` coordinate searches instead of 6, warm-started from the FITTED values.

A parameter that no training row constrains (its training loss does not move when it does: the
GPU-specific efficiencies of a GPU family with no training row, the TP overlap when no training
row overlaps TP) cannot keep its FITTED value, which the held-out rows helped to fit. Such a
GPU-family parameter follows the model's rule for families without a published row: it is tied to
the same parameter of a family that has training rows. Any other one is set to the middle of its
physical range.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from kilocard.perf.baselines import Comparison, Row
from kilocard.perf.efficiency import FITTED, PHYSICAL_RANGES, with_values
from kilocard.perf.fit import FREE, Groups, Target, clamp, fit, free_values, loss, targets

STARTS = 3
"""Coordinate searches per fold: the warm start and two perturbed ones (``fit`` uses 6)."""
PROBE = (0.8, 1.25)
"""Factors a parameter is scaled by to see whether the training loss depends on it."""


def source_group(row: Row) -> str:
    """The document a row comes from: its ``source`` without a parenthesised note
    (``SC21 Table 1 (5 layers per virtual stage)`` -> ``SC21 Table 1``)."""
    return re.sub(r"\s*\(.*\)\s*$", "", str(row.raw.get("source") or row.id)).strip()


def constrained(group: Sequence[str], values: dict[str, float], rows: Sequence[Target]) -> bool:
    """Whether the loss over ``rows`` changes when the tied ``group`` of parameters is scaled."""
    base = loss(values, rows)
    for factor in PROBE:
        moved = {n: clamp(n, values[n] * factor if values[n] else _middle(n)) for n in group}
        if moved != {n: values[n] for n in group} and abs(loss({**values, **moved}, rows) - base) > 1e-12:
            return True
    return False


def _middle(name: str) -> float:
    lo, hi = PHYSICAL_RANGES[name.split(".")[-1]]
    return (lo + hi) / 2


def fold_setup(rows: Sequence[Target]) -> tuple[Groups, dict[str, float]]:
    """Free groups and starting values for a fit on ``rows``: each parameter of a group the rows do not
    constrain is tied to a constrained twin of another GPU family, or set to mid-range and not searched."""
    values = free_values()
    kept = [list(g) for g in FREE if constrained(g, values, rows)]
    loose = [n for g in FREE if not constrained(g, values, rows) for n in g]
    for name in loose:
        family, _, field_name = name.partition(".")
        twin = next((g for g in kept if any(n.partition(".")[2] == field_name for n in g)), None)
        if family != "network" and twin is not None:
            values[name] = values[twin[0]]
            twin.append(name)
        else:
            values[name] = _middle(name)
    return [tuple(g) for g in kept], values


def held_out_errors(rows: Sequence[Row], starts: int = STARTS) -> dict[str, float | None]:
    """Row id -> relative error of the row predicted by a fit on every other source (``None``: not scored)."""
    scored = targets(rows)
    out: dict[str, float | None] = {r.id: None for r in rows}
    for group in dict.fromkeys(source_group(t.row) for t in scored):
        train = [t for t in scored if source_group(t.row) != group]
        if not train:
            continue
        free, start = fold_setup(train)
        params = with_values(FITTED, fit(train, starts=starts, free=free, start=start))
        for t in scored:
            if source_group(t.row) == group:
                out[t.row.id] = t.rel_error(params)
    return out


def with_cross_validation(comps: list[Comparison], rows: Sequence[Row], starts: int = STARTS) -> list[Comparison]:
    """``comps`` (one per row, same order) with their held-out errors filled in."""
    held = held_out_errors(rows, starts)
    return [replace(c, cv_rel_error=held.get(c.id) if c.rel_error is not None else None) for c in comps]
