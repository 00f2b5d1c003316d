"""Measured against predicted against published: what a finished run reproduced.

``reproduction(cfg, records, resumes)`` takes a run's frozen config and its own records (metrics.jsonl,
the ``resume`` events of events.jsonl) and returns the median TFLOP/s per GPU and MFU of its steady-state
steps, the performance model's prediction for exactly that config on the profile's GPU, and the recipe's
published figure (``recipe.baseline_*``), all three in one FLOPs convention: the published figure's
when the recipe names one, else the run's own (``metrics.FLOPS_CONVENTION``). The steps it leaves out,
and why, are part of the answer: the first ``WARMUP_STEPS`` of every launch (compilation, allocator and
data warm-up), steps whose period holds a checkpoint save (every ``checkpoint.save_interval`` /
``non_persistent_save_interval`` step and the last one) and steps followed by an evaluation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kilocard.config.schema import RunConfig
from kilocard.perf.flops import flops_per_iteration
from kilocard.perf.predict import Prediction, predict
from kilocard.rundir import events
from kilocard.rundir.freeze import load_verified
from kilocard.rundir.metrics import FLOPS_CONVENTION, read_metrics

WARMUP_STEPS = 2
"""Steps left out at the start of every launch (the first one builds kernels and buffers)."""

MIN_STEADY_STEPS = 3
"""Fewest steady-state steps a figure is computed from (fewer: the run did not reach steady state)."""


class NotSteady(ValueError):
    """A run without enough steady-state steps to report a figure; the message says how many it had."""


@dataclass(frozen=True)
class Figure:
    """One throughput figure: TFLOP/s per GPU and MFU in the report's convention."""

    tflops_per_gpu: float | None
    """TFLOP/s per GPU (``None``: not known)."""
    mfu: float | None
    """Model FLOPs utilisation (``None``: no peak known)."""

    def to_json(self) -> dict[str, float | None]:
        """``{"tflops_per_gpu", "mfu"}``."""
        return {"tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu}


@dataclass(frozen=True)
class Reproduction:
    """What a run measured, what the model predicted for it and what was published, side by side."""

    measured: Figure
    """Median over the steady-state steps."""
    predicted: Figure | None
    """The performance model's prediction for the frozen config (``None``: see ``predicted_issue``)."""
    published: Figure | None
    """The recipe's published figure (``None``: the recipe names none)."""
    convention: str
    """FLOPs convention of all three figures."""
    steps_used: list[int]
    """The steps the measured medians come from."""
    excluded: dict[int, str]
    """Each left-out step and why (``warm-up``, ``checkpoint``, ``evaluation``)."""
    step_time_s: float
    """Median measured seconds per step over ``steps_used``."""
    predicted_step_time_s: float | None
    """Predicted seconds per step."""
    breakdown_s: dict[str, float] = field(default_factory=dict)
    """The prediction's seconds per step by component (GEMM, attention, communication, bubble, ...)."""
    baseline_id: str | None = None
    """The published row the recipe reproduces."""
    predicted_issue: str | None = None
    """Why there is no prediction."""
    per_step: list[tuple[int, float]] = field(default_factory=list)
    """(step, TFLOP/s per GPU in ``convention``) of every training record, for the picture."""

    def ratio(self, other: Figure | None) -> float | None:
        """measured / other TFLOP/s per GPU (``None`` when either is missing)."""
        if other is None or not other.tflops_per_gpu or self.measured.tflops_per_gpu is None:
            return None
        return self.measured.tflops_per_gpu / other.tflops_per_gpu

    def to_json(self) -> dict[str, Any]:
        """``kilocard report --format json``."""
        return {
            "measured": self.measured.to_json(),
            "predicted": self.predicted.to_json() if self.predicted else None,
            "published": self.published.to_json() if self.published else None,
            "convention": self.convention,
            "steps_used": self.steps_used,
            "excluded": {str(k): v for k, v in sorted(self.excluded.items())},
            "measured_over_predicted": self.ratio(self.predicted),
            "measured_over_published": self.ratio(self.published),
            "step_time_s": {"measured": self.step_time_s, "predicted": self.predicted_step_time_s},
            "breakdown_s": self.breakdown_s,
            "baseline_id": self.baseline_id,
            "predicted_issue": self.predicted_issue,
        }


def excluded_steps(cfg: RunConfig, steps: Iterable[int], resumed_at: Iterable[int]) -> dict[int, str]:
    """Which of ``steps`` are not steady state, and why (``resumed_at``: the step each launch started from)."""
    starts = sorted(set(resumed_at) | {0})
    ck, tr = cfg.checkpoint, cfg.trainer
    intervals = [i for i in (ck.save_interval, ck.non_persistent_save_interval) if i]
    eval_interval = getattr(tr, "eval_interval", None)
    out: dict[int, str] = {}
    for s in steps:
        if any(0 < s - start <= WARMUP_STEPS for start in starts):
            out[s] = "warm-up"
        elif s == tr.train_iters or any(s % i == 0 for i in intervals):
            out[s] = "checkpoint"
        elif eval_interval and s % eval_interval == 0:
            out[s] = "evaluation"
    return out


def _published(cfg: RunConfig, peak: float | None) -> Figure | None:
    r = cfg.recipe
    if r.baseline_tflops_per_gpu is None and r.baseline_mfu is None:
        return None
    tflops = r.baseline_tflops_per_gpu
    if tflops is None and r.baseline_mfu is not None and peak:
        tflops = r.baseline_mfu * peak / 1e12
    mfu = r.baseline_mfu if r.baseline_mfu is not None else (tflops * 1e12 / peak if tflops and peak else None)
    return Figure(tflops, mfu)


def _prediction(cfg: RunConfig, convention: str) -> tuple[Prediction | None, str | None]:
    try:
        return predict(cfg, convention), None
    except (KeyError, ValueError, ZeroDivisionError) as e:
        return None, f"the performance model cannot predict this config: {e}"


def reproduction(cfg: RunConfig, records: Sequence[dict[str, Any]], resumed_at: Iterable[int] = ()) -> Reproduction:
    """The report of a run with frozen config ``cfg``, its training records and the steps it resumed from."""
    train = [r for r in records if "split" not in r and "step_time_s" in r and "tflops_per_gpu" in r]
    convention = cfg.recipe.baseline_flops_convention or FLOPS_CONVENTION
    scale = flops_per_iteration(cfg, convention) / flops_per_iteration(cfg, FLOPS_CONVENTION)
    excluded = excluded_steps(cfg, (r["step"] for r in train), resumed_at)
    steady = [r for r in train if r["step"] not in excluded]
    if len(steady) < MIN_STEADY_STEPS:
        raise NotSteady(
            f"{len(steady)} steady-state step(s) of {len(train)} recorded (fewer than {MIN_STEADY_STEPS}: "
            f"{WARMUP_STEPS} warm-up steps per launch and checkpoint/evaluation steps are left out)"
        )
    pred, issue = _prediction(cfg, convention)
    peak = pred.peak_flops if pred else None
    tflops = statistics.median(r["tflops_per_gpu"] for r in steady) * scale
    return Reproduction(
        measured=Figure(tflops, tflops * 1e12 / peak if peak else None),
        predicted=Figure(pred.tflops_per_gpu, pred.mfu) if pred else None,
        published=_published(cfg, peak),
        convention=convention,
        steps_used=[r["step"] for r in steady],
        excluded=excluded,
        step_time_s=statistics.median(r["step_time_s"] for r in steady),
        predicted_step_time_s=pred.step_time_s if pred else None,
        breakdown_s=dict(pred.breakdown) if pred else {},
        baseline_id=cfg.recipe.baseline_id,
        predicted_issue=issue,
        per_step=[(r["step"], r["tflops_per_gpu"] * scale) for r in train],
    )


def load(run_dir: Path) -> Reproduction:
    """The report of the run directory ``run_dir`` (its frozen config is verified against its sha256)."""
    cfg, _ = load_verified(run_dir)
    resumed = [int(e.get("step") or 0) for e in events.read(run_dir) if e.get("event") == "resume"]
    return reproduction(cfg, read_metrics(run_dir), resumed)


def _tf(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.2%}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def text_lines(rep: Reproduction) -> list[str]:
    """The report as aligned lines (what ``kilocard report`` and the run's summary print)."""
    rows = [("", "TFLOP/s per GPU", "MFU", "measured / this")]
    rows.append(("measured (median)", _tf(rep.measured.tflops_per_gpu), _pct(rep.measured.mfu), ""))
    label = f"published ({rep.baseline_id})" if rep.baseline_id else "published"
    for name, fig in (("predicted", rep.predicted), (label, rep.published)):
        f = fig or Figure(None, None)
        rows.append((name, _tf(f.tflops_per_gpu), _pct(f.mfu), _ratio(rep.ratio(fig))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    reasons: dict[str, list[int]] = {}
    for s, why in sorted(rep.excluded.items()):
        reasons.setdefault(why, []).append(s)
    left_out = "; ".join(f"{why} {_steps(s)}" for why, s in reasons.items()) or "none"
    lines.append(f"FLOPs convention {rep.convention}; {len(rep.steps_used)} steady-state steps; left out: {left_out}")
    if rep.published is None:
        lines.append("published: the recipe names no baseline (recipe.baseline_tflops_per_gpu / baseline_mfu)")
    if rep.predicted_issue:
        lines.append(f"predicted: {rep.predicted_issue}")
    lines += breakdown_lines(rep)
    return lines


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) if len(steps) <= 6 else f"{', '.join(map(str, steps[:5]))}, ... ({len(steps)})"


def breakdown_lines(rep: Reproduction) -> list[str]:
    """The predicted step time by component beside the measured step time, so a user sees which term was off."""
    if rep.predicted_step_time_s is None:
        return [f"step time: measured {rep.step_time_s:.4g} s"]
    parts = sorted(((k, v) for k, v in rep.breakdown_s.items() if v > 0), key=lambda kv: -kv[1])
    terms = ", ".join(f"{k} {v:.3g}" for k, v in parts)
    return [
        f"step time: measured {rep.step_time_s:.4g} s, predicted {rep.predicted_step_time_s:.4g} s "
        f"({rep.step_time_s / rep.predicted_step_time_s:.2f}x)",
        f"predicted by component (s): {terms}",
    ]


def summary_lines(run_dir: Path) -> list[str]:
    """The report under a finished run's summary (``kilocard run``, and rank 0's log under Slurm); one line
    saying why when there is none yet."""
    try:
        rep = load(run_dir)
    except (NotSteady, events.BadRecord) as e:
        return ["", f"reproduction: none ({e})"]
    return ["", "reproduction (kilocard report RUN_DIR --plot FILE draws it)", *text_lines(rep)]
