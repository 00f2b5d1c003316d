"""Qwen2 / Qwen2.5 (``Qwen2ForCausalLM``): Llama's decoder with a bias on the q/k/v projections."""

from __future__ import annotations

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.base import Family
from kilocard.convert.spec import Expect


class Qwen2(Family):
    """QKV bias (``model.add_qkv_bias``), no sliding window."""

    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    base_recipe = "tiny_qwen2"
    qkv_bias = True

    def extra_expects(self, m: ModelConfig) -> list[Expect]:
        return [Expect("use_sliding_window", False, None)]


FAMILY = Qwen2()
