"""`kilocard plan --plot`: bars named as the table's rows, zoomed MFU, legends beside the axes, a
readable schedule at PP8 x VP8."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.planner.plots import _runs, memory_panel, mfu_panel, plot_plan, simulate
from kilocard.planner.search import plan, table_rows


@pytest.fixture(scope="module")
def planned():
    cfg = to_run_config(compose(["recipe=bridge_llama31_405b_fp8"]))
    return plan(cfg, top=5)


def test_mfu_axis_is_zoomed_on_the_values(planned):
    """The ranked MFUs differ by a few percent: the axis spans them instead of starting at 0."""
    fig, ax = plt.subplots()
    mfu_panel(ax, planned, table_rows(planned))
    values = [100 * r.mfu for _, r in table_rows(planned)]
    lo, hi = ax.get_ylim()
    assert 0 < lo < min(values) and max(values) < hi
    assert (max(values) - min(values)) / (hi - lo) > 0.3
    assert [t.get_text() for t in ax.texts] == [f"{v:.1f}%" for v in values]  # the value on each bar
    plt.close(fig)


def test_memory_legend_covers_no_bar_and_values_are_written(planned):
    fig, ax = plt.subplots()
    entries = table_rows(planned)
    memory_panel(ax, planned, entries)
    fig.canvas.draw()
    legend, axes = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= axes.x1, "the legend must sit beside the axes, not over the bars"
    parts = ("weights", "gradients", "optimizer", "activations")
    totals = [t.get_text() for t in ax.texts][-len(entries) :]
    assert totals == [f"{sum(r.memory[p] for p in parts) / 2**30:.1f}" for _, r in entries]
    activations = [f"{r.memory['activations'] / 2**30:.1f}" for _, r in entries]
    assert set(activations) <= {t.get_text() for t in ax.texts}  # the largest part written inside its segment
    plt.close(fig)


def test_bars_are_named_as_the_table_rows(planned, tmp_path, monkeypatch):
    """Each bar's label starts with the table's '#' (the own layout's rows end in '*')."""
    seen = {}
    real = plt.Figure.savefig

    def keep(fig, path, **kw):
        seen["labels"] = [t.get_text() for t in fig.axes[-1].get_xticklabels()]
        return real(fig, path, **kw)

    monkeypatch.setattr(plt.Figure, "savefig", keep)  # a spy: the real savefig still writes the file
    plot_plan(planned, str(tmp_path / "p.png"))
    assert [lab.splitlines()[0] for lab in seen["labels"]] == [f"#{k}" for k, _ in table_rows(planned)]
    assert any(lab.splitlines()[0].endswith("*") for lab in seen["labels"])
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_dense_schedule_is_summarised_into_few_blocks():
    """PP8 x VP8 with 16 micro-batches (256 passes per rank): warm-up, alternating and cool-down blocks,
    every pass in exactly one block, and no block overlapping another."""
    pp, vp, micro = 8, 8, 16
    times = simulate(pp, vp, micro, 1.0 / vp, 2.0 / vp)
    blocks = list(_runs(times, merge=0.5))
    for rank in range(pp):
        mine = [b for b in blocks if b[0] == rank]
        assert len(mine) <= 30
        assert sum(len(b[4]) for b in mine) == 2 * vp * micro
        assert {b[1] for b in mine} >= {"F", "B", "FB"}
        spans = sorted((b[2], b[3]) for b in mine)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    assert len(list(_runs(times, merge=0.0))) == len(times)
