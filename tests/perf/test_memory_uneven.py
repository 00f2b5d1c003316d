"""Uneven pipeline splits: the heaviest stage, not the first, decides the memory estimate."""

from kilocard.config.compose import compose, to_run_config
from kilocard.layout import compute_layout
from kilocard.perf.memory import estimate_memory

GIB = 2**30


def _cfg(*overrides):
    return to_run_config(compose(["recipe=deepseek_v3", *overrides]))


def test_middle_stages_count_when_they_hold_more_layers():
    """DeepSeek-V3 at PP4 as [4, 28, 28, 1]: the 28-layer middle stages dominate."""
    cfg = _cfg(
        "parallel.pipeline_model_parallel_size=4",
        "parallel.num_layers_in_first_pipeline_stage=4",
        "parallel.num_layers_in_last_pipeline_stage=1",
    )
    assert compute_layout(cfg).stage_layers == [4, 28, 28, 1]
    est = estimate_memory(cfg)
    # 28 MoE layers: 28 * 256 experts * 3 * 7168 * 2048 / EP64 ~ 2.4e9 routed params alone.
    assert est.params_on_stage > 2.4e9
    even_first_only = _cfg()  # the recipe's own 4-layer stages
    assert est.weights > 3 * estimate_memory(even_first_only).weights


def test_activation_layers_follow_the_heaviest_stage():
    """Stage i keeps PP - i micro-batches in flight: [4, 28, 28, 1] peaks at 28 x 3 = 84 layer
    activations (stage 1), more than [16, 16, 16, 13] at 16 x 4 = 64 (stage 0)."""
    heavy = _cfg(
        "parallel.pipeline_model_parallel_size=4",
        "parallel.num_layers_in_first_pipeline_stage=4",
        "parallel.num_layers_in_last_pipeline_stage=1",
    )
    light = _cfg(
        "parallel.pipeline_model_parallel_size=4",
        "parallel.num_layers_in_first_pipeline_stage=16",
        "parallel.num_layers_in_last_pipeline_stage=13",
    )
    assert estimate_memory(heavy).activations > estimate_memory(light).activations * 1.2
    assert estimate_memory(heavy).activations > 20 * GIB
