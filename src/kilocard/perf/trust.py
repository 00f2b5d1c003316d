"""How far to trust a prediction: the held-out error of the published rows most like a run.

``kilocard baselines`` cross-validates the step-time model: each source's rows are predicted by a fit
on the other sources only. The stored fold fits (``baselines/published.folds.json``, written by
``scripts/fit_perf_model.py --folds``) make that cheap to recall without fitting: ``error_band``
predicts every scored row with its own source's stored fold fit (about 0.3 s for the shipped file)
and summarises the rows that share the run's traits: GPU family, dense or MoE, and GEMM precision
(16-bit or 8-bit). When fewer than ``MIN_ROWS`` rows share all three it drops precision, then
dense/MoE, then the family, and says so.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kilocard.config.schema import RunConfig
from kilocard.perf.baselines import baselines_file, load_rows
from kilocard.perf.crossval import FoldFit, folds_file, load_fold_fits, source_group
from kilocard.perf.efficiency import FITTED, with_values
from kilocard.perf.fit import Target, middles, targets
from kilocard.perf.predict import PredictionInputs, gpu_family, precision_of, require_gpu

MIN_ROWS = 5
"""Fewest rows a band summarises before it drops a trait."""

Traits = tuple[str, str, str]
"""(GPU family, ``dense``/``MoE``, ``16-bit``/``8-bit``)."""


def _traits(family: str, experts: int, precision: str) -> Traits:
    return (family, "MoE" if experts else "dense", "8-bit" if precision in ("fp8", "fp4") else "16-bit")


def traits(inputs: PredictionInputs) -> Traits:
    """The traits of a published row, from its prediction inputs."""
    return _traits(inputs.hardware.family, inputs.features.num_experts, inputs.features.precision)


def run_traits(cfg: RunConfig) -> Traits:
    """The same traits of a config (what ``kilocard plan`` plans), whatever its layout."""
    family = gpu_family(require_gpu(cfg.cluster.gpu))
    return _traits(family, cfg.model.num_moe_experts or 0, precision_of(cfg))


@dataclass(frozen=True)
class ErrorBand:
    """The held-out error of the published rows most like a run, and of all rows."""

    run: Traits
    """The run's traits."""
    kept: int
    """How many of them (from the first) the summarised rows share: 3 all, 0 none (all rows)."""
    rows: int
    """Rows summarised."""
    mean_abs: float
    """Their mean |relative error| of TFLOP/s per GPU, held out."""
    max_abs: float
    """Their largest |relative error|, held out."""
    all_rows: int
    """Rows with a held-out error in the whole file."""
    all_mean_abs: float
    """Mean |relative error| over every such row."""
    all_max_abs: float
    """Largest |relative error| over every such row."""
    source: str
    """The fold-fits file the errors come from."""

    @property
    def label(self) -> str:
        """The traits the summarised rows share (``hopper, dense, 16-bit``; ``all published rows``)."""
        return ", ".join(self.run[: self.kept]) or "all published rows"

    def summary(self) -> str:
        """Which rows, and their error, in words (``kilocard plan``)."""
        every = f"all {self.all_rows}: mean {self.all_mean_abs:.1%}, max {self.all_max_abs:.1%}"
        if self.kept == 0:
            return f"fewer than {MIN_ROWS} published rows ran on the {self.run[0]} family; {every}"
        short = "" if self.kept == 3 else f"; fewer than {MIN_ROWS} are also {', '.join(self.run[self.kept :])}"
        return (
            f"{self.rows} published rows like this run ({self.label}{short}): mean {self.mean_abs:.1%}, "
            f"max {self.max_abs:.1%}; {every}"
        )

    def to_json(self) -> dict[str, object]:
        """``kilocard plan --format json``'s ``model_error``."""
        return {
            "traits": list(self.run),
            "label": self.label,
            "rows": self.rows,
            "cv_mean_abs_rel_error": self.mean_abs,
            "cv_max_abs_rel_error": self.max_abs,
            "all_rows": self.all_rows,
            "all_cv_mean_abs_rel_error": self.all_mean_abs,
            "all_cv_max_abs_rel_error": self.all_max_abs,
            "source": self.source,
        }


def stored_held_out(scored: Sequence[Target], folds: dict[str, FoldFit]) -> list[tuple[Target, float]]:
    """Each scored row with its relative error under its source's stored fold fit; a row whose source
    has no stored fit, or one trained on any of the source's rows (a stale file), is left out."""
    out: list[tuple[Target, float]] = []
    for group in dict.fromkeys(source_group(t.row) for t in scored):
        held = [t for t in scored if source_group(t.row) == group]
        fold = folds.get(group)
        if fold is None or fold.trained_on & {t.row.id for t in held}:
            continue
        params = with_values(FITTED, {**middles(), **fold.values})
        out.extend((t, t.rel_error(params)) for t in held)
    return out


