"""Scaling series of ``kilocard baselines``: does the model reproduce how MFU changes with GPU count?

Rows of one published strong- or weak-scaling series carry the same ``series:`` name. For each
series the check compares the MFU change from its smallest to its largest GPU count as published
with the change the model predicts, in sample (the shipped fit) and held out (each row predicted by
the fit that did not see its source, ``cv_rel_error``). Within ``TOLERANCE`` (3 MFU points) is ok.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kilocard.calibration.baselines import Comparison, Row

TOLERANCE = 0.03
"""Largest accepted gap between the predicted and the published MFU change (0.03: 3 MFU points)."""


@dataclass(frozen=True)
class SeriesCheck:
    """One scaling series: its end points and the MFU change published and predicted between them."""

    name: str
    """The rows' ``series:`` name."""
    gpus: tuple[int, int]
    """Smallest and largest GPU count of the series' scored rows."""
    published_mfu_change: float
    """Published MFU at the largest count minus at the smallest (0.01 = one MFU point)."""
    predicted_mfu_change: float
    """The same change as the shipped fit predicts it."""
    cv_predicted_mfu_change: float | None
    """The same change from the held-out predictions (``None`` when a row was not cross-validated)."""

    @property
    def ok(self) -> bool:
        """The in-sample predicted change is within ``TOLERANCE`` of the published one."""
        return abs(self.predicted_mfu_change - self.published_mfu_change) <= TOLERANCE

    @property
    def cv_ok(self) -> bool | None:
        """The held-out predicted change is within ``TOLERANCE`` (``None`` when not cross-validated)."""
        if self.cv_predicted_mfu_change is None:
            return None
        return abs(self.cv_predicted_mfu_change - self.published_mfu_change) <= TOLERANCE


@dataclass(frozen=True)
class _Point:
    """One scored row of a series."""

    gpus: int
    published_mfu: float
    predicted_mfu: float
    cv_mfu: float | None
    """The held-out predicted MFU: the published one scaled by the held-out error (same peak)."""


def _points(rows: Sequence[Row], comps: Sequence[Comparison]) -> dict[str, list[_Point]]:
    """Series name -> its scored rows."""
    by_id = {c.id: c for c in comps}
    out: dict[str, list[_Point]] = {}
    for r in rows:
        c, name = by_id.get(r.id), r.series
        if not name or c is None or c.predicted_mfu is None or c.published_mfu is None:
            continue
        cv = None if c.cv_rel_error is None else c.published_mfu * (1.0 + c.cv_rel_error)
        out.setdefault(str(name), []).append(_Point(int(r.raw["gpus"]), c.published_mfu, c.predicted_mfu, cv))
    return out


def series_checks(rows: Sequence[Row], comps: Sequence[Comparison]) -> list[SeriesCheck]:
    """One check per ``series:`` name with scored rows at two or more GPU counts."""
    out = []
    for name, pts in _points(rows, comps).items():
        lo, hi = min(pts, key=lambda p: p.gpus), max(pts, key=lambda p: p.gpus)
        if lo.gpus == hi.gpus:
            continue
        cv = None if lo.cv_mfu is None or hi.cv_mfu is None else hi.cv_mfu - lo.cv_mfu
        out.append(
            SeriesCheck(
                name=name,
                gpus=(lo.gpus, hi.gpus),
                published_mfu_change=hi.published_mfu - lo.published_mfu,
                predicted_mfu_change=hi.predicted_mfu - lo.predicted_mfu,
                cv_predicted_mfu_change=cv,
            )
        )
    return out


def render_series_text(checks: Sequence[SeriesCheck]) -> str:
    """The lines ``kilocard baselines`` prints for the scaling series (empty when there are none).

    One header line states the tolerance and how many series meet it; each series line then says
    ``ok`` or ``off`` for the in-sample and the held-out prediction.
    """
    if not checks:
        return ""
    held = [s.cv_ok for s in checks if s.cv_ok is not None]
    lines = [
        f"scaling series (ok: predicted MFU change within {100 * TOLERANCE:.0f} points of the published one): "
        f"{sum(s.ok for s in checks)} of {len(checks)} ok in sample, {sum(held)} of {len(held)} held out"
    ]
    for s in checks:
        cv = (
            ""
            if s.cv_predicted_mfu_change is None
            else f", held out {100 * s.cv_predicted_mfu_change:+.1f} ({'ok' if s.cv_ok else 'off'})"
        )
        lines.append(
            f"series {s.name} ({s.gpus[0]} -> {s.gpus[1]} GPUs): MFU change published "
            f"{100 * s.published_mfu_change:+.1f} points, predicted {100 * s.predicted_mfu_change:+.1f} "
            f"({'ok' if s.ok else 'off'}){cv}"
        )
    return "\n".join(lines)


def series_json(checks: Sequence[SeriesCheck]) -> list[dict[str, object]]:
    """The ``series`` list of ``kilocard baselines --format json``."""
    return [
        {
            "name": s.name,
            "gpus": list(s.gpus),
            "published_mfu_change": s.published_mfu_change,
            "predicted_mfu_change": s.predicted_mfu_change,
            "cv_predicted_mfu_change": s.cv_predicted_mfu_change,
            "ok": s.ok,
            "cv_ok": s.cv_ok,
        }
        for s in checks
    ]
