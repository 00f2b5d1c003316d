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


def test_every_family_is_found_by_its_model_type_and_names_its_architecture():
    for f in families.FAMILIES:
        assert families.of_config({"model_type": f.model_type}) is f
        assert f.architecture.endswith("ForCausalLM") and f.base_recipe.startswith("tiny_")
    assert len(families.BY_TYPE) == len(families.FAMILIES)


def test_an_unknown_model_type_is_refused_naming_the_known_ones():
    with pytest.raises(
        ConvertError, match=r"model_type 'gemma' is not supported \(expected one of deepseek_v3, llama, mixtral"
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
    ],
)
def test_a_model_with_no_recorded_source_exports_as_the_family_that_claims_it(changes, family):
    m = ModelConfig(**DENSE, **changes)
    assert families.of_model(m).model_type == family
    families.get(family).check_model(m)  # and that family can hold it


def family_example(f: families.Family) -> ModelConfig:
    """A model the family can hold: ``DENSE`` with its features."""
    if f.model_type == "deepseek_v3":
        return ModelConfig(**{**DENSE, **DEEPSEEK, "moe_layer_freq": [0, 1]})
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
