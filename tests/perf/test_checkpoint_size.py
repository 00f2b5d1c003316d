"""One checkpoint size: the USR1-lead check and the Young/Daly interval size the same checkpoint."""

from __future__ import annotations

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.perf import goodput
from kilocard.perf.memory import bytes_per_param, checkpoint_bytes
from kilocard.perf.params import count_parameters
from kilocard.validate import slurm as checks

PRECISIONS = [
    ["precision=bf16"],
    ["precision=fp32"],
    ["precision=fp16", "optim.optimizer=sgd"],
    ["precision=fp8", "precision.fp8_param=true", "parallel.use_distributed_optimizer=true"],
]


@pytest.mark.parametrize("over", PRECISIONS, ids=["bf16", "fp32", "fp16_sgd", "fp8_param"])
def test_usr1_lead_and_young_daly_use_the_same_checkpoint_size(over):
    cfg = to_run_config(compose(["recipe=llama3_8b", "checkpoint.async_save=false", *over]))
    bpp = bytes_per_param(cfg)
    assert checkpoint_bytes(cfg) == int(count_parameters(cfg.model).total * (bpp.weight + bpp.optim))
    assert checks.expected_save_time_s(cfg) == pytest.approx(goodput.save_time_s(cfg), rel=1e-12)


def test_checkpoint_size_follows_the_precision():
    """bf16 Adam: 2 (weight) + 4 (master) + 8 (moments) = 14 B/param; fp32 Adam: 4 + 8 = 12."""
    bf16 = to_run_config(compose(["recipe=llama3_8b", "precision=bf16"]))
    fp32 = to_run_config(compose(["recipe=llama3_8b", "precision=fp32"]))
    n = count_parameters(bf16.model).total
    assert (checkpoint_bytes(bf16), checkpoint_bytes(fp32)) == (14 * n, 12 * n)
