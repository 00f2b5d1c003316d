"""The MoE router, MLA rotary and MTP rules (``kilocard.validate.moe``): each bad config gets its code and its
fix passes; a value Megatron-Core ignores is refused like one it rejects."""

from __future__ import annotations

import pytest

from kilocard.layout import compute_layout
from kilocard.validate import moe, validate
from run_configs import cfg_of

MOE = {"model.num_moe_experts": 8, "model.moe_router_topk": 4}
SIGMOID = {**MOE, "model.moe_router_score_function": "sigmoid"}
MLA = {"model.multi_latent_attention": True}
M = "model."


def codes(rule, values):
    cfg = cfg_of(values)
    return [i.code for i in rule(cfg, compute_layout(cfg))]


def groups(n: int | None, k: int | None) -> dict[str, object]:
    """``MOE`` with group-limited routing: ``n`` groups, ``k`` of them per token."""
    return {**MOE, M + "moe_router_num_groups": n, M + "moe_router_group_topk": k}


BIAS = {**SIGMOID, M + "moe_router_enable_expert_bias": True}
RATE = M + "moe_router_bias_update_rate"
SCALE = M + "moe_router_topk_scaling_factor"

CASES = [
    # rule, bad config, code, the same config fixed
    (moe.rule_fields_without_effect, {M + "moe_router_num_groups": 2}, "MOE_FIELD_UNUSED", {}),
    (moe.rule_fields_without_effect, {M + "moe_router_enable_expert_bias": True}, "MOE_FIELD_UNUSED", BIAS),
    (moe.rule_fields_without_effect, {M + "moe_shared_expert_intermediate_size": 64}, "MOE_FIELD_UNUSED",
     {**MOE, M + "moe_shared_expert_intermediate_size": 64}),
    (moe.rule_fields_without_effect, {M + "rope_type": "rope"}, "MLA_FIELD_UNUSED", {**MLA, M + "rope_type": "rope"}),
    (moe.rule_fields_without_effect, {M + "q_lora_rank": 32}, "MLA_FIELD_UNUSED", {**MLA, M + "q_lora_rank": 32}),
    # YaRN's fields: MLA's, or GPT attention's with position_embedding_type yarn (GPT-OSS)
    (moe.rule_fields_without_effect, {M + "rotary_scaling_factor": 32.0}, "MLA_FIELD_UNUSED",
     {M + "position_embedding_type": "yarn", M + "rotary_scaling_factor": 32.0}),
    (moe.rule_fields_without_effect, {M + "yarn_correction_range_round_to_int": False}, "YARN_FIELD_UNUSED",
     {M + "position_embedding_type": "yarn", M + "yarn_correction_range_round_to_int": False}),
    (moe.rule_router_scores, {**MOE, M + "moe_router_enable_expert_bias": True}, "MOE_ROUTER_SCORE", BIAS),
    (moe.rule_router_scores, {**SIGMOID, M + "moe_router_pre_softmax": True}, "MOE_ROUTER_SCORE",
     {**MOE, M + "moe_router_pre_softmax": True}),
    (moe.rule_router_scores, {**SIGMOID, RATE: 0.01}, "MOE_ROUTER_SCORE", {**BIAS, RATE: 0.01}),
    (moe.rule_router_groups, groups(None, 2), "MOE_ROUTER_GROUPS", groups(4, 2)),
    (moe.rule_router_groups, groups(4, None), "MOE_ROUTER_GROUPS", groups(4, 2)),
    (moe.rule_router_groups, groups(3, 1), "MOE_ROUTER_GROUPS", groups(2, 1)),
    (moe.rule_router_groups, groups(2, 3), "MOE_ROUTER_GROUPS", groups(2, 2)),
    # top-4 over 4 groups of 2 experts, one group per token: 4 // 1 = 4 experts scored in a group of 2
    (moe.rule_router_groups, groups(4, 1), "MOE_ROUTER_GROUPS", groups(4, 2)),
    # top-4 with 8 groups picked 8 at a time: 4 // 8 = 0 experts score each group
    (moe.rule_router_groups, groups(8, 8), "MOE_ROUTER_GROUPS", groups(8, 4)),
]  # fmt: skip


