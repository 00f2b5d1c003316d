"""Per-rank step time: which rank is slowest, and whether it stays so (a straggler).

Every rank times its own part of each step: from the step's start to the moment it is ready to reduce
its gradients (Megatron-Core's ``finalize_model_grads``, the first point where ranks wait for each
other in a data-parallel step). The wait for slower peers comes after that moment, so a slow rank's
figure grows while the others' stay put. Every ``trainer.rank_time_interval`` steps the ranks
all-gather their mean over the interval (one small collective per interval, never per step); the
step's metrics record gets ``step_time_max_s``, ``step_time_median_s`` and ``slowest_rank``, and a rank
that is the slowest, by more than ``SLOW_RATIO`` x the median, for ``SLOW_INTERVALS`` intervals in a row
is named in a warning line.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

SLOW_RATIO = 1.2
"""A rank is slow in an interval when its mean time exceeds the median by this factor."""
SLOW_INTERVALS = 3
"""Consecutive slow intervals of the same rank that make it a straggler worth a warning."""


@dataclass(frozen=True)
class Spread:
    """One interval's per-rank figures."""

    max_s: float
    """The slowest rank's mean time per step."""
    median_s: float
    """The median over ranks."""
    slowest_rank: int
    """The global rank with ``max_s``."""

    def record(self) -> dict[str, float | int]:
        """The metrics-record fields."""
        return {"step_time_max_s": self.max_s, "step_time_median_s": self.median_s, "slowest_rank": self.slowest_rank}

    @property
    def slow(self) -> bool:
        """Whether the slowest rank exceeds the median by more than ``SLOW_RATIO``."""
        return self.max_s > SLOW_RATIO * self.median_s


def spread(per_rank_s: list[float]) -> Spread:
    """The spread of one interval's per-rank mean times (index = global rank)."""
    slowest = max(range(len(per_rank_s)), key=per_rank_s.__getitem__)
    return Spread(max_s=per_rank_s[slowest], median_s=statistics.median(per_rank_s), slowest_rank=slowest)


class StragglerWatch:
    """Counts consecutive slow intervals of the same rank; says when one has become a straggler."""

    def __init__(self) -> None:
        self._rank: int | None = None
        self._count = 0

    def observe(self, s: Spread, step: int) -> str | None:
        """Feed one interval; a warning line when ``s.slowest_rank`` has just been slow ``SLOW_INTERVALS`` times
        in a row (then again every further ``SLOW_INTERVALS``), else ``None``."""
        if not s.slow:
            self._rank, self._count = None, 0
            return None
        self._count = self._count + 1 if s.slowest_rank == self._rank else 1
        self._rank = s.slowest_rank
        if self._count % SLOW_INTERVALS:
            return None
        return (
            f"warning: rank {s.slowest_rank} is persistently slower: {self._count} intervals in a row above "
            f"{SLOW_RATIO}x the median (up to step {step}: {s.max_s:.3f} s vs {s.median_s:.3f} s per step, "
            f"{s.max_s / s.median_s:.2f}x); check its node (CPU/GPU clocks, thermal, neighbours, data reads)"
        )
