"""Explicit per-family maps: Hugging Face config keys and tensor names <-> kilocard's Megatron-Core model.

For each family (Llama, Mixtral, Qwen2) this module says, from the recipe's ``ModelConfig`` alone:

* ``expected_config``: the ``config.json`` values the recipe implies, each tied to the model field it
  comes from. Import checks a given ``config.json`` against them (the first difference is refused,
  naming both fields); export writes them.
* ``slots``: every Hugging Face tensor, its shape, and where it lives in the single-rank (TP1/PP1/EP1)
  Megatron-Core state dict: a whole tensor, the q/k/v rows of the fused ``linear_qkv`` (per query group
  ``[q heads of the group, k, v]``), the gate/up halves of ``linear_fc1`` (``[gate; up]``), or the
  unpadded rows of the (vocabulary-padded) embedding and output layer.

Both sides use the rotate-half RoPE convention, so no row permutation is needed. The maps were
checked bit-exact against Megatron-Bridge 0.3.1's Llama bridge (shared/reference/hf-conversion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kilocard.config.schema import ModelConfig

FAMILIES = ("llama", "mixtral", "qwen2")
"""Hugging Face ``model_type`` values kilocard converts."""

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
"""The ``architectures`` entry written into an exported ``config.json``."""

MCORE_ROPE_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""Llama 3.1 RoPE scaling constants Megatron-Core hard-codes (``RotaryEmbedding._apply_scaling``);
only the factor is a parameter (``model.rope_scaling_factor``)."""

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints carry that are recomputed, not learned."""


class ConvertError(Exception):
    """A model the conversion refuses (a mismatch with the recipe, an unsupported family, weights it cannot
    hold exactly); the message names the field or tensor, the value and the fix. ``kilocard convert`` exits
    INVALID (1), as ``validate`` does for a config it refuses."""


class ConvertUsageError(ConvertError):
    """What the command line points at cannot be used: an output path that is taken, a symlink, inside a
    checkpoint or not creatable; a source that is no model directory or committed checkpoint; a file the
    safe reader refuses or that is damaged; a bad flag. ``kilocard convert`` exits USAGE (2), the code of
    every verb for input that cannot be used (``kilocard.commands.exits``)."""


@dataclass(frozen=True)
class Expect:
    """One ``config.json`` key the recipe decides."""

    key: str
    """``config.json`` key (``rope_parameters.rope_theta`` for a nested one)."""
    value: Any
    """The value the recipe implies."""
    field: str | None
    """The ``model.*`` field it comes from; ``None`` for a value no kilocard model can change."""


@dataclass(frozen=True)
class Slot:
    """Where one Hugging Face tensor lives in the Megatron-Core state dict."""

    hf: str
    """Hugging Face tensor name."""
    mcore: str
    """Megatron-Core (single-rank) state-dict name."""
    part: str
    """``all``, ``q``, ``k``, ``v`` (of linear_qkv), ``gate``, ``up`` (of linear_fc1) or ``rows`` (unpadded vocab)."""
    shape: tuple[int, ...]
    """The Hugging Face tensor's shape."""


def family_of_config(hf_config: dict[str, Any]) -> str:
    """The family of a ``config.json``; refuses one kilocard has no map for."""
    kind = hf_config.get("model_type")
    if kind not in FAMILIES:
        raise ConvertError(f"config.json: model_type {kind!r} is not supported (expected one of {', '.join(FAMILIES)})")
    return kind


def family_of_model(m: ModelConfig) -> str:
    """The family a kilocard model exports as: MoE -> mixtral, QKV bias -> qwen2, else llama."""
    if m.num_moe_experts:
        return "mixtral"
    return "qwen2" if m.add_qkv_bias else "llama"


