"""FLOPs conventions equal their published formulas (and, for megatron_current, Megatron-LM's own)."""

from __future__ import annotations

import pytest

from kilocard.config.schema import ModelConfig, ParallelConfig, RunConfig, TrainerConfig
from kilocard.perf.flops import (
    ModelShape,
    flops_per_iteration,
    megatron_args,
    shape_flops,
    shape_from_model,
)


def _gpt3_175b() -> RunConfig:
    m = ModelConfig(
        num_layers=96,
        hidden_size=12288,
        num_attention_heads=96,
        seq_length=2048,
        max_position_embeddings=2048,
        vocab_size=51200,
    )
    return RunConfig(
        model=m, parallel=ParallelConfig(tensor_model_parallel_size=8), trainer=TrainerConfig(global_batch_size=1536)
    )


def _llama3_70b() -> RunConfig:
    m = ModelConfig(
        num_layers=80,
        hidden_size=8192,
        ffn_hidden_size=28672,
        num_attention_heads=64,
        num_query_groups=8,
        seq_length=8192,
        max_position_embeddings=8192,
        vocab_size=128256,
        gated_linear_unit=True,
        activation="swiglu",
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        normalization="RMSNorm",
        add_bias_linear=False,
    )
    return RunConfig(
        model=m, parallel=ParallelConfig(tensor_model_parallel_size=4), trainer=TrainerConfig(global_batch_size=256)
    )


