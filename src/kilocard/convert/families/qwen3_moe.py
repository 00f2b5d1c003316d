"""Qwen3-MoE (``Qwen3MoeForCausalLM``): Qwen3's attention, every MLP an MoE block of softmax-routed experts
without a shared expert (``mlp.gate`` router, ``mlp.experts.{e}.gate_proj/up_proj/down_proj``).

``norm_topk_prob`` (true for the published models) renormalises the k chosen experts' softmax weights to
sum to one: Megatron-Core's softmax over the k selected logits, ``moe_router_pre_softmax: false``; false
keeps the softmax over all experts, ``moe_router_pre_softmax: true`` (as Megatron-Bridge's Qwen3-MoE
provider maps the normalised case). ``decoder_sparse_step`` 1 and no ``mlp_only_layers``: every layer is MoE.
"""

from __future__ import annotations

from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.base import Family, expert_slots, moe_fields
from kilocard.convert.families.qwen3 import Qwen3
from kilocard.convert.spec import Expect, Slot


class Qwen3Moe(Qwen3):
    """Qwen3 with ``num_experts`` routed experts (top ``num_experts_per_tok``) in every layer."""

    model_type = "qwen3_moe"
    architecture = "Qwen3MoeForCausalLM"
    base_recipe = "tiny_qwen3_moe"
    moe = True

    def requirements(self, m: ModelConfig) -> list[tuple[str, Any]]:
        return [r for r in super().requirements(m) if r[0] != "moe_router_pre_softmax"]  # norm_topk_prob holds it

    def mlp_expects(self, m: ModelConfig) -> list[Expect]:
        return [
            *Family.mlp_expects(self, m),
            Expect("moe_intermediate_size", m.moe_ffn_hidden_size or m.ffn_hidden_size, "moe_ffn_hidden_size"),
            Expect("num_experts", m.num_moe_experts, "num_moe_experts"),
            Expect("num_experts_per_tok", m.moe_router_topk, "moe_router_topk"),
            Expect("norm_topk_prob", not m.moe_router_pre_softmax, "moe_router_pre_softmax"),
            Expect("decoder_sparse_step", 1, None),  # every layer MoE: dense layers between are not mapped
            Expect("mlp_only_layers", [], None),
        ]

    def normalized(self, c: dict[str, Any]) -> dict[str, Any]:
        """transformers 5 writes ``num_local_experts``, the published files and transformers 4 ``num_experts``."""
        out = dict(c)
        out.setdefault("num_experts", out.get("num_local_experts"))
        out.setdefault("decoder_sparse_step", 1)
        out.setdefault("mlp_only_layers", [])
        out.setdefault("norm_topk_prob", False)  # transformers' default
        return out

    def model_from_config(self, c: dict[str, Any]) -> dict[str, Any]:
        out = {**super().model_from_config(c), **moe_fields(c, "moe_intermediate_size", "num_experts")}
        out["moe_router_pre_softmax"] = not c["norm_topk_prob"]
        return out

    def mlp_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        names = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
        return expert_slots(m, t, p + "mlp.gate.weight", p + "mlp.experts.", names)


FAMILY = Qwen3Moe()
