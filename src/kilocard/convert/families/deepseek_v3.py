"""DeepSeek-V3 (``DeepseekV3ForCausalLM``; Kimi-K2 has the same layout): multi-latent attention (``q_a_proj``,
``q_a_layernorm``, ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``), the first
``first_k_dense_replace`` layers dense, then MoE layers of routed experts with shared experts and a sigmoid
router whose expert bias is ``gate.e_score_correction_bias``.

Both sides take the rotary half of the query and key heads interleaved (transformers' ``rope_interleave``,
Megatron-Core's MLA rotary embedding), so no row permutation is needed. A ``q_lora_rank`` of null (DeepSeek-V2-Lite's
layout) projects the query directly: ``q_proj`` is Megatron-Core's ``linear_q_proj``, with no query latent norm.
RoPE is plain (``rope_type: rope``) or YaRN (``rope_type: yarn``; ``rope_scaling``/``rope_parameters`` of type
``yarn``), whose six parameters carry Megatron-Core's names (``yarn_fields``).

The multi-token-prediction layers live where DeepSeek's own checkpoints keep them (transformers' model ignores
them): MTP layer ``j`` is ``model.layers.{num_hidden_layers + j}.``, its ``enorm``, ``hnorm``, ``eh_proj`` and
``shared_head.norm`` Megatron-Core's ``mtp.layers.{j}.enorm``/``hnorm``/``eh_proj``/``final_layernorm``, the rest a
decoder layer of the last layer's kind (``mtp.layers.{j}.transformer_layer.``; megatron-core 0.19 calls it
``mtp_model_layer``: ``kilocard.convert.model.tensors``), and its ``embed_tokens`` and
``shared_head.head`` copies of the main model's embedding and output layer, which Megatron-Core shares (an import
refuses a copy that differs). An import without a recipe takes as many MTP layers as the checkpoint holds
(``mtp_num_layers``; transformers' own saves hold none); one into a model without MTP leaves them out and says so on
its line. An export writes them, with ``num_nextn_predict_layers``, as Megatron-Bridge's AutoBridge does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.base import Family, expert_slots
from kilocard.convert.families.yarn import (
    YARN_FIELDS,
    YARN_KEYS,
    check_mscale,
    yarn_expects,
    yarn_mscale,
    yarn_parameters,
)
from kilocard.convert.spec import ConvertError, Expect, Slot


def dense_layers(m: ModelConfig) -> int:
    """Leading dense layers of ``moe_layer_freq`` (``first_k_dense_replace``); refuses any other pattern."""
    freq = m.moe_layer_freq
    pattern = [1] * m.num_layers if freq == 1 else list(freq) if isinstance(freq, list | tuple) else None
    k = pattern.index(1) if pattern and 1 in pattern else m.num_layers
    if pattern is None or pattern != [0] * k + [1] * (m.num_layers - k):
        raise ConvertError(
            f"model.moe_layer_freq: {freq!r} has no deepseek_v3 Hugging Face equivalent (expected leading dense "
            f"layers then MoE layers, first_k_dense_replace); pick a recipe whose model the layout can hold"
        )
    return k


MTP_OWN = (("enorm", "enorm"), ("hnorm", "hnorm"), ("shared_head.norm", "final_layernorm"))
"""An MTP layer's own norms: (Hugging Face name after ``model.layers.{L + j}.``, Megatron-Core's after
``mtp.layers.{j}.``)."""


def mtp_layers(c: dict[str, Any], names: set[str]) -> int:
    """How many MTP layers (``model.layers.{num_hidden_layers + j}.eh_proj.weight``) the tensor ``names`` hold."""
    layers, j = c["num_hidden_layers"], 0
    while f"model.layers.{layers + j}.eh_proj.weight" in names:
        j += 1
    return j


def mtp_slots(fam: Family, m: ModelConfig, j: int) -> list[Slot]:
    """MTP layer ``j``'s tensors: its norms and projection, a decoder layer of the last layer's kind, and the
    embedding and output layer it shares with the main model."""
    last, h, v = m.num_layers - 1, m.hidden_size, m.vocab_size
    p, t = f"model.layers.{m.num_layers + j}.", f"mtp.layers.{j}."
    own = [Slot(p + f"{x}.weight", t + f"{y}.weight", "all", (h,)) for x, y in MTP_OWN]
    own.append(Slot(p + "eh_proj.weight", t + "eh_proj.weight", "all", (h, 2 * h)))
    layer = [
        dataclasses.replace(
            s,
            hf=s.hf.replace(f"model.layers.{last}.", p, 1),
            mcore=s.mcore.replace(f"decoder.layers.{last}.", t + "transformer_layer.", 1),
        )
        for s in fam.layer_slots(m, last)
    ]
    head = "embedding.word_embeddings.weight" if m.share_embeddings_and_output_weights else "output_layer.weight"
    shared = [
        Slot(p + "embed_tokens.weight", "embedding.word_embeddings.weight", "rows", (v, h)),
        Slot(p + "shared_head.head.weight", head, "rows", (v, h)),
    ]
    return [*own, *layer, *shared]


def yarn_fields(rope: dict[str, Any]) -> dict[str, Any]:
    """The ``model.*`` fields of a ``config.json``'s RoPE (``rope_parameters``, after ``yarn_parameters``)."""
    kind = rope["rope_type"]
    if kind == "default":
        return {"rope_type": "rope"}
    if kind != "yarn":
        raise ConvertError(
            f"config.json: rope_parameters.rope_type is {kind!r}; Megatron-Core's multi-latent attention takes "
            f"default or yarn RoPE"
        )
    return {"rope_type": "yarn", **{f: rope[k] for k, f in zip(YARN_KEYS, YARN_FIELDS, strict=True)}}


