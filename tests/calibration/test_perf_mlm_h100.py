"""Megatron-LM's own H100 scaling table (README at 937571cf): its rows in baselines/published.yaml, the
``mlm_h100`` recipes that run them, and how the step-time model reproduces the series.

The model is judged on the published figures it predicts in sample and, for the whole file, on each
source left out of the fit (the stored fold fits ``kilocard baselines`` quotes)."""

from __future__ import annotations

import statistics

import pytest

from kilocard.calibration.baselines import baselines_file, compare_all, load_rows
from kilocard.calibration.crossval import load_fold_fits, source_group
from kilocard.calibration.fit import targets
from kilocard.calibration.series import series_checks
from kilocard.calibration.trust import stored_held_out
from kilocard.cli import main

SOURCE = "Megatron-LM README at 937571cf"
"""The source group of every row of the table and the strong-scaling figure."""

WEAK = {"1-7b", "7-1b", "16b", "32b", "70b", "119b", "177b", "314b", "462b"}
"""The weak-scaling table's rows (ids ``mlm-h100-<size>``)."""

KNOWN_OFF = {
    "mlm-h100-32b": "TP8, PP1, DP48 at 4 micro-batches of one sequence: its fp32 gradient reduce-scatter of "
    "3.9 B parameters per GPU crosses one 400 Gb/s NIC per GPU (about 0.33 s) and can hide only behind the "
    "last micro-batch's backward (about 0.15 s), yet the published step (0.89 s) leaves no room for it "
    "(docs/perf_model.md, 'Megatron-LM's H100 table')",
    "mlm-h100-16b": "TP4, PP1: 7.8% slow, 0.8 point beyond the band; the table's PP1 rows are predicted slower "
    "the wider their TP (TP1 +0%, TP2 +3%, TP4 -8%, TP8 -28%): TP collectives and the per-layer overhead the "
    "fit charges every layer pass weigh more at TP4 and TP8 than these runs show",
}
"""Rows of the table the model does not reproduce within 3 MFU points, with the reason."""


@pytest.fixture(scope="module")
def comparisons():
    return {c.id: c for c in compare_all(recipes={})}


def mfu_points(c) -> tuple[float, float]:
    return 100 * c.published_mfu, 100 * c.predicted_mfu


def test_the_table_and_the_figure_are_rows_of_one_source():
    rows = [r for r in load_rows() if r.id.startswith("mlm-h100-")]
    assert {r.id for r in rows if r.raw.get("series") == "mlm-h100-weak"} == {f"mlm-h100-{s}" for s in WEAK}
    strong = sorted(r.raw["gpus"] for r in rows if r.raw.get("series") == "mlm-h100-177b-strong")
    assert strong == [96, 144, 288, 576, 1152, 3072, 4608]
    assert {source_group(r) for r in rows} == {SOURCE}
    assert all(r.complete for r in rows), [r.id for r in rows if not r.complete]


@pytest.mark.parametrize("size", sorted(WEAK))
def test_each_weak_scaling_row_within_three_mfu_points(size, comparisons):
    rid = f"mlm-h100-{size}"
    published, predicted = mfu_points(comparisons[rid])
    within = abs(predicted - published) <= 3.0
    if rid in KNOWN_OFF:
        assert not within, f"{rid} is now within 3 points ({published:.1f} vs {predicted:.1f}): drop it from KNOWN_OFF"
        pytest.xfail(KNOWN_OFF[rid])
    assert within, (published, predicted)


def test_the_32b_row_is_off_for_the_stated_reason(comparisons):
    """The row furthest off is off mostly because of its data-parallel collectives: the exposed share of its
    step is the largest of the table's, and without it two thirds of the gap would close."""
    from kilocard.calibration.baselines import row_run_config
    from kilocard.perf.predict import predict

    rows = {r.id: r for r in load_rows() if r.id.startswith("mlm-h100-") and r.raw.get("series") == "mlm-h100-weak"}
    share = {}
    for rid, row in rows.items():
        p = predict(row_run_config(row), convention="megatron_legacy")
        share[rid] = p.breakdown["dp_comm"] / p.step_time_s
    assert max(share, key=share.get) == "mlm-h100-32b"
    row = rows["mlm-h100-32b"]
    p = predict(row_run_config(row), convention="megatron_legacy")
    without = p.tflops_per_gpu * p.step_time_s / (p.step_time_s - p.breakdown["dp_comm"])
    published = comparisons["mlm-h100-32b"].published_tflops_per_gpu
    assert published - without <= (published - p.tflops_per_gpu) / 3, (published, without, p.tflops_per_gpu)