@pytest.mark.parametrize("rule,bad,code,good", CASES, ids=[f"{c[0].__name__}-{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_rule_flags_the_bad_config_and_passes_the_fixed_one(rule, bad, code, good):
    assert code in codes(rule, bad)
    assert code not in codes(rule, good)


def test_every_rule_is_covered():
    assert set(moe.RULES) == {c[0] for c in CASES}


#: One field out of its domain (``kilocard.config.domains``), the code validate gives, the field fixed.
DOMAIN_CASES = [
    ({**MOE, M + "moe_router_dtype": "bf16"}, "MODEL_CHOICE", {**MOE, M + "moe_router_dtype": "fp32"}),
    ({**MLA, M + "rope_type": "ntk"}, "MODEL_CHOICE", {**MLA, M + "rope_type": "yarn"}),
    ({**BIAS, RATE: -1e-3}, "MOE_ROUTER_SCORE", {**BIAS, RATE: 0.0}),
    ({**MOE, SCALE: 0.0}, "MOE_ROUTER_SCORE", {**MOE, SCALE: 2.5}),
    (groups(0, 1), "MOE_ROUTER_GROUPS", groups(1, 1)),
    ({**MLA, M + "rotary_scaling_factor": 0.0}, "MLA_ROPE", {**MLA, M + "rotary_scaling_factor": 1.0}),
    ({**MLA, M + "original_max_position_embeddings": 0}, "MLA_ROPE", MLA),
    ({**MLA, M + "beta_fast": 0.0}, "MLA_ROPE", {**MLA, M + "beta_fast": 32.0}),
    ({M + "mtp_num_layers": 0}, "MTP", {M + "mtp_num_layers": 1}),
    ({M + "mtp_loss_scaling_factor": -0.1}, "MTP", {M + "mtp_loss_scaling_factor": 0.3}),
]


@pytest.mark.parametrize("bad,code,good", DOMAIN_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(DOMAIN_CASES)])
def test_a_field_outside_its_domain_is_refused(bad, code, good):
    assert code in validate(cfg_of(bad)).codes()
    assert code not in validate(cfg_of(good)).codes()


def test_topk1_softmax_passes_with_the_softmax_before_the_topk():
    """Megatron-Core's own fix for top-1 softmax routing (``moe_router_pre_softmax``) is accepted."""
    top1 = {**MOE, M + "moe_router_topk": 1}
    assert "MOE_TOPK1_SOFTMAX" in validate(cfg_of(top1)).codes()
    assert "MOE_TOPK1_SOFTMAX" not in validate(cfg_of({**top1, M + "moe_router_pre_softmax": True})).codes()


def test_a_moe_pattern_of_other_values_than_0_and_1_is_refused():
    values = {**MOE, M + "num_layers": 2}
    assert "MOE_LAYER_FREQ" in validate(cfg_of({**values, M + "moe_layer_freq": [0, 2]})).codes()
    assert "MOE_LAYER_FREQ" not in validate(cfg_of({**values, M + "moe_layer_freq": [0, 1]})).codes()


def test_the_message_names_field_value_and_fix():
    (issue,) = moe.rule_fields_without_effect(cfg_of({M + "moe_router_num_groups": 2}), compute_layout(cfg_of({})))
    assert (issue.field, issue.value) == ("model.moe_router_num_groups", 2)
    assert "model.moe_router_num_groups=null" in issue.hint


GPT_OSS_CASES = [
    # bad config, code, the same config fixed
    ({M + "window_size": [8, 4]}, "WINDOW", {M + "window_size": [8, 0]}),
    ({M + "window_size": [0, 0]}, "WINDOW", {M + "window_size": [1, 0]}),
    ({M + "window_attn_skip_freq": 2}, "WINDOW", {M + "window_attn_skip_freq": 2, M + "window_size": [8, 0]}),
    ({M + "window_size": [8, 0], M + "window_attn_skip_freq": [1, 0, 1]}, "WINDOW",
     {M + "window_size": [8, 0], M + "window_attn_skip_freq": [1, 0]}),
    ({M + "window_size": [8, 0], "data.reset_attention_mask": True, "data.reset_position_ids": True}, "WINDOW",
     {M + "window_size": [8, 0], "data.reset_position_ids": True}),
    ({M + "glu_linear_offset": 1.0}, "GLU", {M + "glu_linear_offset": 1.0, M + "gated_linear_unit": True}),
    ({M + "activation_func_clamp_value": 7.0}, "GLU",
     {M + "activation_func_clamp_value": 7.0, M + "activation": "swiglu"}),
    ({M + "softmax_type": "sink"}, "MODEL_CHOICE", {M + "softmax_type": "learnable"}),
    ({M + "activation": "relu"}, "MODEL_CHOICE", {M + "activation": "quick_gelu"}),
]  # fmt: skip


@pytest.mark.parametrize("bad,code,good", GPT_OSS_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(GPT_OSS_CASES)])
def test_gpt_oss_fields_are_refused_where_megatron_core_would_ignore_or_misbuild_them(bad, code, good):
    assert code in validate(cfg_of(bad)).codes()
    assert code not in validate(cfg_of(good)).codes()
