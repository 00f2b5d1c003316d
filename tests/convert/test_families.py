"""The family registry (``kilocard.convert.families``): one family per ``model_type``, found by ``config.json`` and,
for an export with no recorded source, by the model itself; each family's weight map names every tensor once."""

from __future__ import annotations

import pytest

from kilocard.config.schema import ModelConfig
from kilocard.convert import families
from kilocard.convert.families.deepseek_v3 import DeepseekV3, yarn_parameters
from kilocard.convert.spec import ConvertError

DENSE = dict(normalization="RMSNorm", activation="swiglu", add_bias_linear=False, position_embedding_type="rope")
DEEPSEEK = dict(
    multi_latent_attention=True, qk_layernorm=True, rope_type="rope", q_lora_rank=16, num_moe_experts=4,
    moe_ffn_hidden_size=32, moe_shared_expert_intermediate_size=32, moe_router_score_function="sigmoid",
    moe_router_enable_expert_bias=True,
)  # fmt: skip
"""A DeepSeek-V3 model (on ``DENSE``'s shape): MLA with its latent norms, sigmoid routing with the expert bias."""
GPT_OSS = dict(
    normalization="RMSNorm", gated_linear_unit=True, activation="quick_gelu", glu_linear_offset=1.0,
    activation_func_clamp_value=7.0, add_bias_linear=True, position_embedding_type="rope", softmax_type="learnable",
    num_moe_experts=4, moe_ffn_hidden_size=32, window_size=[7, 0], window_attn_skip_freq=2,
)  # fmt: skip
"""A GPT-OSS model: biases, sinks, clamped SwiGLU experts, a window on every other layer."""


def test_every_family_is_found_by_its_model_type_and_names_its_architecture():
    for f in families.FAMILIES:
        assert families.of_config({"model_type": f.model_type}) is f
        assert f.architecture.endswith("ForCausalLM") and f.base_recipe.startswith("tiny_")
    assert len(families.BY_TYPE) == len(families.FAMILIES)


def test_an_unknown_model_type_is_refused_naming_the_known_ones():
    with pytest.raises(
        ConvertError, match=r"model_type 'gemma' is not supported \(expected one of deepseek_v3, gpt_oss, kimi_k2, "
    ):
        families.of_config({"model_type": "gemma"})


@pytest.mark.parametrize(
    ("changes", "family"),
    [
        ({}, "llama"),
        ({"add_qkv_bias": True}, "qwen2"),
        ({"num_moe_experts": 4}, "mixtral"),
        ({"qk_layernorm": True}, "qwen3"),
        ({"qk_layernorm": True, "num_moe_experts": 4}, "qwen3_moe"),
        ({**DEEPSEEK, "moe_layer_freq": [0, 1]}, "deepseek_v3"),
        ({**GPT_OSS, "normalization": "RMSNorm"}, "gpt_oss"),
    ],
)
def test_a_model_with_no_recorded_source_exports_as_the_family_that_claims_it(changes, family):
    m = ModelConfig(**{**DENSE, **changes})
    assert families.of_model(m).model_type == family
    families.get(family).check_model(m)  # and that family can hold it


def family_example(f: families.Family) -> ModelConfig:
    """A model the family can hold: ``DENSE`` with its features."""
    if isinstance(f, DeepseekV3):  # and Kimi-K2, its own model_type
        return ModelConfig(**{**DENSE, **DEEPSEEK, "moe_layer_freq": [0, 1]})
    if f.model_type == "gpt_oss":
        return ModelConfig(**GPT_OSS, num_query_groups=2)
    features = dict(add_qkv_bias=f.qkv_bias, qk_layernorm=f.qk_norm, num_moe_experts=2 if f.moe else None)
    return ModelConfig(**DENSE, num_query_groups=2, **features)


