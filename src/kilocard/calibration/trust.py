"""How far to trust a prediction: the held-out error of the published rows most like a run.

``kilocard baselines`` cross-validates the step-time model: each source's rows are predicted by a fit
on the other sources only. The stored fold fits (``baselines/published.folds.json``, written by
``scripts/fit_perf_model.py --folds``) make that cheap to recall without fitting: ``error_band``
predicts every scored row with its own source's stored fold fit (about 0.3 s for the shipped file)
and summarises the rows that share the run's traits: GPU family, dense or MoE, and GEMM width (32-,
16-, 8- or 4-bit). When fewer than ``MIN_ROWS`` rows share all three it drops the width, then the
family (dense/MoE is kept to the last: MoE rows are twice as far off as dense ones), and says so. A
fold-fits file that does not match the model or the rows (another version of either) is refused
with a one-line ``ValueError`` rather than quoted.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kilocard.base.table import text_table
from kilocard.calibration.baselines import baselines_file, load_rows
from kilocard.calibration.crossval import FoldFit, by_source, fold_values, folds_file, load_fold_fits, stale, usable
from kilocard.calibration.fit import Target, targets
from kilocard.config.schema import RunConfig
from kilocard.perf.efficiency import FITTED, with_values
from kilocard.perf.predict import PredictionInputs, gpu_family, precision_of, require_gpu

MIN_ROWS = 5
"""Fewest rows a band summarises before it drops a trait."""

MIN_SOURCES = 3
"""Fewer sources than this behind a band: it says the spread is known from few sources only."""

QUANTILE = 0.9
"""The band's high quantile of |error|: the error nine runs in ten like this one stayed within, held out."""

Traits = tuple[str, str, str]
"""(GPU family, ``dense``/``MoE``, GEMM width: ``16-bit``, ``8-bit`` ...)."""

Held = tuple[Traits, float, str, int]
"""(a row's traits, its held-out relative error, the source that published it, its GPU count)."""

SCALES = ((128, "up to 128 GPUs"), (1024, "129 to 1,024 GPUs"), (None, "more than 1,024 GPUs"))
"""GPU-count classes a band also quotes (upper bound, label): the model's error grows with scale, where
data-parallel and pipeline collectives cross more of the network and a step waits for more GPUs."""


def few_sources(sources: int) -> str:
    """The note a band carries when fewer than ``MIN_SOURCES`` sources stand behind it (else empty)."""
    if sources >= MIN_SOURCES:
        return ""
    return f" (only {sources} source{'s' * (sources != 1)}: the spread is known from few setups)"


def scale_class(gpus: int) -> str:
    """The ``SCALES`` label of a run on ``gpus`` GPUs."""
    return next(label for top, label in SCALES if top is None or gpus <= top)


@dataclass(frozen=True)
class ScaleBand:
    """The held-out error of the published rows in a run's GPU-count class (``SCALES``)."""

    scale: str
    """The class (``129 to 1,024 GPUs``)."""
    rows: int
    """Rows in it."""
    sources: int
    """Distinct sources behind them (fewer than ``MIN_SOURCES``: said in the summary)."""
    mean_abs: float
    """Mean |relative error|, held out."""
    q90_abs: float
    """The ``QUANTILE`` of |relative error|, held out."""
    max_abs: float
    """Largest |relative error|, held out."""

    def summary(self) -> str:
        """The class and its error in words."""
        few = few_sources(self.sources)
        return (
            f"at {self.scale}: {self.rows} rows from {self.sources} sources, mean {self.mean_abs:.1%}, "
            f"{QUANTILE:.0%} within {self.q90_abs:.1%}, max {self.max_abs:.1%}{few}"
        )

    def to_json(self) -> dict[str, object]:
        """``model_error.scale`` in ``kilocard plan`` and ``kilocard validate`` JSON."""
        return {
            "scale": self.scale,
            "rows": self.rows,
            "sources": self.sources,
            "cv_mean_abs_rel_error": self.mean_abs,
            "cv_q90_abs_rel_error": self.q90_abs,
            "cv_max_abs_rel_error": self.max_abs,
        }


def scale_band(gpus: int, errors: Sequence[Held]) -> ScaleBand | None:
    """The band of every row in the GPU-count class of a run on ``gpus`` GPUs; ``None`` when none is."""
    label = scale_class(gpus)
    match = [(abs(e), src) for _, e, src, n in errors if scale_class(n) == label]
    if not match:
        return None
    errs = [e for e, _ in match]
    return ScaleBand(
        scale=label,
        rows=len(match),
        sources=len({src for _, src in match}),
        mean_abs=statistics.fmean(errs),
        q90_abs=quantile(errs),
        max_abs=max(errs),
    )


WIDTH = {"fp32": "32-bit", "bf16": "16-bit", "fp16": "16-bit", "fp8": "8-bit", "fp4": "4-bit"}
"""GEMM dtype -> the width a band matches on (MXFP8 is ``fp8``)."""

