"""Rules across the MoE router's fields (DeepSeek-V3's sigmoid router, expert bias, group-limited routing) and
the fields only MoE or multi-latent attention reads: what Megatron-Core 0.16.1 refuses at start-up
(``TransformerConfig.__post_init__``) or fails on in the first routing, and what it silently ignores. Each
field's own range is in ``kilocard.config.domains``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error

#: Fields Megatron-Core reads only in an MoE layer: set on a dense model they change nothing.
MOE_ONLY_FIELDS = (
    "moe_router_pre_softmax",
    "moe_router_topk_scaling_factor",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "moe_router_enable_expert_bias",
    "moe_router_bias_update_rate",
    "moe_router_dtype",
    "moe_shared_expert_intermediate_size",
)
#: Fields only multi-latent attention reads (``MLATransformerConfig``): set without it they change nothing.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "rope_type")
#: YaRN's fields: read by multi-latent attention and by ``position_embedding_type: yarn``, nothing else.
YARN_FIELDS = (
    "rotary_scaling_factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
)


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(ModelConfig) if f.name == name)


def _shown(v: Any) -> str:
    """A value as an override writes it (``null``, ``true``)."""
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _unread(m: ModelConfig, names: tuple[str, ...]) -> list[str]:
    """The fields of ``names`` set away from their default."""
    return [n for n in names if getattr(m, n) != _default(n)]


def rule_fields_without_effect(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_FIELD_UNUSED`` / ``MLA_FIELD_UNUSED``: a router field on a dense model, or an MLA field without
    ``multi_latent_attention``, is read by nothing in Megatron-Core: the run would silently differ from
    what the config says."""
    m = cfg.model
    unused = (
        (not m.num_moe_experts, MOE_ONLY_FIELDS, "MOE_FIELD", "the model has no experts (num_moe_experts is null)",
         "set model.num_moe_experts"),
        (not m.multi_latent_attention, MLA_FIELDS, "MLA_FIELD", "model.multi_latent_attention is false",
         "set model.multi_latent_attention=true"),
        (not m.multi_latent_attention and m.position_embedding_type != "yarn", YARN_FIELDS, "MLA_FIELD",
         "neither model.multi_latent_attention nor model.position_embedding_type=yarn is set",
         "set model.position_embedding_type=yarn (or model.multi_latent_attention=true)"),
        (m.multi_latent_attention or m.position_embedding_type != "yarn", ("yarn_correction_range_round_to_int",),
         "YARN_FIELD", "only model.position_embedding_type=yarn without multi-latent attention reads it",
         "set model.position_embedding_type=yarn"),
    )  # fmt: skip
    for applies, names, code, why, fix in unused:
        for n in _unread(m, names) if applies else ():
            yield error(
                code + "_UNUSED", f"model.{n}", getattr(m, n),
                f"model.{n} is set but {why}: Megatron-Core ignores it", f"{fix}, or model.{n}={_shown(_default(n))}",
            )  # fmt: skip


def rule_router_scores(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_ROUTER_SCORE``: the expert bias needs sigmoid scores (Megatron-Core refuses it otherwise); the
    pre-softmax switch and the bias update rate do nothing with sigmoid scores / without the bias."""
    m = cfg.model
    if not m.num_moe_experts:
        return
    sigmoid = m.moe_router_score_function == "sigmoid"
    if m.moe_router_enable_expert_bias and not sigmoid:
        yield error(
            "MOE_ROUTER_SCORE", "model.moe_router_enable_expert_bias", True,
            f"the expert bias (aux-loss-free balancing) needs sigmoid scores, not {m.moe_router_score_function!r} "
            "(Megatron-Core refuses it at start-up)",
            "set model.moe_router_score_function=sigmoid, or model.moe_router_enable_expert_bias=false",
        )  # fmt: skip
    if m.moe_router_pre_softmax and sigmoid:
        yield error(
            "MOE_ROUTER_SCORE", "model.moe_router_pre_softmax", True,
            "sigmoid scores are always taken before the top-k: moe_router_pre_softmax changes nothing",
            "set model.moe_router_pre_softmax=false",
        )  # fmt: skip
    rate = m.moe_router_bias_update_rate
    if rate != _default("moe_router_bias_update_rate") and not m.moe_router_enable_expert_bias:
        yield error(
            "MOE_ROUTER_SCORE", "model.moe_router_bias_update_rate", rate,
            "moe_router_bias_update_rate moves the expert bias, which is off: Megatron-Core ignores it",
            "set model.moe_router_enable_expert_bias=true, or leave model.moe_router_bias_update_rate at 1e-3",
        )  # fmt: skip


def rule_router_groups(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_ROUTER_GROUPS``: group-limited routing takes both fields (Megatron-Core refuses a group top-k
    without groups and ignores groups without a group top-k); the groups split the experts evenly, at most
    all of them are chosen, and each chosen group holds the ``topk // group_topk`` experts its score sums."""
    m = cfg.model
    groups, pick, experts, topk = m.moe_router_num_groups, m.moe_router_group_topk, m.num_moe_experts, m.moe_router_topk
    if not experts or (groups is None and pick is None):
        return
    field, value, why, fix = "model.moe_router_group_topk", pick, "", ""
    if groups is None or pick is None:
        missing = "moe_router_num_groups" if groups is None else "moe_router_group_topk"
        field, value = f"model.{missing}", None
        why = "group-limited routing needs both moe_router_num_groups and moe_router_group_topk"
        fix = f"set model.{missing} too, or set neither"
    elif groups < 1 or experts % groups:
        field, value = "model.moe_router_num_groups", groups
        why = f"moe_router_num_groups({groups}) must divide num_moe_experts({experts})"
        fix = "set model.moe_router_num_groups to a divisor of num_moe_experts (DeepSeek-V3: 8)"
    elif not 1 <= pick <= groups:
        why = f"moe_router_group_topk({pick}) must be between 1 and moe_router_num_groups({groups})"
        fix = f"set model.moe_router_group_topk to at most {groups}"
    elif not 1 <= topk // pick <= experts // groups:
        why = (
            f"each chosen group is scored by its best moe_router_topk // moe_router_group_topk = {topk // pick} "
            f"experts, which must be between 1 and the {experts // groups} experts of a group"
        )
        fix = "choose moe_router_group_topk <= moe_router_topk and experts per group >= topk // group_topk"
    elif topk > pick * (experts // groups):
        why = f"moe_router_topk({topk}) exceeds the {pick * (experts // groups)} experts of the chosen groups"
        fix = "raise model.moe_router_group_topk or lower model.moe_router_topk"
    if why:
        yield error("MOE_ROUTER_GROUPS", field, value, why, fix)


RULES = (
    rule_fields_without_effect,
    rule_router_scores,
    rule_router_groups,
)
