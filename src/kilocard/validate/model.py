"""Rules on the model shape itself (sizes that every other estimate divides by)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.perf.steptime import CROSS_ENTROPY_BYTES
from kilocard.validate.issues import Issue, below_floor, error, not_one_of

#: Megatron-Core's fused cross-entropy implementations (``ModelParallelConfig.cross_entropy_fusion_impl``):
#: the step-time model's paths other than the eager one.
CROSS_ENTROPY_FUSION_IMPLS = tuple(path for path in CROSS_ENTROPY_BYTES if path != "unfused")

#: (field, the values Megatron-Core / the trainer build, the usual one): string fields with a fixed set of
#: values. Anything else fails only on the ranks, after the run directory is written.
MODEL_CHOICES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("normalization", ("LayerNorm", "RMSNorm"), "LayerNorm"),
    ("activation", ("gelu", "swiglu", "squared_relu"), "gelu"),
    ("position_embedding_type", ("learned_absolute", "rope", "none"), "rope"),
    ("moe_token_dispatcher_type", ("alltoall", "allgather", "flex"), "alltoall"),
    ("moe_router_load_balancing_type", ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"), "aux_loss"),
    ("moe_router_score_function", ("softmax", "sigmoid"), "softmax"),
)

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
        "moe_shared_expert_intermediate_size",
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


def rule_model_choices(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MODEL_CHOICE``: each string field of ``MODEL_CHOICES`` names a value Megatron-Core builds."""
    for name, allowed, usual in MODEL_CHOICES:
        yield from not_one_of(
            "MODEL_CHOICE", "model." + name, getattr(cfg.model, name), allowed, f"set model.{name}={usual}"
        )


def rule_norm_epsilon(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LAYERNORM_EPSILON``: ``model.layernorm_epsilon`` > 0 (with 0 a constant input divides by zero; a
    negative one takes the square root of a negative number: NaN, silently)."""
    why = "the norm divides by sqrt(variance + epsilon)"
    yield from below_floor(
        "LAYERNORM_EPSILON", "model.layernorm_epsilon", cfg.model.layernorm_epsilon, 0, True, why, "set it to 1e-5"
    )


def rule_init_method_std(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``INIT_METHOD_STD``: ``model.init_method_std`` > 0 (0 starts every weight at zero, so the units never
    differ: training goes silently nowhere; torch refuses a negative one at model build)."""
    why = "weights are drawn from N(0, std), and all-zero weights never learn apart"
    yield from below_floor(
        "INIT_METHOD_STD", "model.init_method_std", cfg.model.init_method_std, 0, True, why, "set it to 0.02"
    )


def rule_rope(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``ROPE``: with rotary embeddings, 0 < ``rotary_percent`` <= 1, ``rotary_base`` >= 1 and a positive
    ``rope_scaling_factor`` when ``rope_scaling`` is on (``GPTModel``'s RotaryEmbedding)."""
    m = cfg.model
    if m.position_embedding_type != "rope":
        return
    checks = (
        ("rotary_percent", m.rotary_percent, 0 < m.rotary_percent <= 1, "in (0, 1]", "1.0"),
        ("rotary_base", m.rotary_base, m.rotary_base >= 1, ">= 1", "10000"),
        ("rope_scaling_factor", m.rope_scaling_factor, not m.rope_scaling or m.rope_scaling_factor > 0, "> 0", "8.0"),
    )
    for name, v, ok, want, usual in checks:
        if not ok and math.isfinite(v):
            yield error("ROPE", "model." + name, v, f"model.{name}={v} must be {want}", f"set model.{name}={usual}")


def rule_moe_aux_loss_coeff(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_AUX_LOSS_COEFF``: >= 0 (a negative weight rewards the router for overloading experts)."""
    why = "a negative load-balancing loss would push tokens onto fewer experts"
    yield from below_floor(
        "MOE_AUX_LOSS_COEFF",
        "model.moe_aux_loss_coeff",
        cfg.model.moe_aux_loss_coeff,
        0,
        False,
        why,
        "set it to 0.01 (or 0 to turn it off)",
    )


def rule_moe_topk1_softmax(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_TOPK1_SOFTMAX``: top-1 routing with a softmax score needs the softmax before the top-k, which
    kilocard does not expose; Megatron-Core refuses it at start-up (a softmax over one expert has a zero
    gradient: the router would never learn)."""
    m = cfg.model
    if (
        m.num_moe_experts
        and m.moe_router_topk == 1
        and m.moe_router_score_function == "softmax"
        and m.moe_router_load_balancing_type != "sinkhorn"
    ):
        yield error(
            "MOE_TOPK1_SOFTMAX",
            "model.moe_router_topk",
            1,
            "model.moe_router_topk=1 with moe_router_score_function=softmax: the softmax of one selected expert is "
            "constant, so the router gets no gradient (Megatron-Core refuses it at start-up)",
            "set model.moe_router_topk=2, model.moe_router_score_function=sigmoid, or "
            "model.moe_router_load_balancing_type=sinkhorn",
        )


RULES = (
    rule_model_shape,
    rule_moe_topk1_softmax,
    rule_model_choices,
    rule_norm_epsilon,
    rule_init_method_std,
    rule_rope,
    rule_moe_aux_loss_coeff,
    rule_cross_entropy_fusion_impl,
)
