"""``Family``: everything kilocard knows about one Hugging Face model family, in one object.

A family says which ``config.json`` it reads (``model_type``) and writes (``architecture``), which kilocard
models it can hold (``requirements``), the ``config.json`` values a recipe's model implies
(``expected_config``), the model a ``config.json`` describes (``model_from_config``, as Megatron-Bridge's
AutoBridge derives one) and where every Hugging Face tensor lives in the Megatron-Core state dict
(``layer_slots``). The defaults here are the Llama decoder (grouped-query attention, RMSNorm, SwiGLU, RoPE,
optionally an MoE block); a family module overrides what differs. No torch: the tensor copies are
``kilocard.convert.maps``'s.
"""

from __future__ import annotations

from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.spec import ConvertError, Expect, Slot

MCORE_ROPE_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""Llama 3.1 RoPE scaling constants Megatron-Core hard-codes (``RotaryEmbedding._apply_scaling``);
only the factor is a parameter (``model.rope_scaling_factor``)."""


def head_dim(m: ModelConfig) -> int:
    """Per-head size of queries, keys and values."""
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def rope_expects(m: ModelConfig) -> list[Expect]:
    """RoPE's ``config.json`` values (``rope_parameters``): default, or Llama 3.1 scaling."""
    out = [Expect("rope_parameters.rope_theta", float(m.rotary_base), "rotary_base")]
    if not m.rope_scaling:
        return [*out, Expect("rope_parameters.rope_type", "default", "rope_scaling")]
    out += [
        Expect("rope_parameters.rope_type", "llama3", "rope_scaling"),
        Expect("rope_parameters.factor", float(m.rope_scaling_factor), "rope_scaling_factor"),
    ]
    return out + [Expect(f"rope_parameters.{k}", v, None) for k, v in MCORE_ROPE_SCALING.items()]


