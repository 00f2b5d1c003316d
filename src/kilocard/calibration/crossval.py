"""Leave-one-source-out cross-validation of the fitted step-time model (``kilocard baselines``).

The rows of a baselines file are grouped by the document, or the table of a document, that published
them (``source_group``).
Each group in turn is held out: the free parameters are refitted on the other groups' rows and the
held-out rows are predicted with that fit, which never saw them. The fit is ``kilocard.calibration.fit``'s,
made fast: a stored fold fit (``baselines/X.folds.json``, ``scripts/fit_perf_model.py --folds``) is used as
it is while it is current (its training loss unchanged), and otherwise refined by one coordinate search to
a coarser step (``TOL``).

A parameter that no training row constrains (the GPU-specific efficiencies of a GPU family with no
training row, the TP overlap when no training row overlaps TP) cannot keep its FITTED value, which the
held-out rows helped to fit: ``fit.setup`` ties it to a constrained twin of another GPU family, or
sets it to the middle of its physical range.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from kilocard.base.safe_read import FileReadError, read_json
from kilocard.calibration.baselines import Comparison, Row
from kilocard.calibration.fit import Target, cold_fit, fit, free_values, loss, middles, targets
from kilocard.perf.efficiency import FITTED, with_values

STARTS = 1
"""Coordinate searches per fold from its stored fold fit (``fit`` uses 6 starts)."""
FOLDS_SUFFIX = ".folds.json"
"""The stored fold fits of ``baselines/X.yaml`` are ``baselines/X.folds.json``."""


@dataclass(frozen=True)
class FoldFit:
    """A stored fit of one fold: where its search starts."""

    trained_on: frozenset[str]
    """Ids of the rows it was fitted on; a fold holding out any of them cannot start from it."""
    values: dict[str, float]
    """The free parameters' values (``kilocard.calibration.fit.FREE`` names)."""
    train_loss: float | None = None
    """Its loss on the rows it was fitted on, as stored (6 decimals): the same values giving another
    loss now mean the model changed since the fit (``kilocard.calibration.trust`` refuses such a file)."""


def folds_file(baselines_file: Path) -> Path:
    """Where the fold fits of ``baselines_file`` are stored."""
    return baselines_file.with_name(baselines_file.stem + FOLDS_SUFFIX)


def load_fold_fits(baselines_file: Path) -> dict[str, FoldFit]:
    """Source group -> its stored fold fit (empty when the file has none)."""
    path = folds_file(baselines_file)
    if not path.exists():
        return {}
    try:
        doc = read_json(path, dict)
        return {
            g: FoldFit(
                frozenset(f["trained_on"]),
                {k: float(v) for k, v in f["values"].items()},
                float(f["train_loss"]) if f.get("train_loss") is not None else None,
            )
            for g, f in doc["folds"].items()
        }
    except (FileReadError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{path}: not a fold-fits file ({type(e).__name__}: {e}); rewrite it with "
            f"scripts/fit_perf_model.py --file {baselines_file} --folds, or delete it"
        ) from None


LOSS_TOLERANCE = 1e-5
"""A stored fold's training loss (6 decimals) and its recomputed one differ by less than this unless the
model or the rows changed since the fit."""


def stale(fold: FoldFit, train: Sequence[Target]) -> str | None:
    """Why a stored fold fit is not of this model and these rows, or ``None``: its parameters are not the free
    ones, or its values no longer give its stored training loss on ``train`` (the model's formulas or the rows'
    configurations changed since it was fitted). A fit without a stored loss is checked by its names only."""
    if set(fold.values) != set(free_values()):
        return "has other parameters than the model"
    if fold.train_loss is None:
        return None
    now = loss(fold.values, train)
    if not abs(now - fold.train_loss) <= LOSS_TOLERANCE:
        return f"gives training loss {now:.6f}, stored {fold.train_loss:.6f}: the model changed since it was fitted"
    return None


def current(fold: FoldFit, train: Sequence[Target]) -> bool:
    """Whether a stored fold fit may stand for the fold as it is: it has a stored training loss and is not
    ``stale``."""
    return fold.train_loss is not None and stale(fold, train) is None


