"""Megatron-LM's parsed ``args`` for a ``RunConfig``: what its FLOPs and memory formulas read.

Built on the one config-to-Megatron mapping (``kilocard.config.megatron.megatron_fields``: every
schema field under its Megatron-Core name) plus the names Megatron-LM's ``validate_args`` derives
from them (``swiglu``, ``num_experts``, ``padded_vocab_size``, defaults for ``None`` widths, ...).
"""

from __future__ import annotations

from types import SimpleNamespace

from kilocard.config.megatron import megatron_fields
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.perf.params import is_gated, is_swiglu, padded_vocab_size


def megatron_lm_args(cfg: RunConfig, tp: int | None = None) -> SimpleNamespace:
    """Megatron-LM's ``args`` for ``cfg`` (vocabulary padded for ``tp``, default the config's TP)."""
    m = cfg.model
    tp = cfg.parallel.tensor_model_parallel_size if tp is None else tp
    args = megatron_fields(cfg)
    args.update(_derived(m))
    args.update(
        seq_length=m.seq_length,
        padded_vocab_size=padded_vocab_size(m, tp),
        untie_embeddings_and_output_weights=not m.share_embeddings_and_output_weights,
        micro_batch_size=cfg.trainer.micro_batch_size,
        # Megatron-LM features kilocard does not configure, at their off values.
        moe_latent_size=None,
        moe_shared_expert_gate=False,
        attention_output_gate=False,
        experimental_attention_variant=None,
        linear_attention_freq=None,
        hybrid_layer_pattern=None,
    )
    return SimpleNamespace(**args)


def _derived(m: ModelConfig) -> dict[str, object]:
    """What ``validate_args`` fills in: default widths, GQA flag, expert count, the layer pattern."""
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    gqa = m.num_query_groups is not None and not m.multi_latent_attention
    freq = m.moe_layer_freq if isinstance(m.moe_layer_freq, int) else [int(bool(x)) for x in m.moe_layer_freq]
    return {
        "ffn_hidden_size": ffn,
        "kv_channels": m.kv_channels or m.hidden_size // m.num_attention_heads,
        "group_query_attention": gqa,
        "num_query_groups": m.num_query_groups if gqa else m.num_attention_heads,
        "num_experts": m.num_moe_experts or None,
        # --swiglu (SiLU gate) and --quick-geglu (GPT-OSS) are Megatron-LM's two gated MLPs; its parse
        # keeps swiglu False under --quick-geglu (arguments.py: ``assert not args.swiglu``).
        "swiglu": is_swiglu(m),
        "quick_geglu": is_gated(m) and m.activation == "quick_gelu",
        "moe_layer_freq": freq,
        "moe_ffn_hidden_size": (m.moe_ffn_hidden_size or ffn) if m.num_moe_experts else None,
    }