class Family:
    """One Hugging Face family (this base: the Llama decoder); subclasses override what differs."""

    model_type: str = ""
    """``config.json``'s ``model_type`` (the registry's key)."""
    architecture: str = ""
    """The ``architectures`` entry an export writes."""
    base_recipe: str = ""
    """The tiny recipe an import without ``recipe=`` starts from: it gives what ``config.json`` does not say
    (norm, activation, router settings, a local CPU profile, mock data); every shape field comes from
    ``config.json``."""
    moe: bool = False
    """Whether the family's layers are MoE layers (every one: ``moe_layer_freq`` 1)."""
    qkv_bias: bool = False
    """Whether q/k/v projections carry a bias (``add_qkv_bias``)."""
    qk_norm: bool = False
    """Whether queries and keys are RMS-normalised per head before attention (``qk_layernorm``)."""

    def claims(self, m: ModelConfig) -> bool:
        """Whether a kilocard model with no recorded source exports as this family (the registry asks the
        families in order, most specific first)."""
        wants = ((m.add_qkv_bias, self.qkv_bias), (m.qk_layernorm, self.qk_norm))
        return bool(m.num_moe_experts) == self.moe and all(has or not needed for has, needed in wants)

    # --- what the family can hold -------------------------------------------------------------------

    def requirements(self, m: ModelConfig) -> list[tuple[str, Any]]:
        """``(model field, value)`` pairs every model of this family has: anything else it cannot carry."""
        out: list[tuple[str, Any]] = [
            ("normalization", "RMSNorm"),
            ("activation", "swiglu"),
            ("add_bias_linear", False),
            ("position_embedding_type", "rope"),
            ("rotary_percent", 1.0),
            ("multi_latent_attention", False),
            ("mtp_num_layers", None),
            ("add_qkv_bias", self.qkv_bias),
            ("qk_layernorm", self.qk_norm),
        ]
        if not self.moe:
            return [*out, ("num_moe_experts", None)]
        out += [("moe_layer_freq", 1), ("moe_shared_expert_intermediate_size", None)]
        out += [("moe_router_score_function", "softmax"), ("moe_router_topk_scaling_factor", None)]
        out += [("moe_router_num_groups", None), ("moe_router_enable_expert_bias", False)]
        return [*out, ("moe_router_pre_softmax", False)]

    def check_model(self, m: ModelConfig) -> None:
        """Refuse a recipe model the family's Hugging Face layout cannot express, naming the field."""
        for name, value in self.requirements(m):
            if getattr(m, name) != value:
                raise ConvertError(
                    f"model.{name}: {getattr(m, name)!r} has no {self.model_type} Hugging Face equivalent "
                    f"(expected {value!r}); pick a recipe whose model the {self.model_type} layout can hold"
                )

    # --- config.json ---------------------------------------------------------------------------------

    def expected_config(self, m: ModelConfig) -> list[Expect]:
        """The ``config.json`` values the recipe's model implies (after ``check_model``).

        ``max_position_embeddings`` is written on export but not compared on import: RoPE has no position
        table, and a recipe may train at a shorter context than the model supports.
        """
        out = [
            Expect("model_type", self.model_type, None),
            Expect("num_hidden_layers", m.num_layers, "num_layers"),
            Expect("hidden_size", m.hidden_size, "hidden_size"),
            Expect("num_attention_heads", m.num_attention_heads, "num_attention_heads"),
            Expect("num_key_value_heads", m.num_query_groups or m.num_attention_heads, "num_query_groups"),
            Expect("head_dim", head_dim(m), "kv_channels"),
            Expect("vocab_size", m.vocab_size, "vocab_size"),
            Expect("rms_norm_eps", m.layernorm_epsilon, "layernorm_epsilon"),
            Expect("tie_word_embeddings", m.share_embeddings_and_output_weights, "share_embeddings_and_output_weights"),
            Expect("hidden_act", "silu", "activation"),
            *rope_expects(m),
        ]
        return out + self.mlp_expects(m) + self.extra_expects(m)

    def mlp_expects(self, m: ModelConfig) -> list[Expect]:
        """The MLP's ``config.json`` values (dense here)."""
        return [Expect("intermediate_size", m.ffn_hidden_size or 4 * m.hidden_size, "ffn_hidden_size")]

    def extra_expects(self, m: ModelConfig) -> list[Expect]:
        """The family's own ``config.json`` values (Llama: no attention or MLP bias)."""
        return [Expect("attention_bias", False, "add_qkv_bias"), Expect("mlp_bias", False, "add_bias_linear")]

    def with_defaults(self, c: dict[str, Any]) -> dict[str, Any]:
        """The raw ``config.json`` ``c`` with the values the family's transformers config class gives keys it lacks,
        where they differ from those ``maps.normalized`` then assumes (none here)."""
        return c

    def normalized(self, c: dict[str, Any]) -> dict[str, Any]:
        """``c`` (already ``maps.normalized``) with the family's own defaults and spellings made explicit."""
        return c

    def model_from_config(self, c: dict[str, Any]) -> dict[str, Any]:
        """The ``model.*`` fields a (``maps.normalized``) ``config.json`` decides (what ``expected_config``
        compares); ``seq_length`` is the context, at most 8192."""
        rope = c["rope_parameters"]
        out: dict[str, Any] = {
            "num_layers": c["num_hidden_layers"],
            "hidden_size": c["hidden_size"],
            "num_attention_heads": c["num_attention_heads"],
            "num_query_groups": c["num_key_value_heads"],
            "kv_channels": c["head_dim"],
            "vocab_size": c["vocab_size"],
            "layernorm_epsilon": float(c.get("rms_norm_eps", 1e-6)),
            "share_embeddings_and_output_weights": bool(c["tie_word_embeddings"]),
            "rotary_base": int(rope["rope_theta"]),  # an integer field (Megatron-LM --rotary-base)
            "rope_scaling": rope["rope_type"] == "llama3",
            "ffn_hidden_size": c["intermediate_size"],
            "add_qkv_bias": self.qkv_bias,
            "max_position_embeddings": c.get("max_position_embeddings") or 4096,
        }
        out["seq_length"] = min(out["max_position_embeddings"], 8192)
        if out["rope_scaling"]:
            out["rope_scaling_factor"] = float(rope.get("factor", 8.0))
        if self.moe and "router_aux_loss_coef" in c:
            out["moe_aux_loss_coeff"] = float(c["router_aux_loss_coef"])
        return out

    def tensor_fields(self, c: dict[str, Any], names: set[str]) -> dict[str, Any]:
        """The ``model.*`` fields of a derived model that the checkpoint's tensor ``names`` decide, not ``config.json``
        ``c`` (none here)."""
        return {}

    def left_out(self, m: ModelConfig, names: set[str]) -> tuple[set[str], list[str]]:
        """The stored tensors of ``names`` an import into ``m`` leaves out, where ``m`` has no place for what they hold
        (one phrase each, said on the import's line); none by default."""
        return set(), []

    def dropped(self, m: ModelConfig) -> list[str]:
        """What of ``m`` an export leaves out because the Hugging Face layout has no place for it (one phrase
        each, said on the export's line); nothing by default: ``check_model`` refuses what cannot be held."""
        return []

    def export_extras(self, m: ModelConfig) -> dict[str, Any]:
        """``config.json`` keys an export writes that an import does not compare (training-only settings)."""
        return {"router_aux_loss_coef": m.moe_aux_loss_coeff} if self.moe else {}

    # --- tensors -------------------------------------------------------------------------------------

    def attention_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        """Layer ``p`` (Hugging Face prefix) / ``t`` (Megatron-Core prefix)'s attention tensors and its input norm."""
        h, d = m.hidden_size, head_dim(m)
        q_rows, kv_rows = m.num_attention_heads * d, (m.num_query_groups or m.num_attention_heads) * d
        qkv = t + "self_attention.linear_qkv."
        out = [
            Slot(p + "input_layernorm.weight", t + "input_layernorm.weight", "all", (h,)),
            Slot(p + "self_attn.q_proj.weight", qkv + "weight", "q", (q_rows, h)),
            Slot(p + "self_attn.k_proj.weight", qkv + "weight", "k", (kv_rows, h)),
            Slot(p + "self_attn.v_proj.weight", qkv + "weight", "v", (kv_rows, h)),
        ]
        if m.add_qkv_bias:
            rows = (("q", q_rows), ("k", kv_rows), ("v", kv_rows))
            out += [Slot(p + f"self_attn.{x}_proj.bias", qkv + "bias", x, (n,)) for x, n in rows]
        out.append(Slot(p + "self_attn.o_proj.weight", t + "self_attention.linear_proj.weight", "all", (h, q_rows)))
        if not m.qk_layernorm:
            return out
        attn = t + "self_attention."
        norms = (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm"))
        return out + [Slot(p + f"self_attn.{x}.weight", attn + f"{y}.weight", "all", (d,)) for x, y in norms]

    def mlp_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        """The dense MLP's tensors."""
        h, f = m.hidden_size, m.ffn_hidden_size or 4 * m.hidden_size
        return [
            Slot(p + "mlp.gate_proj.weight", t + "mlp.linear_fc1.weight", "gate", (f, h)),
            Slot(p + "mlp.up_proj.weight", t + "mlp.linear_fc1.weight", "up", (f, h)),
            Slot(p + "mlp.down_proj.weight", t + "mlp.linear_fc2.weight", "all", (h, f)),
        ]

    def extra_slots(self, m: ModelConfig) -> list[Slot]:
        """Tensors after the decoder layers and before the final norm (DeepSeek-V3's MTP layers); none here."""
        return []

    def layer_slots(self, m: ModelConfig, i: int) -> list[Slot]:
        """Every Hugging Face tensor of layer ``i``, in the order Hugging Face lists them."""
        p, t = f"model.layers.{i}.", f"decoder.layers.{i}."
        norm = Slot(p + "post_attention_layernorm.weight", t + "pre_mlp_layernorm.weight", "all", (m.hidden_size,))
        return [*self.attention_slots(m, p, t), norm, *self.mlp_slots(m, p, t)]


def moe_fields(c: dict[str, Any], ffn: str, experts: str) -> dict[str, Any]:
    """The routed experts' ``model.*`` fields of ``config.json`` ``c``, whose keys for the expert size and count are
    ``ffn`` and ``experts`` (the top-k is ``num_experts_per_tok`` in every family)."""
    return {"moe_ffn_hidden_size": c[ffn], "num_moe_experts": c[experts], "moe_router_topk": c["num_experts_per_tok"]}


def expert_slots(m: ModelConfig, t: str, router: str, experts: str, names: tuple[str, str, str]) -> list[Slot]:
    """An MoE block's router (Hugging Face name ``router``) and routed experts (``experts.{e}.`` + the gate, up and
    down projection ``names``) in Megatron-Core layer ``t``."""
    h, f = m.hidden_size, m.moe_ffn_hidden_size or m.ffn_hidden_size or 4 * m.hidden_size
    out = [Slot(router, t + "mlp.router.weight", "all", (m.num_moe_experts or 0, h))]
    gate, up, down = names
    for e in range(m.num_moe_experts or 0):
        x, y = f"{experts}{e}.", f"{t}mlp.experts.local_experts.{e}."
        out += [
            Slot(x + gate, y + "linear_fc1.weight", "gate", (f, h)),
            Slot(x + up, y + "linear_fc1.weight", "up", (f, h)),
            Slot(x + down, y + "linear_fc2.weight", "all", (h, f)),
        ]
    return out