WIDENING = ((0, 1, 2), (0, 1), (1,), ())
"""Which traits a band keeps, in the order tried: all; family and dense/MoE; dense/MoE; none."""


def _traits(family: str, experts: int, precision: str) -> Traits:
    return (family, "MoE" if experts else "dense", WIDTH.get(precision, precision))


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
    kept: tuple[int, ...]
    """Which of them the summarised rows share (indices into ``run``; ``()``: all rows)."""
    rows: int
    """Rows summarised."""
    sources: int
    """Distinct sources (documents or tables) that published them: the rows of one source share its
    setup, so the spread is only as well known as the number of sources behind it."""
    mean_abs: float
    """Their mean |relative error| of TFLOP/s per GPU, held out."""
    q90_abs: float
    """The ``QUANTILE`` (nearest rank) of their |relative error|, held out."""
    max_abs: float
    """Their largest |relative error|, held out."""
    family_rows: int
    """Rows on the run's GPU family (0: the model is not validated on that hardware at all)."""
    all_rows: int
    """Rows with a held-out error in the whole file."""
    all_sources: int
    """Distinct sources of every such row."""
    all_mean_abs: float
    """Mean |relative error| over every such row."""
    all_q90_abs: float
    """The ``QUANTILE`` of |relative error| over every such row."""
    all_max_abs: float
    """Largest |relative error| over every such row."""
    source: str
    """The fold-fits file the errors come from."""
    scale: ScaleBand | None = None
    """The rows of the run's GPU-count class (``None``: no GPU count given, or no row in its class)."""

    @property
    def label(self) -> str:
        """The traits the summarised rows share (``hopper, dense, 16-bit``; ``all published rows``)."""
        return ", ".join(self.run[i] for i in self.kept) or "all published rows"

    def summary(self) -> str:
        """Which rows, and their error, in words (what ``plan`` and ``validate`` print)."""
        pct = f"{QUANTILE:.0%}"
        every = (
            f"all {self.all_rows} from {self.all_sources} sources: mean {self.all_mean_abs:.1%}, "
            f"{pct} within {self.all_q90_abs:.1%}, max {self.all_max_abs:.1%}"
        )
        figures = f"mean {self.mean_abs:.1%}, {pct} within {self.q90_abs:.1%}, max {self.max_abs:.1%}"
        few = few_sources(self.sources)
        figures = f"{figures}{few}; {every}"
        from_ = f"from {self.sources} source{'s' * (self.sources != 1)}"
        if not self.family_rows:
            return (
                f"no published row ran on {self.run[0]}; {self.rows} {self.label} rows {from_} on other GPUs: {figures}"
            )
        dropped = [self.run[i] for i in range(3) if i not in self.kept]
        short = f"; fewer than {MIN_ROWS} are also {', '.join(dropped)}" if dropped else ""
        return f"{self.rows} published rows {from_} like this run ({self.label}{short}): {figures}"

    def to_json(self) -> dict[str, object]:
        """``model_error`` in ``kilocard plan`` and ``kilocard validate`` JSON."""
        return {
            "traits": list(self.run),
            "label": self.label,
            "rows": self.rows,
            "sources": self.sources,
            "family_rows": self.family_rows,
            "cv_mean_abs_rel_error": self.mean_abs,
            "cv_q90_abs_rel_error": self.q90_abs,
            "cv_max_abs_rel_error": self.max_abs,
            "all_rows": self.all_rows,
            "all_sources": self.all_sources,
            "all_cv_mean_abs_rel_error": self.all_mean_abs,
            "all_cv_q90_abs_rel_error": self.all_q90_abs,
            "all_cv_max_abs_rel_error": self.all_max_abs,
            "source": self.source,
            "scale": self.scale.to_json() if self.scale else None,
        }


def stored_held_out(scored: Sequence[Target], folds: dict[str, FoldFit]) -> list[tuple[Target, float]]:
    """Each scored row with its relative error under its source's stored fold fit; a row whose source
    has no stored fit, or one trained on any of the source's rows (a stale file), is left out."""
    return [(t, e) for t, e, _ in _stored_by_source(scored, folds)]


def _stored_by_source(scored: Sequence[Target], folds: dict[str, FoldFit]) -> list[tuple[Target, float, str]]:
    out: list[tuple[Target, float, str]] = []
    for group, held in by_source(scored).items():
        fold = folds.get(group)
        if fold is not None and usable(fold, held):
            params = with_values(FITTED, fold_values(fold))
            out.extend((t, t.rel_error(params), group) for t in held)
    return out