def check_model(family: str, m: ModelConfig) -> None:
    """Refuse a recipe model the family's Hugging Face layout cannot express, naming the field."""
    wanted: list[tuple[str, Any]] = [
        ("normalization", "RMSNorm"),
        ("activation", "swiglu"),
        ("add_bias_linear", False),
        ("position_embedding_type", "rope"),
        ("rotary_percent", 1.0),
        ("multi_latent_attention", False),
        ("mtp_num_layers", None),
        ("add_qkv_bias", family == "qwen2"),
    ]
    if family == "mixtral":
        wanted += [("moe_layer_freq", 1), ("moe_shared_expert_intermediate_size", None)]
        wanted += [("moe_router_score_function", "softmax")]
    else:
        wanted.append(("num_moe_experts", None))
    for name, value in wanted:
        if getattr(m, name) != value:
            raise ConvertError(
                f"model.{name}: {getattr(m, name)!r} has no {family} Hugging Face equivalent "
                f"(expected {value!r}); pick a recipe whose model the {family} layout can hold"
            )


def _head_dim(m: ModelConfig) -> int:
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def _rope(m: ModelConfig) -> list[Expect]:
    out = [Expect("rope_parameters.rope_theta", float(m.rotary_base), "rotary_base")]
    if not m.rope_scaling:
        return [*out, Expect("rope_parameters.rope_type", "default", "rope_scaling")]
    out += [
        Expect("rope_parameters.rope_type", "llama3", "rope_scaling"),
        Expect("rope_parameters.factor", float(m.rope_scaling_factor), "rope_scaling_factor"),
    ]
    return out + [Expect(f"rope_parameters.{k}", v, None) for k, v in MCORE_ROPE_SCALING.items()]


def expected_config(family: str, m: ModelConfig) -> list[Expect]:
    """The ``config.json`` values the recipe's model implies for ``family`` (after ``check_model``).

    ``max_position_embeddings`` is written on export but not compared on import: RoPE has no position
    table, and a recipe may train at a shorter context than the model supports.
    """
    out = [
        Expect("model_type", family, None),
        Expect("num_hidden_layers", m.num_layers, "num_layers"),
        Expect("hidden_size", m.hidden_size, "hidden_size"),
        Expect("num_attention_heads", m.num_attention_heads, "num_attention_heads"),
        Expect("num_key_value_heads", m.num_query_groups or m.num_attention_heads, "num_query_groups"),
        Expect("head_dim", _head_dim(m), "kv_channels"),
        Expect("vocab_size", m.vocab_size, "vocab_size"),
        Expect("rms_norm_eps", m.layernorm_epsilon, "layernorm_epsilon"),
        Expect("tie_word_embeddings", m.share_embeddings_and_output_weights, "share_embeddings_and_output_weights"),
        Expect("hidden_act", "silu", "activation"),
        *_rope(m),
    ]
    if family == "mixtral":
        out += [
            Expect("intermediate_size", m.moe_ffn_hidden_size or m.ffn_hidden_size, "moe_ffn_hidden_size"),
            Expect("num_local_experts", m.num_moe_experts, "num_moe_experts"),
            Expect("num_experts_per_tok", m.moe_router_topk, "moe_router_topk"),
            Expect("sliding_window", None, None),
        ]
    else:
        out.append(Expect("intermediate_size", m.ffn_hidden_size or 4 * m.hidden_size, "ffn_hidden_size"))
    if family == "llama":
        out += [Expect("attention_bias", False, "add_qkv_bias"), Expect("mlp_bias", False, "add_bias_linear")]
    if family == "qwen2":
        out.append(Expect("use_sliding_window", False, None))
    return out


