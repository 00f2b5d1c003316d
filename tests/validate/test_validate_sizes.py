"""Validation time does not depend on layer count or other sizes: nothing walks the layers one by one."""

from __future__ import annotations

import time

import pytest

from kilocard.config.schema import ModelConfig
from kilocard.perf.params import MoePattern, count_parameters, moe_count, moe_layer_pattern
from kilocard.validate import validate
from run_configs import cfg_of

LIMIT_S = 5.0
"""What one validation may take for any size (measured here: about 0.02 s at 10**8 layers; 5 s and more
before, growing with the layer count, and no answer within 60 s at 10**8)."""


@pytest.mark.parametrize(
    "values",
    [
        {"model.num_layers": 10**8},
        {"model.num_layers": 10**8, "model.num_moe_experts": 4, "model.moe_router_topk": 1, "model.moe_layer_freq": 3},
        {"model.num_layers": 10**8, "model.hidden_size": 2**40, "model.num_attention_heads": 2**20},
        {"model.num_layers": 10**8, "model.seq_length": 2**40, "model.max_position_embeddings": 2**40},
    ],
    ids=["layers", "moe-layers", "width", "sequence"],
)
def test_validation_of_any_size_answers_within_seconds(values):
    cfg = cfg_of(values)
    t0 = time.monotonic()
    report = validate(cfg)
    took = time.monotonic() - t0
    assert took < LIMIT_S, f"validate took {took:.1f}s"
    assert not report.valid  # such a model fits no GPU: refused, with its estimates


@pytest.mark.parametrize("layers,freq", [(1, 1), (7, 1), (7, 2), (10, 3), (12, 4), (5, 9)])
def test_the_counted_moe_pattern_equals_the_walked_one(layers, freq):
    m = ModelConfig(num_layers=layers, num_moe_experts=4, moe_router_topk=1, moe_layer_freq=freq)
    pattern = moe_layer_pattern(m)
    walked = [i % freq == 0 for i in range(layers)]
    assert isinstance(pattern, MoePattern) and list(pattern) == walked and len(pattern) == layers
    assert moe_count(pattern) == sum(walked) and pattern[-1] == walked[-1]
    for a in range(layers + 1):
        for b in range(a, layers + 1):
            assert moe_count(pattern[a:b]) == sum(walked[a:b]), (a, b)


def test_parameters_counted_without_the_walk_equal_the_per_layer_sum():
    m = ModelConfig(num_layers=10, num_moe_experts=4, moe_router_topk=2, moe_layer_freq=3, hidden_size=64)
    dense = ModelConfig(num_layers=10, hidden_size=64)
    listed = ModelConfig(
        num_layers=10, num_moe_experts=4, moe_router_topk=2, moe_layer_freq=[1, 0, 0] * 3 + [1], hidden_size=64
    )
    assert count_parameters(m) == count_parameters(listed)  # the int form and its list form agree
    per_dense_layer = (
        count_parameters(dense).total - count_parameters(ModelConfig(num_layers=0, hidden_size=64)).total
    ) / 10
    assert count_parameters(m).total > count_parameters(dense).total and per_dense_layer > 0