def quantile(values: Sequence[float], q: float = QUANTILE) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (no interpolation: a value that was observed)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def band(run: Traits, errors: Sequence[Held], source: str, gpus: int | None = None) -> ErrorBand | None:
    """The band of the rows sharing the most of ``run``'s traits (``WIDENING``: at least ``MIN_ROWS`` of
    them), with the rows of its GPU-count class when ``gpus`` is given; ``None`` when there are no errors
    at all."""
    if not errors:
        return None
    every = [abs(e) for _, e, _, _ in errors]
    for keep in WIDENING:
        match = [(abs(e), src) for t, e, src, _ in errors if all(t[i] == run[i] for i in keep)]
        if len(match) >= MIN_ROWS or not keep:
            errs = [e for e, _ in match]
            return ErrorBand(
                run=run,
                kept=keep,
                rows=len(match),
                sources=len({src for _, src in match}),
                mean_abs=statistics.fmean(errs),
                q90_abs=quantile(errs),
                max_abs=max(errs),
                family_rows=sum(t[0] == run[0] for t, _, _, _ in errors),
                all_rows=len(every),
                all_sources=len({src for _, _, src, _ in errors}),
                all_mean_abs=statistics.fmean(every),
                all_q90_abs=quantile(every),
                all_max_abs=max(every),
                source=source,
                scale=scale_band(gpus, errors) if gpus else None,
            )
    return None  # pragma: no cover (the last WIDENING step always returns)


def check_current(scored: Sequence[Target], folds: dict[str, FoldFit], where: str) -> None:
    """A ``ValueError`` naming the fix when the stored fold fits are not of this model and these rows: a
    scored source without a fit, or a ``crossval.stale`` one."""
    fix = f"rerun scripts/fit_perf_model.py --folds for {where}"
    for group, held in by_source(scored).items():
        fold = folds.get(group)
        if fold is None:
            raise ValueError(f"{where}: no stored fold fit for source {group!r}; {fix}")
        seen = fold.trained_on - {t.row.id for t in held}
        why = stale(fold, [t for t in scored if t.row.id in seen])
        if why:
            raise ValueError(f"{where}: the fold fit of {group!r} {why}; {fix}")


@functools.cache
def _held_out(file: str | None) -> tuple[Held, ...]:
    """(traits, held-out error) of every scored row of ``file`` (cached: a ``--multirun`` reads the file
    once); empty when it has no stored fold fits, a ``ValueError`` when they are not current."""
    folds = load_fold_fits(baselines_file(file))
    if not folds:
        return ()
    scored = targets(load_rows(file))
    check_current(scored, folds, folds_file(baselines_file(file)).name)
    return tuple(
        (traits(t.inputs), e, src, t.inputs.layout.world_size) for t, e, src in _stored_by_source(scored, folds)
    )


def error_band(run: Traits, file: str | None = None, gpus: int | None = None) -> ErrorBand | None:
    """The band for a run with traits ``run`` (on ``gpus`` GPUs: the band adds its GPU-count class) from
    the baselines file ``file`` (default: the shipped one) and its stored fold fits; ``None`` when it has
    none. A broken or stale file is a one-line ``ValueError``."""
    return band(run, _held_out(file), folds_file(baselines_file(file)).name, gpus)


def model_error(cfg: RunConfig, file: str | None = None) -> tuple[ErrorBand | None, str | None]:
    """(the band of ``cfg``, why there is none): what ``plan`` and ``validate`` print under their
    predictions (``file``: the baselines file, default the shipped one)."""
    try:
        found = error_band(run_traits(cfg), file, cfg.cluster.nodes * cfg.cluster.gpus_per_node)
    except ValueError as e:
        return None, str(e)
    if found is None:
        return None, "the baselines have no stored fold fits (scripts/fit_perf_model.py --folds)"
    return found, None


def unscored_baseline(cfg: RunConfig, file: str | None = None) -> str | None:
    """Why the published row ``cfg``'s recipe reproduces is left out of the scoring (its ``excluded:``), or
    ``None``: the band above speaks of rows like the run, and says nothing of a row the model is known to miss."""
    wanted = cfg.recipe.baseline_id
    if not wanted:
        return None
    try:
        rows = load_rows(file)
    except ValueError:
        return None  # a broken file is reported by the band's own line
    row = next((r for r in rows if r.id == wanted), None)
    return f"the published row {wanted} is not scored: {row.excluded}" if row and row.excluded else None


HEADER = "model error on published rows, each predicted by a fit that never saw its source (docs/perf_model.md):"
"""The line above the band in ``plan`` and ``validate``."""


def model_error_lines(found: ErrorBand | None, issue: str | None, indent: str = "") -> list[str]:
    """The band in words, as ``plan`` and ``validate`` print it."""
    if found is None:
        return [f"{indent}model error unknown: {issue}"]
    scale = [f"{indent}  {found.scale.summary()}"] if found.scale else []
    return [indent + HEADER, f"{indent}  {found.summary()}", *scale]


def model_error_json(found: ErrorBand | None, issue: str | None) -> dict[str, object]:
    """``model_error`` and ``model_error_issue``, as ``plan`` and ``validate`` JSON carry them."""
    return {"model_error": found.to_json() if found else None, "model_error_issue": issue}


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
    title = "by kind (plan and validate quote the shipped rows' held-out column, from the stored fold fits):"
    return [title] + ["  " + line for line in text_table(rows, rule=False)]


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