def normalized(hf_config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` with the defaults Hugging Face fills in made explicit, RoPE under ``rope_parameters``.

    transformers 5 writes ``rope_parameters``; older files have ``rope_theta`` and ``rope_scaling``.
    """
    c = dict(hf_config)
    heads = c.get("num_attention_heads")
    c["num_key_value_heads"] = c.get("num_key_value_heads") or heads
    if c.get("head_dim") is None and heads:
        c["head_dim"] = c.get("hidden_size", 0) // heads
    rope = dict(c.get("rope_parameters") or {})
    legacy = dict(c.get("rope_scaling") or {})
    if "type" in legacy:
        legacy.setdefault("rope_type", legacy.pop("type"))
    rope = {**legacy, **rope}
    rope.setdefault("rope_theta", c.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", "default")
    c["rope_parameters"] = {k: float(v) if isinstance(v, int) else v for k, v in rope.items()}
    c.setdefault("use_sliding_window", False)
    c.setdefault("sliding_window", None)
    c.setdefault("attention_bias", False)
    c.setdefault("mlp_bias", False)
    c.setdefault("tie_word_embeddings", False)
    return c


def _lookup(c: dict[str, Any], key: str) -> Any:
    node: Any = c
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_config(hf_config: dict[str, Any], family: str, m: ModelConfig, recipe: str) -> None:
    """Refuse a ``config.json`` that disagrees with the recipe's model, naming every differing field at once."""
    c = normalized(hf_config)
    fixed, fields = [], []
    for e in expected_config(family, m):
        got = _lookup(c, e.key)
        same = got == e.value or (isinstance(e.value, float) and isinstance(got, int | float) and got == e.value)
        if same:
            continue
        if e.field is None:
            fixed.append(f"{e.key} is {got!r}; kilocard's {family} model needs {e.value!r}")
        else:
            fields.append(
                f"{e.key} is {got!r}, recipe {recipe} expects {e.value!r} (model.{e.field}={getattr(m, e.field)!r})"
            )
    if fixed:
        raise ConvertError("config.json: " + "; ".join(fixed + fields))
    if fields:
        raise ConvertError(
            "config.json: " + "; ".join(fields) + "; convert with a recipe for this model, without recipe= (the "
            "model then comes from config.json), or override those model fields"
        )


def model_from_config(hf_config: dict[str, Any], family: str) -> dict[str, Any]:
    """The ``model.*`` fields a ``config.json`` of ``family`` decides (what ``expected_config`` compares),
    as Megatron-Bridge's AutoBridge derives a model from it; ``seq_length`` is the context, at most 8192."""
    c = normalized(hf_config)
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
        "add_qkv_bias": family == "qwen2",
        "max_position_embeddings": c.get("max_position_embeddings") or 4096,
    }
    out["seq_length"] = min(out["max_position_embeddings"], 8192)
    if out["rope_scaling"]:
        out["rope_scaling_factor"] = float(rope.get("factor", 8.0))
    if family == "mixtral":
        out["moe_ffn_hidden_size"] = c["intermediate_size"]
        out["num_moe_experts"] = c["num_local_experts"]
        out["moe_router_topk"] = c["num_experts_per_tok"]
        if "router_aux_loss_coef" in c:
            out["moe_aux_loss_coeff"] = float(c["router_aux_loss_coef"])
    return out


def hf_config(family: str, m: ModelConfig, dtype: torch.dtype) -> dict[str, Any]:
    """The ``config.json`` of an exported model (what ``check_config`` accepts, plus architecture and dtype)."""
    out: dict[str, Any] = {"architectures": [ARCHITECTURES[family]]}
    for e in expected_config(family, m):
        if "." in e.key:
            parent, _, child = e.key.partition(".")
            out.setdefault(parent, {})[child] = e.value
        else:
            out[e.key] = e.value
    out["max_position_embeddings"] = m.max_position_embeddings
    out["dtype"] = str(dtype).removeprefix("torch.")
    if family == "mixtral":
        out["router_aux_loss_coef"] = m.moe_aux_loss_coeff
    return out


def _layer_slots(family: str, m: ModelConfig, i: int) -> list[Slot]:
    h, d = m.hidden_size, _head_dim(m)
    q_rows, kv_rows = m.num_attention_heads * d, (m.num_query_groups or m.num_attention_heads) * d
    p, t = f"model.layers.{i}.", f"decoder.layers.{i}."
    qkv = t + "self_attention.linear_qkv."
    out = [
        Slot(p + "input_layernorm.weight", t + "input_layernorm.weight", "all", (h,)),
        Slot(p + "self_attn.q_proj.weight", qkv + "weight", "q", (q_rows, h)),
        Slot(p + "self_attn.k_proj.weight", qkv + "weight", "k", (kv_rows, h)),
        Slot(p + "self_attn.v_proj.weight", qkv + "weight", "v", (kv_rows, h)),
    ]
    if m.add_qkv_bias:
        out += [Slot(p + f"self_attn.{x}_proj.bias", qkv + "bias", x, (n,)) for x, n in (("q", q_rows), ("k", kv_rows))]
        out.append(Slot(p + "self_attn.v_proj.bias", qkv + "bias", "v", (kv_rows,)))
    out += [
        Slot(p + "self_attn.o_proj.weight", t + "self_attention.linear_proj.weight", "all", (h, q_rows)),
        Slot(p + "post_attention_layernorm.weight", t + "pre_mlp_layernorm.weight", "all", (h,)),
    ]
    if family != "mixtral":
        f = m.ffn_hidden_size or 4 * h
        return out + [
            Slot(p + "mlp.gate_proj.weight", t + "mlp.linear_fc1.weight", "gate", (f, h)),
            Slot(p + "mlp.up_proj.weight", t + "mlp.linear_fc1.weight", "up", (f, h)),
            Slot(p + "mlp.down_proj.weight", t + "mlp.linear_fc2.weight", "all", (h, f)),
        ]
    f, moe = m.moe_ffn_hidden_size or m.ffn_hidden_size or 4 * h, p + "block_sparse_moe."
    out.append(Slot(moe + "gate.weight", t + "mlp.router.weight", "all", (m.num_moe_experts or 0, h)))
    for e in range(m.num_moe_experts or 0):
        x, y = f"{moe}experts.{e}.", f"{t}mlp.experts.local_experts.{e}."
        out += [
            Slot(x + "w1.weight", y + "linear_fc1.weight", "gate", (f, h)),
            Slot(x + "w3.weight", y + "linear_fc1.weight", "up", (f, h)),
            Slot(x + "w2.weight", y + "linear_fc2.weight", "all", (h, f)),
        ]
    return out


def slots(family: str, m: ModelConfig) -> list[Slot]:
    """Every Hugging Face tensor of the model, in the order Hugging Face lists them."""
    h, v = m.hidden_size, m.vocab_size
    out = [Slot("model.embed_tokens.weight", "embedding.word_embeddings.weight", "rows", (v, h))]
    for i in range(m.num_layers):
        out += _layer_slots(family, m, i)
    out.append(Slot("model.norm.weight", "decoder.final_layernorm.weight", "all", (h,)))
    if not m.share_embeddings_and_output_weights:
        out.append(Slot("lm_head.weight", "output_layer.weight", "rows", (v, h)))
    return out


def region(t: torch.Tensor, slot: Slot, m: ModelConfig) -> torch.Tensor:
    """The view of Megatron-Core tensor ``t`` that holds ``slot``'s Hugging Face tensor (grouped shape for q/k/v)."""
    if slot.part == "all":
        return t
    if slot.part == "rows":
        return t[: slot.shape[0]]
    if slot.part in ("gate", "up"):
        return t.chunk(2, dim=0)[slot.part == "up"]
    groups = m.num_query_groups or m.num_attention_heads
    per = m.num_attention_heads // groups
    x = t.view(groups, per + 2, _head_dim(m), *t.shape[1:])
    return {"q": x[:, :per], "k": x[:, per], "v": x[:, per + 1]}[slot.part]


def put(t: torch.Tensor, slot: Slot, m: ModelConfig, hf: torch.Tensor) -> None:
    """Copy Hugging Face tensor ``hf`` (already of ``t``'s dtype) into its place in ``t``."""
    view = region(t, slot, m)
    view.copy_(hf.view(view.shape))


def take(t: torch.Tensor, slot: Slot, m: ModelConfig) -> torch.Tensor:
    """The Hugging Face tensor of ``slot``, cut from Megatron-Core tensor ``t`` (contiguous)."""
    return region(t, slot, m).reshape(slot.shape).contiguous()