def test_strong_scaling_drop_within_two_mfu_points(comparisons):
    """96 to 4,608 GPUs at batch 1152: published 47% -> 42%."""
    first, last = comparisons["mlm-h100-177b-strong-96"], comparisons["mlm-h100-177b-strong-4608"]
    published = 100 * (last.published_mfu - first.published_mfu)
    predicted = 100 * (last.predicted_mfu - first.predicted_mfu)
    assert published == pytest.approx(-5.0)
    assert predicted < 0 and abs(predicted - published) <= 2.0, (published, predicted)


KNOWN_SERIES_OFF = {
    "dgxc2501-llama31-405b-fp8": "576 -> 2304 GPUs loses 3.8 MFU points at a fixed per-GPU load; nothing in the "
    "model grows with DP there but the slowest-GPU wait (1.5% spread) and the DP bucket",
    "dgxc2501-nemotron4-340b-fp8": "128 -> 2048 GPUs loses 3.3 MFU points at a fixed per-GPU load, the same "
    "as above; its BF16 twin's 2.2 points are met",
}
"""Published series whose MFU change the model misses by more than 3 points, with the reason."""


def test_every_series_meets_its_published_trend():
    checks = series_checks(load_rows(), list(compare_all(recipes={})))
    off = {c.name for c in checks if not c.ok}
    assert off == set(KNOWN_SERIES_OFF), {c.name: (c.published_mfu_change, c.predicted_mfu_change) for c in checks}
    assert len(checks) >= 19


@pytest.fixture(scope="module")
def held_out():
    """Each scored row's held-out error under its source's stored fold fit (what plan and validate quote)."""
    scored = targets([r for r in load_rows() if r.complete])
    held = stored_held_out(scored, load_fold_fits(baselines_file()))
    assert len(held) == len(scored)  # every source has a current fold fit
    return [(source_group(t.row), abs(e)) for t, e in held]


@pytest.mark.xfail(
    strict=True,
    reason="not met by the seventh round: held out 6.5% mean / 29.9% max over 130 rows (6.3% / 29.9% on the 114 "
    "rows before the table), against the sixth round's 5.1% / 23.5%: stating the slowest-GPU spread (1.5%, "
    "measured) instead of fitting it to its 5% bound took away what carried the large runs "
    "(docs/perf_model.md, 'Megatron-LM's H100 table')",
)
def test_leave_one_source_out_is_no_worse_than_before_the_table(held_out):
    """The whole file's held-out mean and max no worse than before the table became rows (5.1%, 23.5%)."""
    errors = [e for _, e in held_out]
    assert statistics.fmean(errors) <= 0.051 and max(errors) <= 0.235, (statistics.fmean(errors), max(errors))


@pytest.mark.xfail(
    strict=True,
    reason="not met: the table held out is predicted 7.8% mean (a fit on the other sources is fast on it, "
    "+5 to +10% on the PP > 1 rows)",
)
def test_the_table_held_out_within_six_percent(held_out):
    table = [e for g, e in held_out if g == SOURCE]
    assert len(table) == 16 and statistics.fmean(table) <= 0.06, statistics.fmean(table)


def test_the_band_grows_with_scale_and_names_its_sources(held_out, capsys):
    """validate quotes the held-out error of the run's GPU-count class: the 462B row's class (more than
    1,024 GPUs) is the table's and the Llama 3 paper's, among others."""
    assert main(["validate", "recipe=mlm_h100_462b", "--skip-path-checks"]) in (0, 1)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "at more than 1,024 GPUs:" in line)
    assert "rows from" in line and "sources, mean" in line


def test_recipes_list_the_family_with_published_figures(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("mlm_h100_")]
    assert len(lines) == 16
    line = next(line for line in lines if line.startswith("mlm_h100_462b "))
    assert "6144" in line and "mlm-h100-462b" in line
