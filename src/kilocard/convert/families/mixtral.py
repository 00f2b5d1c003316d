"""Mixtral (``MixtralForCausalLM``): Llama's attention, every MLP a softmax-routed MoE block without shared
experts (``block_sparse_moe``: router ``gate``, experts ``w1`` gate / ``w3`` up / ``w2`` down)."""

from __future__ import annotations

from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.base import Family, expert_slots, moe_fields
from kilocard.convert.spec import Expect, Slot


class Mixtral(Family):
    """Top-k softmax routing over ``num_local_experts`` experts in every layer; no sliding window."""

    model_type = "mixtral"
    architecture = "MixtralForCausalLM"
    base_recipe = "tiny_mixtral"
    moe = True

    def mlp_expects(self, m: ModelConfig) -> list[Expect]:
        return [
            Expect("intermediate_size", m.moe_ffn_hidden_size or m.ffn_hidden_size, "moe_ffn_hidden_size"),
            Expect("num_local_experts", m.num_moe_experts, "num_moe_experts"),
            Expect("num_experts_per_tok", m.moe_router_topk, "moe_router_topk"),
            Expect("sliding_window", None, None),
        ]

    def extra_expects(self, m: ModelConfig) -> list[Expect]:
        return []

    def model_from_config(self, c: dict[str, Any]) -> dict[str, Any]:
        out = {**super().model_from_config(c), **moe_fields(c, "intermediate_size", "num_local_experts")}
        return out

    def mlp_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        moe = p + "block_sparse_moe."
        return expert_slots(m, t, moe + "gate.weight", moe + "experts.", ("w1.weight", "w3.weight", "w2.weight"))


FAMILY = Mixtral()
