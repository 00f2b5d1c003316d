"""FLOPs per training iteration under named conventions, each equal to its published formula.

Throughput and MFU figures are only comparable under the same FLOPs count, so every figure
kilocard prints names its convention:

``megatron_sc21``
    Narayanan et al., SC21, eq. 3: ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``. Counts the
    recompute forward pass (4 passes, not 3) and full, non-causal ``s²`` attention; MHA, 4h MLP.
``megatron_legacy``
    Megatron-LM ``num_floating_point_operations`` before 2025-03:
    ``12·B·s·L·h²·[(1 + g/n + s/h)·(q/h) + (F/h)·k·m + (F_sh/h)·m + V/(2·L·h)]`` with
    q = kv_channels·heads, g/n = query groups / heads, F the (routed) expert or dense MLP width,
    k experts routed to (1 when dense), m = 3/2 with a gated MLP, F_sh the shared-expert width.
    Full ``s²`` attention; every layer counted with the same MLP.
``megatron_current``
    Megatron-LM ``megatron/training/training.py`` ``num_floating_point_operations`` (2025-03 on):
    causal attention halved, gated MLP, GQA, dense/MoE layer pattern, shared experts, MLA, MTP.

Both Megatron-LM counts give a gated MLP its third matrix only when it is SwiGLU (``args.swiglu``):
GPT-OSS's quick-GeGLU is counted as an ungated MLP, and no count knows sliding-window attention (every
layer's core is counted over the whole causal sequence). Megatron-Bridge's ``flop_utils.py`` (release
0.2.0, the 25.11 container) counts the same way. The step-time model charges the work the kernels do
instead: three matrices, and the window's band (``ModelShape.attended_keys``).
``six_n``
    ``6·N·T + 12·L·H·Q·s·T`` (nanoGPT, PaLM appendix B, torchtitan): N the parameters a token
    passes through, without the input embedding (MoE: routed experts counted top-k times), plus
    full non-causal attention scores.

``flops_per_iteration(run_cfg, convention)`` works on a ``RunConfig``; ``shape_flops(shape, B,
convention)`` works on plain numbers (``ModelShape``) and is what the published rows use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.perf.megatron_lm import megatron_lm_args
from kilocard.perf.params import (
    count_parameters,
    is_gated,
    is_swiglu,
    moe_count,
    moe_layer_pattern,
    padded_vocab_size,
    windowed_layers,
)

CURRENT = "megatron_current"
"""The convention kilocard reports its own figures in (Megatron-LM's ``num_floating_point_operations``)."""
CONVENTIONS = ("megatron_sc21", "megatron_legacy", CURRENT, "six_n")
"""Every FLOPs convention kilocard knows."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers a FLOPs formula needs, independent of how the model was described."""

    layers: int
    """Transformer layers (MTP layers not included)."""
    hidden: int
    """Hidden size h."""
    heads: int
    """Attention (query) heads n."""
    query_groups: int
    """Key/value head groups g (= heads for multi-head attention)."""
    kv_channels: int
    """Per-head projection size; q = kv_channels * heads."""
    ffn: int
    """Dense MLP hidden size F."""
    gated: bool
    """Gated MLP (SwiGLU, GPT-OSS's quick-GeGLU): three projections instead of two."""
    vocab: int
    """Vocabulary size as the formula counts it (Megatron: padded)."""
    seq: int
    """Sequence length s."""
    moe_layers: Sequence[bool] = ()
    """Per layer, whether it is an MoE layer; empty for a dense model."""
    topk: int = 1
    """Experts each token is routed to (MoE)."""
    moe_ffn: int | None = None
    """Routed expert MLP width; ``None`` means ``ffn``."""
    shared_ffn: int = 0
    """Total shared-expert MLP width (0: none)."""
    mla: SimpleNamespace | None = None
    """Multi-latent attention dims (q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim,
    v_head_dim); ``None`` for standard attention."""
    mtp_layers: int = 0
    """Multi-token-prediction layers."""
    active_params_no_input_embedding: int | None = None
    """Parameters a token passes through, input embedding excluded (``six_n``); ``None``: derived."""
    tied_embeddings: bool = True
    """Input embedding and output layer share one matrix (``share_embeddings_and_output_weights``)."""
    swiglu: bool | None = None
    """Megatron-LM's ``args.swiglu``: its counts give a gated MLP three matrices only then
    (``kilocard.perf.params.is_swiglu``); ``None``: as ``gated``."""
    window: int = 0
    """Sliding-window attention: tokens each query sees besides itself (``window_size[0]``); 0: none."""
    windowed_layers: int = 0
    """Layers that run the window (``kilocard.perf.params.windowed_layers``); the others attend in full."""

    @property
    def is_moe(self) -> bool:
        """Whether any layer is an MoE layer."""
        return moe_count(self.moe_layers) > 0

    @property
    def counted_gated(self) -> bool:
        """Whether Megatron-LM's FLOPs counts give the MLP three matrices (``swiglu``, else ``gated``)."""
        return self.gated if self.swiglu is None else self.swiglu

    @property
    def attended_keys(self) -> float:
        """Keys a query attends to, averaged over positions and layers: ``s/2`` under the causal mask (the
        count Megatron-LM halves ``s`` to), ``W·(1 - W/(2s))`` under a window of ``W = min(window + 1, s)``
        keys (the band's area over ``s``; ``s/2`` again once the window spans the sequence)."""
        full = self.seq / 2
        if not self.window or not self.windowed_layers:
            return full
        w = min(self.window + 1, self.seq)
        band = w * (1 - w / (2 * self.seq))
        windowed = min(self.windowed_layers, self.layers)
        return (full * (self.layers - windowed) + band * windowed) / self.layers


def shape_from_model(m: ModelConfig, tp: int = 1) -> ModelShape:
    """Describe a ``ModelConfig`` for the FLOPs formulas (vocab padded as Megatron-LM does for ``tp``)."""
    mla = None
    if m.multi_latent_attention:
        mla = SimpleNamespace(
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_head_dim=m.qk_head_dim,
            qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
            v_head_dim=m.v_head_dim,
        )
    count = count_parameters(m)
    emb_in = padded_vocab_size(m) * m.hidden_size
    if m.position_embedding_type == "learned_absolute":
        emb_in += m.max_position_embeddings * m.hidden_size
    # A tied embedding still does the output projection; count that matrix once, as the output layer.
    return ModelShape(
        layers=m.num_layers,
        hidden=m.hidden_size,
        heads=m.num_attention_heads,
        query_groups=m.num_query_groups or m.num_attention_heads,
        kv_channels=m.kv_channels or m.hidden_size // m.num_attention_heads,
        ffn=m.ffn_hidden_size or 4 * m.hidden_size,
        gated=is_gated(m),
        vocab=padded_vocab_size(m, tp),
        seq=m.seq_length,
        moe_layers=moe_layer_pattern(m) if m.num_moe_experts else (),
        topk=m.moe_router_topk,
        moe_ffn=m.moe_ffn_hidden_size,
        shared_ffn=m.moe_shared_expert_intermediate_size or 0,
        mla=mla,
        mtp_layers=m.mtp_num_layers or 0,
        active_params_no_input_embedding=count.active
        - emb_in
        + (0 if not m.share_embeddings_and_output_weights else padded_vocab_size(m) * m.hidden_size),
        tied_embeddings=m.share_embeddings_and_output_weights,
        swiglu=is_swiglu(m),
        window=m.window_size[0] if m.window_size else 0,
        windowed_layers=windowed_layers(m),
    )


# --- the conventions ------------------------------------------------------------------------


def sc21_flops(s: ModelShape, batch: float) -> float:
    """SC21 eq. 3: ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``."""
    h, l = s.hidden, s.layers
    return 96.0 * batch * s.seq * l * h * h * (1 + s.seq / (6 * h) + s.vocab / (16 * l * h))


def legacy_flops(s: ModelShape, batch: float) -> float:
    """Megatron-LM before 2025-03: ``12·B·s·L·h²·[(1+g/n+s/h)(q/h) + (F/h)k·m + (F_sh/h)m + V/(2Lh)]``."""
    h, L = s.hidden, s.layers
    m = 1.5 if s.counted_gated else 1.0
    k = s.topk if s.is_moe else 1
    ffn = (s.moe_ffn or s.ffn) if s.is_moe else s.ffn
    q_ratio = s.kv_channels * s.heads / h
    bracket = (
        (1 + s.query_groups / s.heads + s.seq / h) * q_ratio
        + (ffn / h) * k * m
        + (s.shared_ffn / h) * m
        + s.vocab / (2 * L * h)
    )
    return 12.0 * batch * s.seq * L * h * h * bracket


def _attention_terms(s: ModelShape) -> tuple:
    """(token-linear, per-s² core) FLOPs per token per attention layer, fwd+bwd (x6)."""
    h, n = s.hidden, s.heads
    if s.mla is not None:
        a = s.mla
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        q_term = h * n * qk if a.q_lora_rank is None else a.q_lora_rank * (h + n * qk + 1)
        linear = 6 * (
            q_term
            + a.kv_lora_rank * (h + n * (a.qk_head_dim + a.v_head_dim) + 1)
            + h * a.qk_pos_emb_head_dim
            + n * a.v_head_dim * h
        )
        core = 6 * (n * qk / 2 + n * a.v_head_dim / 2)
        return linear, core
    q = s.kv_channels * n
    kv = s.kv_channels * s.query_groups
    return 6 * (h * (q + 2 * kv) + q * h), 6 * q / 2 * 2


def current_flops(s: ModelShape, batch: float) -> float:
    """Megatron-LM ``num_floating_point_operations`` (training.py, 2025-03 on), BSHD batches."""
    h = s.hidden
    n_moe = moe_count(s.moe_layers)
    n_dense = s.layers - n_moe
    last_moe = 1 if (s.moe_layers and s.moe_layers[-1]) else 0
    n_moe += last_moe * s.mtp_layers
    n_dense += (1 - last_moe) * s.mtp_layers
    n_layers = s.layers + s.mtp_layers
    k = s.topk if s.moe_layers else 0
    f = 3 if s.counted_gated else 2
    moe_ffn = s.moe_ffn or s.ffn
    attn_linear, attn_core = _attention_terms(s)
    tokens = batch * s.seq
    per_token = (
        6 * h * (s.ffn * f * n_dense + moe_ffn * k * f * n_moe + s.shared_ffn * f * n_moe)
        + attn_linear * n_layers
        + 6 * s.mtp_layers * (3 * h + 2 * h * h)
        + 6 * h * s.vocab * (s.mtp_layers + 1)
    )
    return tokens * per_token + batch * s.seq * s.seq * attn_core * n_layers


def six_n_flops(s: ModelShape, batch: float) -> float:
    """``6·N·T + 12·L·H·Q·s·T`` (nanoGPT / PaLM / torchtitan), N without the input embedding."""
    n_params = s.active_params_no_input_embedding
    if n_params is None:
        n_params = shape_active_params(s)
    tokens = batch * s.seq
    return 6.0 * n_params * tokens + 12.0 * s.layers * s.heads * s.kv_channels * s.seq * tokens


def shape_active_params(s: ModelShape) -> int:
    """Active matmul parameters of a shape (no norms/biases), output layer included, input embedding not."""
    h, q, kv = s.hidden, s.kv_channels * s.heads, s.kv_channels * s.query_groups
    attn = h * (q + 2 * kv) + q * h
    mats = 3 if s.gated else 2
    moe_ffn = s.moe_ffn or s.ffn
    n_moe = moe_count(s.moe_layers)
    moe_mlp, dense_mlp = mats * h * (moe_ffn * s.topk + s.shared_ffn), mats * h * s.ffn
    total = s.layers * attn + n_moe * moe_mlp + (s.layers - n_moe) * dense_mlp
    return total + s.vocab * h


_FORMULAS = {
    "megatron_sc21": sc21_flops,
    "megatron_legacy": legacy_flops,
    "megatron_current": current_flops,
    "six_n": six_n_flops,
}


def check_convention(convention: str) -> str:
    """Return ``convention`` or raise ``ValueError`` naming the valid ones."""
    if convention not in _FORMULAS:
        raise ValueError(f"FLOPs convention {convention!r} is unknown; use one of {', '.join(CONVENTIONS)}")
    return convention


def shape_flops(shape: ModelShape, batch: float, convention: str = CURRENT) -> float:
    """FLOPs of one iteration of ``batch`` sequences of ``shape`` under ``convention``."""
    return float(_FORMULAS[check_convention(convention)](shape, batch))


def flops_per_iteration(run_cfg: RunConfig, convention: str = "megatron_current") -> float:
    """FLOPs of one optimizer step (the global batch) of ``run_cfg`` under ``convention``."""
    shape = shape_from_model(run_cfg.model, run_cfg.parallel.tensor_model_parallel_size)
    return shape_flops(shape, run_cfg.trainer.global_batch_size, convention)


def megatron_args(run_cfg: RunConfig) -> SimpleNamespace:
    """The Megatron-LM ``args`` that ``num_floating_point_operations(args, batch)`` reads, from a RunConfig."""
    return megatron_lm_args(run_cfg)


def mfu(flops: float, step_time_s: float, num_gpus: int, peak_flops_per_gpu: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s per GPU over the GPU's dense peak."""
    return flops / (step_time_s * num_gpus * peak_flops_per_gpu)


__all__: list[str] = [
    "CONVENTIONS",
    "ModelShape",
    "shape_from_model",
    "shape_flops",
    "flops_per_iteration",
    "megatron_args",
    "mfu",
    "sc21_flops",
    "legacy_flops",
    "current_flops",
    "six_n_flops",
]