def band(run: Traits, errors: Sequence[tuple[Traits, float]], source: str) -> ErrorBand | None:
    """The band of the rows sharing the most of ``run``'s traits (at least ``MIN_ROWS`` of them, else
    fewer traits); ``None`` when there are no errors at all."""
    if not errors:
        return None
    every = [abs(e) for _, e in errors]
    for n in (3, 2, 1, 0):
        match = [abs(e) for t, e in errors if t[:n] == run[:n]]
        if len(match) >= MIN_ROWS or n == 0:
            return ErrorBand(
                run=run,
                kept=n,
                rows=len(match),
                mean_abs=statistics.fmean(match),
                max_abs=max(match),
                all_rows=len(every),
                all_mean_abs=statistics.fmean(every),
                all_max_abs=max(every),
                source=source,
            )
    return None  # pragma: no cover (n == 0 always returns)


@functools.cache
def _held_out(file: str | None) -> tuple[tuple[Traits, float], ...]:
    """(traits, held-out error) of every scored row of ``file`` with a stored fold fit (cached: a
    ``--multirun`` reads the file once)."""
    folds = load_fold_fits(baselines_file(file))
    return tuple((traits(t.inputs), e) for t, e in stored_held_out(targets(load_rows(file)), folds))


def error_band(run: Traits, file: str | None = None) -> ErrorBand | None:
    """The band for a run with traits ``run`` from the baselines file ``file`` (default: the shipped one)
    and its stored fold fits; ``None`` when it has none. A broken file is a one-line ``ValueError``."""
    return band(run, _held_out(file), folds_file(baselines_file(file)).name)


def model_error(cfg: RunConfig) -> tuple[ErrorBand | None, str | None]:
    """(the band of ``cfg`` from the shipped baselines, why there is none): what ``plan`` and ``validate``
    print under their predictions."""
    try:
        found = error_band(run_traits(cfg))
    except ValueError as e:
        return None, str(e)
    if found is None:
        return None, "the baselines have no stored fold fits (scripts/fit_perf_model.py --folds)"
    return found, None


@dataclass(frozen=True)
class Kind:
    """The errors of the scored rows that share one set of traits (``kilocard baselines``' "by kind")."""

    traits: Traits
    """GPU family, dense/MoE, GEMM width."""
    rows: int
    """Rows of this kind."""
    mean_abs: float
    """Mean |relative error|, in sample."""
    max_abs: float
    """Largest |relative error|, in sample."""
    cv_mean_abs: float | None
    """Mean |relative error|, held out (``None`` without cross-validation)."""
    cv_max_abs: float | None
    """Largest |relative error|, held out."""


def by_kind(errors: Sequence[tuple[Traits, float, float | None]]) -> list[Kind]:
    """(traits, in-sample error, held-out error) of each row -> one ``Kind`` per traits, most rows first."""
    kinds: dict[Traits, list[tuple[float, float | None]]] = {}
    for t, e, cv in errors:
        kinds.setdefault(t, []).append((abs(e), None if cv is None else abs(cv)))
    out = []
    for t, errs in kinds.items():
        held = [cv for _, cv in errs if cv is not None]
        out.append(
            Kind(
                traits=t,
                rows=len(errs),
                mean_abs=statistics.fmean(e for e, _ in errs),
                max_abs=max(e for e, _ in errs),
                cv_mean_abs=statistics.fmean(held) if held else None,
                cv_max_abs=max(held) if held else None,
            )
        )
    return sorted(out, key=lambda k: (-k.rows, k.traits))


def by_kind_lines(kinds: Sequence[Kind]) -> list[str]:
    """The "by kind" table of ``kilocard baselines``."""

    def pair(mean: float | None, top: float | None) -> str:
        return "-" if mean is None or top is None else f"{mean:.1%} / {top:.1%}"

    rows = [("kind", "rows", "in sample mean / max", "held out mean / max")]
    for k in kinds:
        rows.append((", ".join(k.traits), str(k.rows), pair(k.mean_abs, k.max_abs), pair(k.cv_mean_abs, k.cv_max_abs)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return ["by kind (what `plan` and `validate` quote for a run of that kind):"] + [
        "  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]


def kind_json(k: Kind) -> dict[str, object]:
    """One kind in ``kilocard baselines --format json``'s ``by_kind``."""
    return {
        "traits": list(k.traits),
        "rows": k.rows,
        "mean_abs_rel_error": k.mean_abs,
        "max_abs_rel_error": k.max_abs,
        "cv_mean_abs_rel_error": k.cv_mean_abs,
        "cv_max_abs_rel_error": k.cv_max_abs,
    }
