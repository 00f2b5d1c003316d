"""Kimi-K2's own ``config.json`` (``model_type: kimi_k2``): DeepSeek-V3's fields and tensors (``deepseek_v3``),
with YaRN RoPE, one leading dense layer and no expert groups in the published model.

Moonshot's checkpoint names ``kimi_k2`` with remote code (its ``configuration_deepseek.py``), which kilocard never
runs: ``config.json`` is read as data and the weights as safetensors, exactly as for ``deepseek_v3`` (transformers'
own ``KimiK25Config`` reads a ``kimi_k2`` text model as ``deepseek_v3`` the same way). An export writes
``model_type: deepseek_v3`` and says so on its line: transformers knows no ``kimi_k2`` type, and its
``DeepseekV3ForCausalLM`` loads a folder of that type without its fused-expert renaming (which it keys on
``deepseek_v3``), leaving the routed experts at random values.
"""

from __future__ import annotations

from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.deepseek_v3 import DeepseekV3


class KimiK2(DeepseekV3):
    """DeepSeek-V3's layout under Kimi-K2's ``model_type``; exported as ``deepseek_v3``."""

    model_type = "kimi_k2"

    def claims(self, m: ModelConfig) -> bool:
        return False  # a model with no recorded source exports as deepseek_v3, the type this family writes

    def dropped(self, m: ModelConfig) -> list[str]:
        written = "model_type kimi_k2 (written as deepseek_v3, the same layout, which transformers loads)"
        return [*super().dropped(m), written]

    def export_extras(self, m: ModelConfig) -> dict[str, Any]:
        return {**super().export_extras(m), "model_type": "deepseek_v3"}


FAMILY = KimiK2()
