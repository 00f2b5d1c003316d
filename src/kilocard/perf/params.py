"""Parameter counts of a Megatron-Core GPTModel built from a ``ModelConfig`` (no torch needed)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from kilocard.config.megatron import padded_vocab_size  # the one definition; the FLOPs models import it from here
from kilocard.config.schema import ModelConfig


@dataclass(frozen=True)
class MoePattern(Sequence[bool]):
    """Layers ``start .. stop - 1`` of a model in which every ``freq``-th layer (from layer 0) is an MoE layer,
    as a sequence of bools whose length, items, slices and ``moe_count`` cost the same for any layer count:
    validation and the estimates never walk the layers one by one."""

    start: int
    """First layer."""
    stop: int
    """One past the last layer."""
    freq: int
    """Every ``freq``-th layer is MoE (0: none is, a dense model)."""

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    @overload
    def __getitem__(self, i: int) -> bool: ...
    @overload
    def __getitem__(self, i: slice) -> MoePattern: ...
    def __getitem__(self, i: int | slice) -> bool | MoePattern:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                raise ValueError("MoePattern slices take no step")
            return MoePattern(self.start + a, self.start + max(a, b), self.freq)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        layer = self.start + (i % n)
        return self.freq > 0 and layer % self.freq == 0

    def __iter__(self) -> Iterator[bool]:
        return (self[i] for i in range(len(self)))

    @property
    def moe_count(self) -> int:
        """MoE layers in the pattern, counted without a walk."""
        f = self.freq
        return 0 if f <= 0 or len(self) == 0 else (self.stop + f - 1) // f - (self.start + f - 1) // f


def moe_layer_pattern(m: ModelConfig) -> Sequence[bool]:
    """For each layer, whether it is an MoE layer (Megatron-Core's ``moe_layer_freq`` rule: an int k makes
    every k-th layer MoE, a list gives 0/1 per layer); all ``False`` for a dense model. The int and dense
    forms are a ``MoePattern`` (constant time for any layer count)."""
    freq = m.moe_layer_freq
    if m.num_moe_experts and not isinstance(freq, int):
        return [bool(x) for x in list(freq)]
    return MoePattern(0, m.num_layers, max(1, freq) if m.num_moe_experts else 0)


def moe_count(pattern: Sequence[bool]) -> int:
    """MoE layers in ``pattern`` (a ``MoePattern`` without walking its layers)."""
    return pattern.moe_count if isinstance(pattern, MoePattern) else sum(pattern)


def is_gated(m: ModelConfig) -> bool:
    """Whether the MLP is gated (``gated_linear_unit``, or ``activation: swiglu``, which the adapter builds gated)."""
    return bool(m.gated_linear_unit or m.activation == "swiglu")


def is_swiglu(m: ModelConfig) -> bool:
    """Whether the MLP is SwiGLU (a SiLU gate): Megatron-LM's ``args.swiglu`` (``--swiglu``). Its FLOPs count
    gives a gated MLP its third matrix only then (Megatron-LM ``training.py`` ``gated_linear_multiplier``;
    Megatron-Bridge ``flop_utils.py``: ``gated_linear_unit and activation_func == F.silu``), so GPT-OSS's
    quick-GeGLU (``--quick-geglu``) is counted as two matrices."""
    return m.activation == "swiglu"


def windowed_layers(m: ModelConfig) -> int:
    """Layers that run sliding-window attention (Megatron-Core ``is_layer_window_attention``: with
    ``window_size`` set, every layer unless ``window_attn_skip_freq`` is an int k, which keeps layers
    k, 2k, ... (1-based) full, or a 0/1 list, 1 = windowed); 0 without a window."""
    if m.window_size is None:
        return 0
    skip = m.window_attn_skip_freq
    if skip is None:
        return m.num_layers
    if isinstance(skip, int):
        return m.num_layers - (m.num_layers // skip if skip > 0 else 0)
    return sum(1 for x in list(skip) if x)


def kv_channels(m: ModelConfig) -> int:
    """Per-head projection size."""
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def attention_params(m: ModelConfig) -> int:
    """Parameters of one attention block (projections, biases, MLA norms, per-head query/key norms with
    ``qk_layernorm``), without the input norm."""
    h, n = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = h * n * qk if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * n * qk
        kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank
        kv += m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim)
        return q + kv + n * m.v_head_dim * h + (h if m.add_bias_linear else 0)
    d = kv_channels(m)
    groups = m.num_query_groups or n
    qkv_out = (n + 2 * groups) * d
    bias = qkv_out if (m.add_bias_linear or m.add_qkv_bias) else 0
    qk_norms = 2 * d * (2 if m.normalization == "LayerNorm" else 1) if m.qk_layernorm else 0
    return h * qkv_out + bias + n * d * h + (h if m.add_bias_linear else 0) + qk_norms


def mlp_params(m: ModelConfig, ffn: int) -> int:
    """Parameters of one MLP of hidden size ``ffn`` (gated: two input projections)."""
    h = m.hidden_size
    up = h * ffn * (2 if is_gated(m) else 1)
    bias = (ffn * (2 if is_gated(m) else 1) + h) if m.add_bias_linear else 0
    return up + ffn * h + bias


def norm_params(m: ModelConfig) -> int:
    """Parameters of one normalisation layer."""
    return m.hidden_size * (2 if m.normalization == "LayerNorm" else 1)


@dataclass(frozen=True)
class ParamCount:
    """Parameter totals of a model."""

    total: int
    """Every parameter, embedding and output layer included."""
    active: int
    """Parameters a token passes through (routed experts counted top-k times, not all)."""
    embedding: int
    """Input embedding (+ learned positions) and, when untied, the output layer."""


def count_parameters(m: ModelConfig) -> ParamCount:
    """Count total and active parameters (MTP layers excluded, as model cards report them)."""
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    moe_ffn = m.moe_ffn_hidden_size or ffn
    vocab = padded_vocab_size(m)
    emb = vocab * m.hidden_size
    if m.position_embedding_type == "learned_absolute":
        emb += m.max_position_embeddings * m.hidden_size
    if not m.share_embeddings_and_output_weights:
        emb += vocab * m.hidden_size
    total = active = emb + norm_params(m)
    per_layer_common = attention_params(m) + 2 * norm_params(m)
    n_moe = moe_count(moe_layer_pattern(m))
    n_dense = m.num_layers - n_moe
    total += m.num_layers * per_layer_common + n_dense * mlp_params(m, ffn)
    active += m.num_layers * per_layer_common + n_dense * mlp_params(m, ffn)
    if n_moe:
        experts = m.num_moe_experts or 0
        shared = mlp_params(m, m.moe_shared_expert_intermediate_size) if m.moe_shared_expert_intermediate_size else 0
        router = m.hidden_size * experts
        total += n_moe * (router + shared + experts * mlp_params(m, moe_ffn))
        active += n_moe * (router + shared + m.moe_router_topk * mlp_params(m, moe_ffn))
    return ParamCount(total=total, active=active, embedding=emb)


def lora_shapes(m: ModelConfig) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each linear layer a LoRA adapter can wrap (``LORA_TARGETS``), whole
    (before tensor-parallel sharding): the adapter's A is ``dim x in``, its B ``out x dim``."""
    d = kv_channels(m)
    q, kv = m.num_attention_heads * d, (m.num_query_groups or m.num_attention_heads) * d
    return linear_shapes(m.hidden_size, q, kv, m.ffn_hidden_size or 4 * m.hidden_size, is_gated(m))


def linear_shapes(hidden: int, q: int, kv: int, ffn: int, gated: bool) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of a layer's ``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2`` from its widths
    (``q``: query heads x head size, ``kv``: query groups x head size)."""
    return {
        "linear_qkv": (hidden, q + 2 * kv),
        "linear_proj": (q, hidden),
        "linear_fc1": (hidden, ffn * (2 if gated else 1)),
        "linear_fc2": (ffn, hidden),
    }


def lora_params_per_layer(m: ModelConfig, dim: int, targets: Sequence[str]) -> int:
    """Adapter parameters of one transformer layer: ``dim * (in + out)`` per target module."""
    shapes = lora_shapes(m)
    return sum(dim * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)
