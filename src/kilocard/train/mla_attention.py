"""Multi-latent attention on Megatron-Core's local (pure PyTorch) modules.

Megatron-Core's ``MLASelfAttention`` builds its core attention with ``k_channels`` (the query/key head size,
non-rotary plus rotary) and ``v_channels`` (the value head size), which Transformer Engine's attention takes
and the local ``DotProductAttention`` does not (0.16.1 and 0.19.2 alike): the local layer spec with
``multi_latent_attention`` fails to build. ``MLADotProductAttention`` is that local class taking both: the
scores need only the softmax scale MLA passes in, and the context is ``v_channels`` wide per head.
"""

from __future__ import annotations

from typing import Any

from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.spec_utils import ModuleSpec


class MLADotProductAttention(DotProductAttention):
    """Megatron-Core's local ``DotProductAttention`` with MLA's head sizes."""

    def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.k_channels = k_channels
        if v_channels is not None:
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    def forward(self, query: Any, key: Any, value: Any, *args: Any, **kw: Any) -> Any:
        """The local attention on contiguous keys and values (MLA concatenates and splits them)."""
        return super().forward(query, key.contiguous(), value.contiguous(), *args, **kw)


def use_local_mla_attention(spec: Any) -> Any:
    """``spec`` (a layer ``ModuleSpec`` or a block's submodules) with every MLA layer's core attention the
    local ``MLADotProductAttention``; other layers unchanged. Changes the fresh spec in place."""
    layers = spec.layer_specs if hasattr(spec, "layer_specs") else [spec]
    for layer in layers:
        attention = layer.submodules.self_attention
        if isinstance(attention, ModuleSpec) and hasattr(attention.submodules, "linear_kv_down_proj"):
            attention.submodules.core_attention = MLADotProductAttention
    return spec
