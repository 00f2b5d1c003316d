"""Rules on the model shape itself (sizes that every other estimate divides by)."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.perf.steptime import CROSS_ENTROPY_BYTES
from kilocard.validate.issues import Issue, error

#: Megatron-Core's fused cross-entropy implementations (``ModelParallelConfig.cross_entropy_fusion_impl``):
#: the step-time model's paths other than the eager one.
CROSS_ENTROPY_FUSION_IMPLS = tuple(path for path in CROSS_ENTROPY_BYTES if path != "unfused")

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
    """Layers, widths, heads and vocabulary are >= 1; the MoE pattern matches the layers."""
    m = cfg.model
    for f in SHAPE_FIELDS + (
        "ffn_hidden_size",
        "num_query_groups",
        "kv_channels",
        "moe_ffn_hidden_size",
        "moe_router_topk",
    ):
        v = getattr(m, f)
        if v is not None and v < 1:
            yield error(
                "MODEL_SHAPE", "model." + f, v, f"model.{f}({v}) must be >= 1", f"set model.{f} to a positive size"
            )
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
        if m.moe_router_topk > m.num_moe_experts:
            yield error(
                "MOE_TOPK",
                "model.moe_router_topk",
                m.moe_router_topk,
                f"moe_router_topk({m.moe_router_topk}) > num_moe_experts({m.num_moe_experts})",
                f"set model.moe_router_topk to at most {m.num_moe_experts}",
            )


def rule_cross_entropy_fusion_impl(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``model.cross_entropy_fusion_impl`` names one of Megatron-Core's fused cross-entropies."""
    impl = cfg.model.cross_entropy_fusion_impl
    if impl not in CROSS_ENTROPY_FUSION_IMPLS:
        yield error(
            "CROSS_ENTROPY_FUSION_IMPL",
            "model.cross_entropy_fusion_impl",
            impl,
            f"cross_entropy_fusion_impl({impl!r}) is not one of {', '.join(CROSS_ENTROPY_FUSION_IMPLS)}",
            "set model.cross_entropy_fusion_impl=native (Megatron-Core's) or te (Transformer Engine's)",
        )


RULES = (rule_model_shape, rule_cross_entropy_fusion_impl)
