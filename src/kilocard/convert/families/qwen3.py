"""Qwen3 dense (``Qwen3ForCausalLM``): Llama's decoder with a per-head RMSNorm on queries and keys
(``q_norm`` / ``k_norm``: Megatron-Core's ``qk_layernorm``), no q/k/v bias, and its own head size
(``head_dim``, not hidden / heads: ``model.kv_channels``)."""

from __future__ import annotations

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.base import Family
from kilocard.convert.spec import Expect


class Qwen3(Family):
    """QK layernorm, no attention bias, no sliding window."""

    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    base_recipe = "tiny_qwen3"
    qk_norm = True

    def extra_expects(self, m: ModelConfig) -> list[Expect]:
        return [Expect("attention_bias", False, "add_qkv_bias"), Expect("use_sliding_window", False, None)]


FAMILY = Qwen3()
