"""Rules on the model shape itself (sizes that every other estimate divides by)."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error

SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "make_vocab_size_divisible_by")


def model_shape_ok(cfg: RunConfig) -> bool:
    """True when every shape field is >= 1 (estimates need it)."""
    m = cfg.model
    opt = (m.ffn_hidden_size, m.num_query_groups, m.kv_channels, m.moe_ffn_hidden_size)
    return (
        all(getattr(m, f) >= 1 for f in SHAPE_FIELDS)
        and all(v is None or v >= 1 for v in opt)
        and m.moe_router_topk >= 1
        and (m.num_moe_experts is None or m.num_moe_experts >= 1)
        and (not isinstance(m.moe_layer_freq, int) or m.moe_layer_freq >= 1)
    )


def rule_model_shape(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Query groups divide the heads; the MoE pattern matches the layers (each size's own range is its domain:
    ``kilocard.config.domains``)."""
    m = cfg.model
    g = m.num_query_groups
    if g is not None and g >= 1 and m.num_attention_heads >= 1 and m.num_attention_heads % g:
        yield error(
            "QUERY_GROUPS_HEADS",
            "model.num_query_groups",
            g,
            f"num_attention_heads({m.num_attention_heads}) is not a multiple of num_query_groups({g})",
            "use a num_query_groups that divides num_attention_heads",
        )
    if m.num_moe_experts:
        freq = m.moe_layer_freq
        if isinstance(freq, int) and freq < 1:
            yield error(
                "MOE_LAYER_FREQ",
                "model.moe_layer_freq",
                freq,
                f"moe_layer_freq({freq}) must be >= 1",
                "set model.moe_layer_freq=1",
            )
        elif not isinstance(freq, int) and len(list(freq)) != m.num_layers:
            yield error(
                "MOE_LAYER_FREQ",
                "model.moe_layer_freq",
                list(freq),
                f"moe_layer_freq lists {len(list(freq))} layers but num_layers({m.num_layers})",
                "give one 0/1 per layer",
            )
        elif not isinstance(freq, int) and any(v not in (0, 1) or isinstance(v, bool) for v in freq):
            yield error(
                "MOE_LAYER_FREQ",
                "model.moe_layer_freq",
                list(freq),
                "moe_layer_freq lists a value other than 0 (dense) and 1 (MoE); Megatron-Core refuses the pattern",
                "give one 0/1 per layer",
            )
        if m.moe_router_topk > m.num_moe_experts:
            yield error(
                "MOE_TOPK",
                "model.moe_router_topk",
                m.moe_router_topk,
                f"moe_router_topk({m.moe_router_topk}) > num_moe_experts({m.num_moe_experts})",
                f"set model.moe_router_topk to at most {m.num_moe_experts}",
            )


def rule_moe_topk1_softmax(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_TOPK1_SOFTMAX``: top-1 routing with a softmax score needs the softmax before the top-k
    (``moe_router_pre_softmax``); Megatron-Core refuses it at start-up (a softmax over one expert has a zero
    gradient: the router would never learn)."""
    m = cfg.model
    if (
        m.num_moe_experts
        and m.moe_router_topk == 1
        and m.moe_router_score_function == "softmax"
        and not m.moe_router_pre_softmax
        and m.moe_router_load_balancing_type != "sinkhorn"
    ):
        yield error(
            "MOE_TOPK1_SOFTMAX",
            "model.moe_router_topk",
            1,
            "model.moe_router_topk=1 with moe_router_score_function=softmax: the softmax of one selected expert is "
            "constant, so the router gets no gradient (Megatron-Core refuses it at start-up)",
            "set model.moe_router_pre_softmax=true, model.moe_router_topk=2, "
            "model.moe_router_score_function=sigmoid, or model.moe_router_load_balancing_type=sinkhorn",
        )


RULES = (
    rule_model_shape,
    rule_moe_topk1_softmax,
)
