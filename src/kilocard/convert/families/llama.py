"""Llama 2 / 3 / 3.1 (``LlamaForCausalLM``): the decoder ``Family``'s defaults; Llama 3.1's RoPE scaling is
``model.rope_scaling``."""

from __future__ import annotations

from kilocard.convert.families.base import Family


class Llama(Family):
    """Grouped-query attention without biases, RMSNorm, SwiGLU, RoPE (optionally Llama 3.1 scaled)."""

    model_type = "llama"
    architecture = "LlamaForCausalLM"
    base_recipe = "tiny_llama"


FAMILY = Llama()
