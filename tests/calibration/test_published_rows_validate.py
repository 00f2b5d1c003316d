"""Every scored published layout really ran: converted by ``row_run_config`` it validates with no error, its
memory estimate fits, and the performance model predicts the very configuration the validator checks."""

from __future__ import annotations

from collections import Counter

import pytest

from kilocard.calibration.baselines import load_rows, row_inputs, row_run_config
from kilocard.validate import ERROR, WARNING, validate

ROWS = [r for r in load_rows() if r.complete]

#: The warnings a published row may get, with why they do not make it wrong: the rows run on DGX-style
#: clusters that kilocard's local launcher and default environment do not describe, and ran software
#: (Megatron-FSDP) that kilocard's trainer does not build; a tight estimate is shown, not refused.
ALLOWED_WARNINGS = {
    "LOCAL_MULTI_NODE": "the RunConfig's default launcher is the local one; the rows ran on Slurm clusters",
    "LOCAL_NPROC": "the same default launcher with its one process",
    "CUDA_DEVICE_MAX_CONNECTIONS": "the rows' environment is not part of the row",
    "EP_CROSSES_NODES": "the published layout spans nodes with its expert groups, as it ran",
    "STAGE_CROSSES_NODES": "the published layout spans nodes with its pipeline stages, as it ran",
    "MEGATRON_FSDP_NOT_BUILT": "the row ran Megatron-FSDP (or FSDP2); kilocard's trainer does not build it",
    "MEMORY_TIGHT": "the estimate is above 90% of HBM: listed so that a row close to the limit is visible",
    "HANG_TIMEOUT_SAVE": "the rows state no hang timeout or file system: the default ones meet a large checkpoint",
}


@pytest.fixture(scope="module")
def reports():
    return {r.id: validate(row_run_config(r)) for r in ROWS}


def test_every_scored_row_validates_with_no_error(reports):
    assert len(reports) == len(ROWS) >= 130
    errors = {rid: [(i.code, i.message) for i in rep.issues if i.severity == ERROR] for rid, rep in reports.items()}
    assert not {k: v for k, v in errors.items() if v}


def test_warnings_are_the_listed_ones(reports):
    seen = Counter(i.code for rep in reports.values() for i in rep.issues if i.severity == WARNING)
    print("warnings over the scored rows:", dict(seen))
    assert set(seen) <= set(ALLOWED_WARNINGS), set(seen) - set(ALLOWED_WARNINGS)


def test_every_estimate_fits_its_gpu(reports):
    for rid, rep in reports.items():
        est = rep.estimates
        assert est.memory is not None and est.hbm_usable_bytes, rid
        assert est.memory.total <= est.hbm_usable_bytes, rid


def test_the_performance_model_predicts_the_layout_the_validator_checks(reports):
    for r in ROWS:
        inputs = row_inputs(r, str(r.raw["flops_convention"]))
        assert inputs.layout == reports[r.id].layout, r.id
        assert inputs.layout.stage_layers is not None and sum(inputs.layout.stage_layers) == r.raw["model"]["layers"]


def test_baselines_prints_each_rows_estimate_against_its_gpus_memory(reports):
    from kilocard.calibration.baselines import compare_row
    from kilocard.commands.baselines import render_json, render_text

    comps = [compare_row(r, {}) for r in ROWS]
    for c in comps:  # the validator's estimate, not a second computation
        assert c.mem_bytes == reports[c.id].estimates.memory.total and c.hbm_bytes == reports[c.id].estimates.hbm_bytes
    text = render_text(comps)
    tight = max(comps, key=lambda c: c.mem_bytes / c.hbm_bytes)
    assert "mem GiB / HBM GiB" in text.splitlines()[0]
    assert f"{tight.mem_bytes / 2**30:.1f} / {tight.hbm_bytes / 2**30:.1f}" in text
    assert f"({tight.id}) over {len(ROWS)} rows" in text
    assert '"mem_bytes"' in render_json(comps)