def mla_rope_expects(m: ModelConfig) -> list[Expect]:
    """RoPE's ``config.json`` values: plain, or YaRN's six parameters (``yarn_fields``)."""
    out = [Expect("rope_parameters.rope_theta", float(m.rotary_base), "rotary_base")]
    if m.rope_type == "rope":
        return [*out, Expect("rope_parameters.rope_type", "default", "rope_type")]
    return [*out, Expect("rope_parameters.rope_type", "yarn", "rope_type"), *yarn_expects(m)]


def check_rope(m: ModelConfig) -> None:
    """Refuse RoPE settings on which transformers and Megatron-Core would attend differently, naming the field."""
    if m.rope_type == "rope" and yarn_mscale(m.rotary_scaling_factor, m.mscale_all_dim) != 1.0:
        raise ConvertError(
            f"model.mscale_all_dim: {m.mscale_all_dim} with rope_type rope: Megatron-Core still scales the softmax "
            f"by (0.1 x mscale_all_dim x ln(rotary_scaling_factor) + 1)^2, transformers' plain RoPE does not; set "
            f"model.mscale_all_dim=0 or model.rope_type=yarn"
        )
    if m.rope_type == "yarn":
        check_mscale(m)


class DeepseekV3(Family):
    """MLA, leading dense layers, sigmoid-routed experts with expert bias, group-limited routing, shared experts."""

    model_type = "deepseek_v3"
    architecture = "DeepseekV3ForCausalLM"
    base_recipe = "tiny_deepseek_v3"
    moe = True

    def claims(self, m: ModelConfig) -> bool:
        return m.multi_latent_attention and bool(m.num_moe_experts)

    def requirements(self, m: ModelConfig) -> list[tuple[str, Any]]:
        return [
            ("normalization", "RMSNorm"),
            ("activation", "swiglu"),
            ("add_bias_linear", False),
            ("add_qkv_bias", False),
            ("multi_latent_attention", True),
            ("qk_layernorm", True),
            ("num_query_groups", None),
            ("moe_router_score_function", "sigmoid"),
            ("moe_router_enable_expert_bias", True),
            ("moe_router_pre_softmax", False),
        ]

    def check_model(self, m: ModelConfig) -> None:
        super().check_model(m)
        dense_layers(m)
        check_rope(m)
        if not m.moe_shared_expert_intermediate_size:
            raise ConvertError(
                f"model.moe_shared_expert_intermediate_size: {m.moe_shared_expert_intermediate_size!r} has no "
                f"{self.model_type} Hugging Face equivalent; set it"
            )
        groups, pick = m.moe_router_num_groups, m.moe_router_group_topk
        if groups and pick and m.moe_router_topk != 2 * pick:
            raise ConvertError(
                f"model.moe_router_group_topk: {pick}: transformers scores a group by its best 2 experts, "
                f"Megatron-Core "
                f"by its best moe_router_topk // group_topk = {m.moe_router_topk // pick}; they agree only when "
                f"moe_router_topk = 2 x moe_router_group_topk"
            )

    def expected_config(self, m: ModelConfig) -> list[Expect]:
        shared = (m.moe_shared_expert_intermediate_size or 0) // (m.moe_ffn_hidden_size or 1)
        return [
            Expect("model_type", self.model_type, None),
            Expect("num_hidden_layers", m.num_layers, "num_layers"),
            Expect("hidden_size", m.hidden_size, "hidden_size"),
            Expect("intermediate_size", m.ffn_hidden_size or 4 * m.hidden_size, "ffn_hidden_size"),
            Expect("num_attention_heads", m.num_attention_heads, "num_attention_heads"),
            Expect("num_key_value_heads", m.num_attention_heads, "num_query_groups"),
            Expect("vocab_size", m.vocab_size, "vocab_size"),
            Expect("rms_norm_eps", m.layernorm_epsilon, "layernorm_epsilon"),
            Expect("tie_word_embeddings", m.share_embeddings_and_output_weights, "share_embeddings_and_output_weights"),
            Expect("hidden_act", "silu", "activation"),
            *mla_rope_expects(m),
            Expect("rope_interleave", True, None),
            Expect("attention_bias", False, "add_bias_linear"),
            Expect("q_lora_rank", m.q_lora_rank, "q_lora_rank"),
            Expect("kv_lora_rank", m.kv_lora_rank, "kv_lora_rank"),
            Expect("qk_nope_head_dim", m.qk_head_dim, "qk_head_dim"),
            Expect("qk_rope_head_dim", m.qk_pos_emb_head_dim, "qk_pos_emb_head_dim"),
            Expect("v_head_dim", m.v_head_dim, "v_head_dim"),
            Expect("n_routed_experts", m.num_moe_experts, "num_moe_experts"),
            Expect("num_experts_per_tok", m.moe_router_topk, "moe_router_topk"),
            Expect("moe_intermediate_size", m.moe_ffn_hidden_size, "moe_ffn_hidden_size"),
            Expect("n_shared_experts", shared, "moe_shared_expert_intermediate_size"),
            Expect("first_k_dense_replace", dense_layers(m), "moe_layer_freq"),
            Expect("n_group", m.moe_router_num_groups or 1, "moe_router_num_groups"),
            Expect("topk_group", m.moe_router_group_topk or 1, "moe_router_group_topk"),
            Expect("routed_scaling_factor", float(m.moe_router_topk_scaling_factor or 1.0),
                   "moe_router_topk_scaling_factor"),
            Expect("norm_topk_prob", True, None),
        ]  # fmt: skip

    def tensor_fields(self, c: dict[str, Any], names: set[str]) -> dict[str, Any]:
        return {"mtp_num_layers": mtp_layers(c, names) or None}

    def left_out(self, m: ModelConfig, names: set[str]) -> tuple[set[str], list[str]]:
        held = mtp_layers({"num_hidden_layers": m.num_layers}, names) - (m.mtp_num_layers or 0)
        if held <= 0:
            return set(), []
        first = m.num_layers + (m.mtp_num_layers or 0)
        prefixes = tuple(f"model.layers.{first + j}." for j in range(held))
        out = {n for n in names if n.startswith(prefixes)}
        where = f"model.layers.{first}.*" if held == 1 else f"model.layers.{first}-{first + held - 1}.*"
        phrase = (
            f"the {held} multi-token-prediction layer(s) {where} ({len(out)} tensors: model.mtp_num_layers is "
            f"{m.mtp_num_layers or 'null'})"
        )
        return out, [phrase]

    def extra_slots(self, m: ModelConfig) -> list[Slot]:
        return [s for j in range(m.mtp_num_layers or 0) for s in mtp_slots(self, m, j)]

    def export_extras(self, m: ModelConfig) -> dict[str, Any]:
        return {"num_nextn_predict_layers": m.mtp_num_layers or 0}

    def normalized(self, c: dict[str, Any]) -> dict[str, Any]:
        """transformers' defaults of keys DeepSeek's own ``config.json`` files leave out (``rope_interleave``: true),
        and YaRN's (``yarn_parameters``)."""
        c = {"rope_interleave": True, **c}
        rope = c["rope_parameters"]
        if rope.get("rope_type") != "yarn":
            return c
        return {**c, "rope_parameters": yarn_parameters(rope, c.get("max_position_embeddings") or 4096)}

    def model_from_config(self, c: dict[str, Any]) -> dict[str, Any]:
        layers, dense = c["num_hidden_layers"], c["first_k_dense_replace"]
        groups, pick = c.get("n_group") or 1, c.get("topk_group") or 1
        out = {
            "num_layers": layers,
            "hidden_size": c["hidden_size"],
            "num_attention_heads": c["num_attention_heads"],
            "num_query_groups": None,
            "kv_channels": c["v_head_dim"],
            "vocab_size": c["vocab_size"],
            "layernorm_epsilon": float(c.get("rms_norm_eps", 1e-6)),
            "share_embeddings_and_output_weights": bool(c["tie_word_embeddings"]),
            "rotary_base": int(c["rope_parameters"]["rope_theta"]),
            **yarn_fields(c["rope_parameters"]),
            "ffn_hidden_size": c["intermediate_size"],
            "q_lora_rank": c["q_lora_rank"],
            "kv_lora_rank": c["kv_lora_rank"],
            "qk_head_dim": c["qk_nope_head_dim"],
            "qk_pos_emb_head_dim": c["qk_rope_head_dim"],
            "v_head_dim": c["v_head_dim"],
            "num_moe_experts": c["n_routed_experts"],
            "moe_router_topk": c["num_experts_per_tok"],
            "moe_ffn_hidden_size": c["moe_intermediate_size"],
            "moe_shared_expert_intermediate_size": c["n_shared_experts"] * c["moe_intermediate_size"],
            "moe_layer_freq": [0] * dense + [1] * (layers - dense),
            "moe_router_num_groups": groups if groups > 1 else None,
            "moe_router_group_topk": pick if groups > 1 else None,
            "moe_router_topk_scaling_factor": float(c.get("routed_scaling_factor") or 1.0),
            "mtp_num_layers": None,
            "max_position_embeddings": c.get("max_position_embeddings") or 4096,
        }
        out["seq_length"] = min(out["max_position_embeddings"], 8192)
        return out

    def attention_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        h, heads, q = m.hidden_size, m.num_attention_heads, m.qk_head_dim + m.qk_pos_emb_head_dim
        a, s = p + "self_attn.", t + "self_attention."
        rank, kv, rope = m.q_lora_rank, m.kv_lora_rank, m.qk_pos_emb_head_dim
        kv_up = heads * (m.qk_head_dim + m.v_head_dim)
        query = (
            [Slot(a + "q_proj.weight", s + "linear_q_proj.weight", "all", (heads * q, h))]
            if rank is None
            else [
                Slot(a + "q_a_proj.weight", s + "linear_q_down_proj.weight", "all", (rank, h)),
                Slot(a + "q_a_layernorm.weight", s + "q_layernorm.weight", "all", (rank,)),
                Slot(a + "q_b_proj.weight", s + "linear_q_up_proj.weight", "all", (heads * q, rank)),
            ]
        )
        return [
            Slot(p + "input_layernorm.weight", t + "input_layernorm.weight", "all", (h,)),
            *query,
            Slot(a + "kv_a_proj_with_mqa.weight", s + "linear_kv_down_proj.weight", "all", (kv + rope, h)),
            Slot(a + "kv_a_layernorm.weight", s + "kv_layernorm.weight", "all", (kv,)),
            Slot(a + "kv_b_proj.weight", s + "linear_kv_up_proj.weight", "all", (kv_up, kv)),
            Slot(a + "o_proj.weight", s + "linear_proj.weight", "all", (h, heads * m.v_head_dim)),
        ]  # fmt: skip

    def layer_slots(self, m: ModelConfig, i: int) -> list[Slot]:
        p, t = f"model.layers.{i}.", f"decoder.layers.{i}."
        norm = Slot(p + "post_attention_layernorm.weight", t + "pre_mlp_layernorm.weight", "all", (m.hidden_size,))
        if i < dense_layers(m):
            return [*self.attention_slots(m, p, t), norm, *self.mlp_slots(m, p, t)]
        moe = p + "mlp."
        routed = expert_slots(
            m, t, moe + "gate.weight", moe + "experts.", ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
        )
        bias = Slot(
            moe + "gate.e_score_correction_bias", t + "mlp.router.expert_bias", "all", (m.num_moe_experts or 0,)
        )
        h, f = m.hidden_size, m.moe_shared_expert_intermediate_size or 0
        shared = [
            Slot(moe + "shared_experts.gate_proj.weight", t + "mlp.shared_experts.linear_fc1.weight", "gate", (f, h)),
            Slot(moe + "shared_experts.up_proj.weight", t + "mlp.shared_experts.linear_fc1.weight", "up", (f, h)),
            Slot(moe + "shared_experts.down_proj.weight", t + "mlp.shared_experts.linear_fc2.weight", "all", (h, f)),
        ]
        return [*self.attention_slots(m, p, t), norm, *routed, bias, *shared]  # fmt: skip


FAMILY = DeepseekV3()