def test_each_tensor_of_a_family_has_one_slot():
    for f in families.FAMILIES:
        m = family_example(f)
        f.check_model(m)
        names = [s.hf for i in range(m.num_layers) for s in f.layer_slots(m, i)]
        assert len(names) == len(set(names)), f.model_type


@pytest.mark.parametrize(
    ("field", "value"),
    [("moe_router_enable_expert_bias", True), ("moe_router_topk_scaling_factor", 2.5), ("moe_router_num_groups", 2)],
)
def test_a_router_the_softmax_families_have_no_place_for_is_refused(field, value):
    for family in ("mixtral", "qwen3_moe"):
        f = families.get(family)
        m = ModelConfig(**DENSE, qk_layernorm=f.qk_norm, num_moe_experts=4, **{field: value})
        with pytest.raises(ConvertError, match=f"model.{field}: {value!r} has no {family} Hugging Face equivalent"):
            f.check_model(m)


@pytest.mark.integration  # torch tensors
def test_gpt_oss_experts_are_transposed_and_their_gate_up_columns_interleaved():
    """transformers' ``gate_up_proj[e]`` [H, 2F] holds gate in its even columns and up in its odd ones, ``down_proj[e]``
    is [F, H]: expert e's ``linear_fc1`` is ``[gate; up]`` of the transposes, ``linear_fc2`` the transpose; and back."""
    import torch

    from kilocard.convert import maps

    m = family_example(families.get("gpt_oss"))
    slots = {s.hf.rsplit(".", 1)[-1]: s for s in families.get("gpt_oss").mlp_slots(m, "l.", "t.")}
    h, f = m.hidden_size, m.moe_ffn_hidden_size
    shapes = {"linear_fc1.weight": (2 * f, h), "linear_fc1.bias": (2 * f,), "linear_fc2.weight": (h, f)}
    sd = {f"t.mlp.experts.local_experts.{e}.{k}": torch.zeros(v) for e in range(4) for k, v in shapes.items()}
    sd |= {f"t.mlp.experts.local_experts.{e}.linear_fc2.bias": torch.zeros(h) for e in range(4)}
    sd |= {"t.mlp.router.weight": torch.zeros(4, h), "t.mlp.router.bias": torch.zeros(4)}
    hf = {k: torch.randn(s.shape) for k, s in slots.items()}
    for k, s in slots.items():
        maps.put(sd, s, m, hf[k])
    w, b, down = hf["gate_up_proj"][2], hf["gate_up_proj_bias"][2], hf["down_proj"][2]
    expert = "t.mlp.experts.local_experts.2."
    assert torch.equal(sd[expert + "linear_fc1.weight"], torch.cat([w[:, ::2].t(), w[:, 1::2].t()]))
    assert torch.equal(sd[expert + "linear_fc1.bias"], torch.cat([b[::2], b[1::2]]))
    assert torch.equal(sd[expert + "linear_fc2.weight"], down.t())
    assert all(torch.equal(maps.take(sd, s, m), hf[k]) for k, s in slots.items())


YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 40.0, "original_max_position_embeddings": 4096.0,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip
"""DeepSeek-V3's ``rope_scaling`` (as ``maps.normalized`` gives it: numbers as floats)."""