EVALS = 1500
"""Loss evaluations per fold at most (``fit`` allows 4000 per start); a fold converges in under 1000."""
TOL = 5e-4
"""Smallest step per fold, as a fraction of each parameter's range (``fit`` goes to 1e-4): below it the
mean held-out error moves by less than 0.1 point."""


def source_group(row: Row) -> str:
    """The document or table a row comes from: its ``source`` without a parenthesised note
    (``SC21 Table 1 (5 layers per virtual stage)`` -> ``SC21 Table 1``), keeping a table the note names
    (``Megatron-Bridge performance summary 25.11 (DGX-B200 table, FP8-MX in parentheses)`` ->
    ``Megatron-Bridge performance summary 25.11, DGX-B200 table``) or a document of a collection it
    opens with (``NVIDIA DGX Cloud Benchmarking recipes v25.01 (grok1/README_314b.md at 143b90d, ...)``
    -> ``NVIDIA DGX Cloud Benchmarking recipes v25.01, grok1/README_314b.md``: each model's README
    publishes its own tables, from its own recipe)."""
    source = str(row.raw.get("source") or row.id)
    document = re.sub(r"\s*\(.*\)\s*$", "", source).strip()
    table = re.search(r"\(([^(),]*\btable\b[^(),]*)[^()]*\)\s*$", source, re.IGNORECASE)
    if table:
        return f"{document}, {table.group(1).strip()}"
    member = re.search(r"\(\s*([\w./-]+\.md)\b[^()]*\)\s*$", source)
    return f"{document}, {member.group(1)}" if member else document


def by_source(scored: Sequence[Target]) -> dict[str, list[Target]]:
    """The scored rows grouped by ``source_group``, in the order the sources first appear."""
    out: dict[str, list[Target]] = {}
    for t in scored:
        out.setdefault(source_group(t.row), []).append(t)
    return out


def usable(fold: FoldFit | None, held: Sequence[Target]) -> bool:
    """Whether a stored fold fit may stand for the fit without ``held``: it exists and saw none of them."""
    return fold is not None and not fold.trained_on & {t.row.id for t in held}


def fold_values(fold: FoldFit) -> dict[str, float]:
    """A stored fold fit's values over every free parameter (one it lacks at the middle of its range)."""
    return {**middles(), **fold.values}


def held_out_errors(
    rows: Sequence[Row], starts: int = STARTS, folds: Mapping[str, FoldFit] | None = None
) -> dict[str, float | None]:
    """Row id -> relative error of the row predicted by a fit on every other source (``None``: not scored)."""
    scored = targets(rows)
    out: dict[str, float | None] = {r.id: None for r in rows}
    for group, held in by_source(scored).items():
        held_ids = {t.row.id for t in held}
        train = [t for t in scored if t.row.id not in held_ids]
        if not train:
            continue
        params = with_values(FITTED, fold_fit(train, held, (folds or {}).get(group), starts))
        for t in held:
            out[t.row.id] = t.rel_error(params)
    return out


def fold_fit(
    train: Sequence[Target], held: Sequence[Target], stored: FoldFit | None, starts: int = STARTS
) -> dict[str, float]:
    """The fit of one fold: its stored fit as it is when that is current (what ``plan`` and ``validate`` quote,
    ``kilocard.calibration.trust``); refined by ``starts`` coordinate searches when the model or the rows changed
    since; a cold fit when there is none that never saw ``held``."""
    if stored is None or not usable(stored, held):
        return cold_fit(train)
    if current(stored, train):
        return fold_values(stored)
    return fit(train, starts=starts, start=fold_values(stored), evals=EVALS, tol=TOL)


def with_cross_validation(
    comps: list[Comparison], rows: Sequence[Row], folds: Mapping[str, FoldFit], starts: int = STARTS
) -> list[Comparison]:
    """``comps`` (one per row, same order) with their held-out errors filled in (``folds``: the stored fold
    fits, ``load_fold_fits``)."""
    held = held_out_errors(rows, starts, folds)
    return [replace(c, cv_rel_error=held.get(c.id) if c.rel_error is not None else None) for c in comps]
