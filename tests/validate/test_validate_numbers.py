"""Numbers Megatron-Core or the trainer cannot use are refused before launch (issue 12, item 12).

nan/inf rates, times and bandwidths; a negative or too large seed; a decay that ends above its peak
(Megatron-Core's OptimizerParamScheduler asserts max_lr >= min_lr); more samples than the dataset
index can hold (the iterator build used to hang until the hang guard killed the run).
"""

from __future__ import annotations

import json
import math

import pytest

from kilocard.validate import validate
from kilocard.validate.inputs import MAX_TRAIN_SAMPLES
from run_configs import cfg_of

SLURM = {"launcher.kind": "slurm", "launcher.time": "04:00:00", "launcher.signal_lead_s": 300}
NAN, INF = math.nan, math.inf

CASES = [
    # bad values, the code, the field it names
    ({"optim.lr": NAN}, "NOT_FINITE", "optim.lr"),
    ({"optim.lr": INF}, "NOT_FINITE", "optim.lr"),
    ({"optim.min_lr": NAN}, "NOT_FINITE", "optim.min_lr"),
    ({"optim.min_lr": -INF}, "NOT_FINITE", "optim.min_lr"),
    ({"optim.clip_grad": NAN}, "NOT_FINITE", "optim.clip_grad"),
    ({"optim.clip_grad": INF}, "NOT_FINITE", "optim.clip_grad"),
    ({"trainer.hang_timeout_s": NAN}, "NOT_FINITE", "trainer.hang_timeout_s"),
    ({"trainer.hang_timeout_s": INF}, "NOT_FINITE", "trainer.hang_timeout_s"),
    ({**SLURM, "checkpoint.expected_save_time_s": NAN}, "NOT_FINITE", "checkpoint.expected_save_time_s"),
    ({**SLURM, "checkpoint.expected_save_time_s": INF}, "NOT_FINITE", "checkpoint.expected_save_time_s"),
    ({**SLURM, "cluster.fs_write_bandwidth_gbs": NAN}, "NOT_FINITE", "cluster.fs_write_bandwidth_gbs"),
    ({**SLURM, "cluster.fs_write_bandwidth_gbs": INF}, "NOT_FINITE", "cluster.fs_write_bandwidth_gbs"),
    ({"trainer.seed": -1}, "OUT_OF_RANGE", "trainer.seed"),
    ({"trainer.seed": 2**32}, "OUT_OF_RANGE", "trainer.seed"),
    ({"data.random_seed": -5}, "OUT_OF_RANGE", "data.random_seed"),
    ({"optim.lr": 1e-4, "optim.min_lr": 1e-3}, "LR_ORDER", "optim.min_lr"),
    (
        {"trainer.train_iters": MAX_TRAIN_SAMPLES // 8 + 1, "trainer.global_batch_size": 8},
        "TRAIN_SAMPLES",
        "trainer.train_iters",
    ),
    ({"trainer.train_iters": 2**62}, "OUT_OF_RANGE", "trainer.train_iters"),
]


@pytest.mark.parametrize(("values", "code", "field"), CASES, ids=[f"{c[2]}={c[0][c[2]]}" for c in CASES])
def test_unusable_number_is_one_error_naming_the_field(values, code, field):
    report = validate(cfg_of(values))
    assert [(i.code, i.field) for i in report.errors] == [(code, field)], report.errors
    json.dumps(report.to_dict(), allow_nan=False)  # `validate --format json` stays valid JSON (no bare NaN)


@pytest.mark.parametrize(
    "values",
    [
        {"trainer.seed": 0},
        {"trainer.seed": 2**32 - 1},
        {"optim.lr": 1e-3, "optim.min_lr": 1e-3},
        {"trainer.train_iters": MAX_TRAIN_SAMPLES // 8, "trainer.global_batch_size": 8},
    ],
)
def test_limits_themselves_are_accepted(values):
    assert validate(cfg_of(values)).errors == []
