"""Leave-one-source-out cross-validation of the fitted step-time model (``kilocard baselines``).

The rows of a baselines file are grouped by the document, or the table of a document, that published
them (``source_group``).
Each group in turn is held out: the free parameters are refitted on the other groups' rows and the
held-out rows are predicted with that fit, which never saw them. The fit is ``kilocard.perf.fit``'s,
made fast: one coordinate search, warm-started from the FITTED values, run to convergence at a coarser
step (``TOL``).

A parameter that no training row constrains (the GPU-specific efficiencies of a GPU family with no
training row, the TP overlap when no training row overlaps TP) cannot keep its FITTED value, which the
held-out rows helped to fit: ``fit.setup`` ties it to a constrained twin of another GPU family, or
sets it to the middle of its physical range.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from kilocard.perf.baselines import Comparison, Row
from kilocard.perf.efficiency import FITTED, with_values
from kilocard.perf.fit import fit, targets

STARTS = 1
"""Coordinate searches per fold: the warm start only (``fit`` uses 6 starts)."""
EVALS = 1500
"""Loss evaluations per fold at most (``fit`` allows 4000 per start); a fold converges in under 1000."""
TOL = 5e-4
"""Smallest step per fold, as a fraction of each parameter's range (``fit`` goes to 1e-4): below it the
mean held-out error moves by less than 0.1 point. A search cut shorter stays nearer the warm start,
which saw the held-out rows, and reports a smaller error than the model has."""


def source_group(row: Row) -> str:
    """The document or table a row comes from: its ``source`` without a parenthesised note
    (``SC21 Table 1 (5 layers per virtual stage)`` -> ``SC21 Table 1``), keeping a table the note names
    (``Megatron-Bridge performance summary 25.11 (DGX-B200 table, FP8-MX in parentheses)`` ->
    ``Megatron-Bridge performance summary 25.11, DGX-B200 table``)."""
    source = str(row.raw.get("source") or row.id)
    document = re.sub(r"\s*\(.*\)\s*$", "", source).strip()
    table = re.search(r"\(([^(),]*\btable\b[^(),]*)[^()]*\)\s*$", source, re.IGNORECASE)
    return f"{document}, {table.group(1).strip()}" if table else document


def held_out_errors(rows: Sequence[Row], starts: int = STARTS) -> dict[str, float | None]:
    """Row id -> relative error of the row predicted by a fit on every other source (``None``: not scored)."""
    scored = targets(rows)
    out: dict[str, float | None] = {r.id: None for r in rows}
    for group in dict.fromkeys(source_group(t.row) for t in scored):
        train = [t for t in scored if source_group(t.row) != group]
        if not train:
            continue
        params = with_values(FITTED, fit(train, starts=starts, evals=EVALS, tol=TOL))
        for t in scored:
            if source_group(t.row) == group:
                out[t.row.id] = t.rel_error(params)
    return out


def with_cross_validation(comps: list[Comparison], rows: Sequence[Row], starts: int = STARTS) -> list[Comparison]:
    """``comps`` (one per row, same order) with their held-out errors filled in."""
    held = held_out_errors(rows, starts)
    return [replace(c, cv_rel_error=held.get(c.id) if c.rel_error is not None else None) for c in comps]