def test_yarn_takes_transformers_defaults_and_refuses_what_megatron_core_cannot_hold():
    assert yarn_parameters(YARN, 163840)["original_max_position_embeddings"] == 4096
    bare = yarn_parameters({"rope_type": "yarn", "original_max_position_embeddings": 4096.0, "mscale": 0.5}, 163840)
    assert (bare["factor"], bare["beta_fast"], bare["beta_slow"]) == (40.0, 32.0, 1.0)  # 163840 / 4096
    assert (bare["mscale"], bare["mscale_all_dim"]) == (1.0, 0.0)  # transformers ignores mscale alone
    refused = [
        ({"truncate": False}, "rope_parameters.truncate is False"),
        ({"attention_factor": 1.2}, "rope_parameters.attention_factor is 1.2"),
        ({"mscale": None}, "rope_parameters.mscale is None"),
        ({"original_max_position_embeddings": 4096.5}, "expected a whole number"),
    ]
    for change, message in refused:
        with pytest.raises(ConvertError, match=message):
            yarn_parameters({**YARN, **change}, 163840)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_type": "rope", "rotary_scaling_factor": 40.0, "mscale_all_dim": 1.0}, "model.mscale_all_dim: 1.0"),
        ({"rope_type": "yarn", "mscale": 0.7, "mscale_all_dim": 0.0}, "model.mscale: 0.7 with mscale_all_dim 0.0"),
    ],
)
def test_rope_settings_transformers_would_attend_differently_with_are_refused(changes, message):
    m = ModelConfig(**{**DENSE, **DEEPSEEK, "moe_layer_freq": [0, 1], **changes})
    with pytest.raises(ConvertError, match=message):
        families.get("deepseek_v3").check_model(m)


def test_kimi_k2_is_found_by_its_model_type_and_never_claims_a_model():
    m = ModelConfig(**{**DENSE, **DEEPSEEK, "moe_layer_freq": [0, 1]})
    kimi = families.of_config({"model_type": "kimi_k2"})
    assert kimi.architecture == "DeepseekV3ForCausalLM" and families.of_model(m).model_type == "deepseek_v3"
    assert kimi.export_extras(m)["model_type"] == "deepseek_v3"


DEEPSEEK_V3_JSON = {
    "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "intermediate_size": 18432,
    "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "hidden_act": "silu", "rope_theta": 10000, "attention_bias": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "max_position_embeddings": 163840, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048, "n_shared_experts": 1, "first_k_dense_replace": 3, "n_group": 8,
    "topk_group": 4, "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
}  # fmt: skip
"""deepseek-ai/DeepSeek-V3's ``config.json`` (the keys kilocard reads; its remote-code era spelling of RoPE)."""

KIMI_K2_JSON = {
    **DEEPSEEK_V3_JSON, "model_type": "kimi_k2", "num_attention_heads": 64, "num_key_value_heads": 64,
    "vocab_size": 163840, "rope_theta": 50000.0, "max_position_embeddings": 131072, "n_routed_experts": 384,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
    "num_nextn_predict_layers": 0,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
}  # fmt: skip
"""moonshotai/Kimi-K2-Instruct's ``config.json``: DeepSeek-V3's keys at Kimi-K2's sizes, ``model_type: kimi_k2``."""


@pytest.mark.integration  # kilocard.convert.maps holds torch
@pytest.mark.parametrize(
    ("config", "recipes"),
    [(DEEPSEEK_V3_JSON, ("deepseek_v3_sft", "deepseek_v3")), (KIMI_K2_JSON, ("kimi_k2_sft", "kimi_k2"))],
)
def test_the_published_config_json_agrees_with_its_recipes_yarn_included(config, recipes):
    """What ``convert hf-to-mcore`` compares before reading a tensor: the published files pass against the recipes
    of their models (YaRN's six parameters among them), and a model derived from them is the recipe's."""
    from kilocard.config.compose import compose, to_run_config
    from kilocard.convert import maps

    family = maps.family_of_config(config)
    derived = maps.model_from_config(config, family)
    for name in recipes:
        m = to_run_config(compose([f"recipe={name}"])).model
        maps.check_model(family, m)
        maps.check_config(config, family, m, name)
        assert {
            k: getattr(m, k) for k in derived if k not in ("seq_length", "max_position_embeddings", "mtp_num_layers")
        } == {k: v for k, v in derived.items() if k not in ("seq_length", "max_position_embeddings", "mtp_num_layers")}
    wrong = {**config, "rope_scaling": {**config["rope_scaling"], "factor": 8}}
    with pytest.raises(ConvertError, match=r"rope_parameters.factor is 8.0, recipe .* expects"):
        maps.check_config(wrong, family, m, recipes[0])
