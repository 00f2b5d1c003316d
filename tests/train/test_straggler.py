"""The straggler arithmetic of ``kilocard.train.straggler`` (the gather itself runs in every real run of
tests/train; ``test_rank_times_reach_the_metrics`` checks its fields on two ranks)."""

from __future__ import annotations

import pytest

from kilocard.train.straggler import SLOW_INTERVALS, StragglerWatch, spread


def test_spread_names_the_slowest_rank_and_the_median() -> None:
    s = spread([0.10, 0.30, 0.11, 0.12])
    assert (s.slowest_rank, s.max_s) == (1, 0.30) and s.median_s == pytest.approx(0.115) and s.slow
    assert not spread([0.10, 0.11]).slow


def test_a_rank_slow_three_intervals_in_a_row_is_named_once() -> None:
    w = StragglerWatch()
    lines = [w.observe(spread([0.1, 0.2, 0.1]), step=10 * (i + 1)) for i in range(SLOW_INTERVALS + 1)]
    assert lines[: SLOW_INTERVALS - 1] == [None] * (SLOW_INTERVALS - 1) and lines[-1] is None
    assert lines[SLOW_INTERVALS - 1] is not None
    assert "rank 1 is persistently slower: 3 intervals in a row" in lines[SLOW_INTERVALS - 1]
    assert "2.00x" in lines[SLOW_INTERVALS - 1]


def test_a_fast_interval_or_another_slow_rank_starts_the_count_again() -> None:
    w = StragglerWatch()
    seq = [[0.1, 0.2], [0.1, 0.2], [0.1, 0.1], [0.1, 0.2], [0.2, 0.1], [0.1, 0.2], [0.1, 0.2]]
    assert [w.observe(spread(t), step=i) for i, t in enumerate(seq)] == [None] * len(seq)