def _deepseek_v3_like() -> RunConfig:
    m = ModelConfig(
        num_layers=61,
        hidden_size=7168,
        ffn_hidden_size=18432,
        num_attention_heads=128,
        seq_length=4096,
        max_position_embeddings=4096,
        vocab_size=129280,
        gated_linear_unit=True,
        activation="swiglu",
        num_moe_experts=256,
        moe_router_topk=8,
        moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048,
        moe_layer_freq=[0] * 3 + [1] * 58,
        multi_latent_attention=True,
        q_lora_rank=1536,
        kv_lora_rank=512,
        mtp_num_layers=1,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    return RunConfig(model=m, trainer=TrainerConfig(global_batch_size=1024))


def _small_moe_mla() -> RunConfig:
    m = ModelConfig(
        num_layers=4,
        hidden_size=64,
        num_attention_heads=4,
        num_moe_experts=4,
        moe_layer_freq=2,
        mtp_num_layers=2,
        multi_latent_attention=True,
        q_lora_rank=None,
    )
    return RunConfig(model=m)


def _shipped_model(model: str, gbs: int) -> RunConfig:
    """A shipped model file: Qwen3 (qk_layernorm, head_dim 128 wider than hidden / heads; MoE: 128 experts,
    top-8), GPT-OSS-120B (quick-GeGLU experts, a sliding window on every other layer, biases)."""
    import dataclasses

    import yaml

    from kilocard.paths import data_dir

    m = ModelConfig(**yaml.safe_load((data_dir("conf") / "model" / f"{model}.yaml").read_text()))
    return dataclasses.replace(RunConfig(model=m), trainer=TrainerConfig(global_batch_size=gbs))


CASES = [
    RunConfig(),
    _gpt3_175b(),
    _llama3_70b(),
    _deepseek_v3_like(),
    _small_moe_mla(),
    _shipped_model("qwen3_8b", 32),
    _shipped_model("qwen3_30b_a3b", 512),
    _shipped_model("gpt_oss_120b", 512),
]


def test_sc21_equals_eq3():
    rc = _gpt3_175b()
    B, s, l, h, V = 1536, 2048, 96, 12288, 51200
    expected = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    assert flops_per_iteration(rc, "megatron_sc21") == pytest.approx(expected, rel=1e-12)


def test_legacy_equals_pre_2025_formula_with_gqa_and_swiglu():
    rc = _llama3_70b()
    B, s, L, h, n, g, F = 256, 8192, 80, 8192, 64, 8, 28672
    V = 128512  # 128256 padded to a multiple of 128 * TP(4)
    q = 128 * n
    expected = 12 * B * s * L * h**2 * ((1 + g / n + s / h) * (q / h) + (F / h) * 1 * 1.5 + V / (2 * L * h))
    assert flops_per_iteration(rc, "megatron_legacy") == pytest.approx(expected, rel=1e-12)


def test_legacy_moe_counts_topk_and_shared_experts():
    s = ModelShape(
        layers=4,
        hidden=256,
        heads=8,
        query_groups=8,
        kv_channels=32,
        ffn=1024,
        gated=True,
        vocab=1024,
        seq=128,
        moe_layers=(True,) * 4,
        topk=2,
        moe_ffn=512,
        shared_ffn=256,
    )
    h = 256
    expected = (
        12 * 3 * 128 * 4 * h * h * ((1 + 1 + 128 / h) * 1 + (512 / h) * 2 * 1.5 + (256 / h) * 1.5 + 1024 / (2 * 4 * h))
    )
    assert shape_flops(s, 3, "megatron_legacy") == pytest.approx(expected, rel=1e-12)


def test_current_halves_causal_attention_against_legacy():
    """Dense MHA 4h MLP: current = legacy minus half the s² attention term."""
    rc = _gpt3_175b()
    B, s, L, h = 1536, 2048, 96, 12288
    half_attention = 12 * B * s * L * h * h * (s / h) / 2
    assert flops_per_iteration(rc, "megatron_current") == pytest.approx(
        flops_per_iteration(rc, "megatron_legacy") - half_attention, rel=1e-12
    )


def test_six_n_is_6n_plus_attention():
    rc = _llama3_70b()
    shape = shape_from_model(rc.model, 4)
    tokens = 256 * 8192
    n = shape.active_params_no_input_embedding
    assert 69e9 < n < 71e9  # Llama 3 70B without its input embedding (~1.05B)
    expected = 6 * n * tokens + 12 * 80 * 64 * 128 * 8192 * tokens
    assert flops_per_iteration(rc, "six_n") == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("model", ["qwen3_8b", "qwen3_30b_a3b"])
def test_qk_layernorm_counts_only_in_six_n(model):
    """Megatron-LM counts no normalisation (``num_floating_point_operations``): the per-head query and key norms
    change none of its conventions; ``six_n`` counts parameters, and they are 2 x head_dim per layer."""
    import dataclasses

    rc = _shipped_model(model, 8)
    off = dataclasses.replace(rc, model=dataclasses.replace(rc.model, qk_layernorm=False))
    for convention in ("megatron_sc21", "megatron_legacy", "megatron_current"):
        assert flops_per_iteration(rc, convention) == flops_per_iteration(off, convention)
    tokens = 8 * rc.model.seq_length
    added = 6 * tokens * rc.model.num_layers * 2 * rc.model.kv_channels
    assert flops_per_iteration(rc, "six_n") - flops_per_iteration(off, "six_n") == pytest.approx(added, rel=1e-9)


def test_unknown_convention_names_the_valid_ones():
    with pytest.raises(ValueError, match="megatron_current"):
        flops_per_iteration(RunConfig(), "palm")


@pytest.mark.parametrize(
    "rc",
    CASES,
    ids=["tiny", "gpt3_175b", "llama3_70b", "deepseek_v3", "moe_mla_mtp", "qwen3_8b", "qwen3_30b_a3b", "gpt_oss_120b"],
)
def test_current_equals_megatron_lm_num_floating_point_operations(rc, megatron_flops):
    expected = megatron_flops(megatron_args(rc), rc.trainer.global_batch_size)
    assert flops_per_iteration(rc, "megatron_current") == expected


def _take_function(module, relpath: str, name: str) -> None:
    """Define ``name`` in ``module`` from the oracle file ``relpath`` when the loader left it out."""
    import ast
    from typing import Optional

    import oracle

    if hasattr(module, name):
        return
    src = oracle.ORACLE_DIR / relpath
    tree = ast.parse(src.read_text())
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert fn, f"{name} not found in {src}"
    module.__dict__.setdefault("Optional", Optional)
    exec(compile(ast.Module(body=fn, type_ignores=[]), str(src), "exec"), module.__dict__)


@pytest.fixture(scope="module")
def megatron_flops():
    """Megatron-LM's own ``num_floating_point_operations`` from the megatron-core 0.19.2 wheel.

    Two one-line helpers it calls live where the oracle loader does not follow (megatron.core, and
    the ``megatron.training.utils`` package re-export); they are taken from the same wheel the same way.
    """
    import oracle

    module = oracle.load_megatron_training_module("training", only=["num_floating_point_operations"])
    _take_function(
        module, "megatron/core/models/gpt/experimental_attention_variant_module_specs.py", "is_linear_attention_variant"
    )
    _take_function(module, "megatron/training/utils/common_utils.py", "is_hybrid_model")
    return module.num_floating_point_operations


def _random_run_config(draw) -> RunConfig:
    from hypothesis import strategies as st

    heads = draw(st.sampled_from([4, 8, 16, 32]))
    groups = draw(st.sampled_from([None] + [g for g in (1, 2, 4, 8) if heads % g == 0]))
    layers = draw(st.integers(1, 12))
    experts = draw(st.sampled_from([None, 4, 8]))
    mla = draw(st.booleans())
    freq = draw(st.one_of(st.integers(1, 3), st.lists(st.integers(0, 1), min_size=layers, max_size=layers)))
    m = ModelConfig(
        num_layers=layers,
        hidden_size=heads * draw(st.sampled_from([16, 32, 64])),
        num_attention_heads=heads,
        num_query_groups=None if mla else groups,
        kv_channels=draw(st.sampled_from([None, 24, 48])),
        ffn_hidden_size=draw(st.sampled_from([None, 96, 200])),
        seq_length=draw(st.sampled_from([16, 128, 1000])),
        vocab_size=draw(st.integers(50, 5000)),
        gated_linear_unit=draw(st.booleans()),
        activation=draw(st.sampled_from(["gelu", "swiglu", "quick_gelu"])),
        window_size=draw(st.sampled_from([None, [8, 0], [2000, 0]])),
        num_moe_experts=experts,
        moe_router_topk=draw(st.integers(1, 2)),
        moe_layer_freq=freq,
        moe_ffn_hidden_size=draw(st.sampled_from([None, 40])),
        moe_shared_expert_intermediate_size=draw(st.sampled_from([None, 64])),
        multi_latent_attention=mla,
        q_lora_rank=draw(st.sampled_from([None, 32])),
        kv_lora_rank=16,
        qk_head_dim=draw(st.sampled_from([8, 16])),
        qk_pos_emb_head_dim=8,
        v_head_dim=draw(st.sampled_from([8, 16])),
        mtp_num_layers=draw(st.sampled_from([None, 1, 2])),
        qk_layernorm=draw(st.booleans()),
    )
    par = ParallelConfig(tensor_model_parallel_size=draw(st.sampled_from([1, 2, 4])))
    return RunConfig(model=m, parallel=par, trainer=TrainerConfig(global_batch_size=draw(st.integers(1, 64))))


def test_current_equals_megatron_lm_on_random_models(megatron_flops):
    """150 random dense/GQA/MoE (int and list patterns)/MLA/MTP models: equal to the last bit."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=150, deadline=None, database=None)
    @given(st.data())
    def check(data):
        rc = _random_run_config(data.draw)
        assert flops_per_iteration(rc, "megatron_current") == megatron_flops(
            megatron_args(rc), rc.trainer.global_batch_size
        )

    check()


def test_megatron_counts_take_gpt_oss_quick_geglu_as_two_matrices():
    """Megatron-LM parses GPT-OSS's ``--quick-geglu`` with ``args.swiglu`` False, and both its counts give the
    gated MLP's third matrix only under ``args.swiglu``: the experts count as two matrices, a SwiGLU twin's as three."""
    import dataclasses

    rc = _shipped_model("gpt_oss_120b", 1)
    args = megatron_args(rc)
    assert (args.swiglu, args.quick_geglu) == (False, True)
    swiglu = dataclasses.replace(rc, model=dataclasses.replace(rc.model, activation="swiglu"))
    m, tokens = rc.model, rc.model.seq_length
    third_matrix = 6 * m.hidden_size * m.moe_ffn_hidden_size * m.moe_router_topk * m.num_layers * tokens
    for convention in ("megatron_legacy", "megatron_current"):
        assert flops_per_iteration(swiglu, convention) - flops_per_iteration(rc, convention) == pytest.approx(
            third_matrix, rel=1e-12
        )


def test_megatron_counts_ignore_the_sliding_window():
    """No Megatron-LM count knows a window: every layer's core is counted over the whole causal sequence."""
    import dataclasses

    rc = _shipped_model("gpt_oss_120b", 4)
    full = dataclasses.replace(rc, model=dataclasses.replace(rc.model, window_size=None, window_attn_skip_freq=None))
    for convention in ("megatron_sc21", "megatron_legacy", "megatron_current", "six_n"):
        assert flops_per_iteration(rc, convention) == flops_per_iteration(full, convention)


GPT_OSS_ROWS = (
    *(f"bridge2511-{gpu}-gptoss-120b-bf16" for gpu in ("h100", "b200", "gb200")),
    "bridge260401-b200-gptoss-120b-bf16",
)


@pytest.mark.parametrize("row_id", GPT_OSS_ROWS)
def test_gpt_oss_rows_reproduce_their_published_flops_per_token(row_id):
    """Megatron-Bridge 25.11 and 26.04.01 publish TFLOP/s and tokens/s per GPU; their ratio is its count's FLOPs
    per token (27.2 G at 4096 tokens, 30.7 G at 8192), and the row's convention gives it within 1%. Counting the
    experts' third matrix (as the kernels run them) would miss by more than 15%."""
    import dataclasses

    from kilocard.calibration.baselines import flops_per_token, load_rows, row_run_config

    (row,) = [r for r in load_rows() if r.id == row_id]
    res, cfg = row.raw["result"], row_run_config(row)
    published = res["tflops_per_gpu"] * 1e12 / res["tokens_per_s_per_gpu"]
    ours = flops_per_token(cfg, row.raw["flops_convention"])
    assert ours == pytest.approx(published, rel=0.01)
    gated = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, activation="swiglu"))
    assert flops_per_token(gated, row.raw["flops_convention"]) > 1.15 * published


def test_attended_keys_count_the_window_band_and_the_full_sequence_beyond_it():
    """Keys per query: s/2 under the causal mask; W(1 - W/2s) with W = window + 1 on the windowed layers; the
    full count again once the window spans the sequence."""
    import dataclasses

    rc = _shipped_model("gpt_oss_120b", 1)
    shape = shape_from_model(rc.model)
    s, w = 4096, 129
    assert (shape.window, shape.windowed_layers, shape.layers) == (128, 18, 36)
    assert shape.attended_keys == pytest.approx((18 * s / 2 + 18 * w * (1 - w / (2 * s))) / 36, rel=1e-12)
    for window in (s - 1, s, 10 * s):
        wide = dataclasses.replace(rc.model, window_size=[window, 0])
        assert shape_from_model(wide).attended_keys == s / 2
    every = dataclasses.replace(rc.model, window_attn_skip_freq=None)
    assert shape_from_model(every).windowed_layers == 36
    listed = dataclasses.replace(rc.model, window_attn_skip_freq=[1, 0, 0] * 12)
    assert shape_from_model(listed).windowed_layers == 12
    assert shape_from_model(dataclasses.replace(rc.model, window_size=None)).attended_keys == s / 2
