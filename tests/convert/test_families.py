"""The family registry (``kilocard.convert.families``): one family per ``model_type``, found by ``config.json`` and,
for an export with no recorded source, by the model itself; each family's weight map names every tensor once."""

from __future__ import annotations

import pytest

from kilocard.config.schema import ModelConfig
from kilocard.convert import families
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
        ConvertError, match=r"model_type 'gemma' is not supported \(expected one of deepseek_v3, gpt_oss, llama, "
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
    if f.model_type == "deepseek_v3":
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
