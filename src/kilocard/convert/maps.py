"""Explicit per-family maps: Hugging Face config keys and tensor names <-> kilocard's Megatron-Core model.

Each family (``kilocard.convert.families``: one module each) says what it knows; this module applies it,
given a family's ``model_type`` and the recipe's ``ModelConfig`` alone:

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

import json
import math
from typing import Any

import torch

from kilocard.config.schema import ModelConfig
from kilocard.convert import families
from kilocard.convert.families.base import MCORE_ROPE_SCALING, head_dim
from kilocard.convert.spec import ConvertError, ConvertUsageError, Expect, Slot

__all__ = ["MCORE_ROPE_SCALING", "ConvertError", "ConvertUsageError", "Expect", "Slot"]

FAMILIES = families.names()
"""Hugging Face ``model_type`` values kilocard converts (``kilocard.convert.families``)."""

ARCHITECTURES = {f.model_type: f.architecture for f in families.FAMILIES}
"""The ``architectures`` entry written into an exported ``config.json``."""

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
"""Buffers some older checkpoints carry that are recomputed, not learned."""


def family_of_config(hf_config: dict[str, Any]) -> str:
    """The family of a ``config.json``; refuses one kilocard has no map for."""
    return families.of_config(hf_config).model_type


def family_of_model(m: ModelConfig) -> str:
    """The family a kilocard model with no recorded source exports as (``families.of_model``)."""
    return families.of_model(m).model_type


def check_model(family: str, m: ModelConfig) -> None:
    """Refuse a recipe model the family's Hugging Face layout cannot express, naming the field."""
    families.get(family).check_model(m)


def expected_config(family: str, m: ModelConfig) -> list[Expect]:
    """The ``config.json`` values the recipe's model implies for ``family`` (after ``check_model``)."""
    return families.get(family).expected_config(m)


HF_WHOLE = (
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "num_local_experts",
    "num_experts_per_tok",
    "sliding_window",
)
"""``config.json`` keys a model is derived from that hold whole numbers (their ranges: the schema's domains)."""
YARN_REAL = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
"""RoPE scaling keys (``rope_parameters`` or the older ``rope_scaling``) that hold finite real numbers."""
HF_REAL = (
    "rms_norm_eps",
    "router_aux_loss_coef",
    "rope_theta",
    "rope_parameters.rope_theta",
    *(f"{p}.{k}" for p in ("rope_parameters", "rope_scaling") for k in YARN_REAL),
    "swiglu_limit",
    "swiglu_alpha",
)
"""``config.json`` keys that hold finite real numbers."""


def _type_problem(key: str, v: Any) -> str | None:
    """Why ``v`` cannot be ``config.json``'s ``key`` (``None``: null, or the right kind of value)."""
    if v is None:
        return None
    if key in HF_WHOLE and (isinstance(v, bool) or not isinstance(v, int)):
        return "a whole number"
    real = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    if key in HF_REAL and not real:
        return "a finite number"
    if key == "tie_word_embeddings" and not isinstance(v, bool):
        return "true or false"
    if key in ("rope_parameters", "rope_scaling") and not isinstance(v, dict):
        return "a mapping"
    return None


def check_types(hf_config: dict[str, Any]) -> None:
    """``ConvertError`` naming the first key of ``config.json`` a model is derived from that holds the wrong kind
    of value (a string layer count, a NaN epsilon): refused in one line before anything is built from it."""
    for key in (*HF_WHOLE, *HF_REAL, "tie_word_embeddings", "rope_parameters", "rope_scaling"):
        v = _lookup(hf_config, key)
        want = _type_problem(key, v)
        if want is not None:
            raise ConvertError(f"config.json: {key} is {json.dumps(v)[:40]}, expected {want}; fix the file")


def normalized(hf_config: dict[str, Any]) -> dict[str, Any]:
    """``config.json`` with the defaults Hugging Face fills in made explicit, RoPE under ``rope_parameters``.

    transformers 5 writes ``rope_parameters``; older files have ``rope_theta`` and ``rope_scaling``.
    """
    check_types(hf_config)
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


def family_view(hf_config: dict[str, Any], family: str) -> dict[str, Any]:
    """``config.json`` as ``family`` reads it: its transformers class's defaults, then ``normalized``, then the
    family's own spellings."""
    fam = families.get(family)
    return fam.normalized(normalized(fam.with_defaults(hf_config)))


def check_config(hf_config: dict[str, Any], family: str, m: ModelConfig, recipe: str) -> None:
    """Refuse a ``config.json`` that disagrees with the recipe's model, naming every differing field at once."""
    c = family_view(hf_config, family)
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
    try:
        return families.get(family).model_from_config(family_view(hf_config, family))
    except KeyError as e:
        raise ConvertError(f"config.json has no {e.args[0]}, which a {family} model is derived from") from None


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
    return {**out, **families.get(family).export_extras(m)}


def slots(family: str, m: ModelConfig) -> list[Slot]:
    """Every Hugging Face tensor of the model, in the order Hugging Face lists them."""
    h, v, fam = m.hidden_size, m.vocab_size, families.get(family)
    out = [Slot("model.embed_tokens.weight", "embedding.word_embeddings.weight", "rows", (v, h))]
    for i in range(m.num_layers):
        out += fam.layer_slots(m, i)
    out += fam.extra_slots(m)
    out.append(Slot("model.norm.weight", "decoder.final_layernorm.weight", "all", (h,)))
    if not m.share_embeddings_and_output_weights:
        out.append(Slot("lm_head.weight", "output_layer.weight", "rows", (v, h)))
    return out


def region(t: torch.Tensor, slot: Slot, m: ModelConfig) -> torch.Tensor:
    """The view of Megatron-Core tensor ``t`` that holds ``slot``'s Hugging Face tensor (of one expert, for a slot
    of stacked experts; grouped shape for q/k/v, ``[columns, F, 2]`` for an interleaved gate/up)."""
    if slot.part == "all":
        return t
    if slot.part == "rows":
        return t[: slot.shape[0]]
    if slot.part == "t":
        return t.t()
    if slot.part == "interleaved":  # row g * F + f of [gate; up] is Hugging Face column 2 f + g
        halves = t.view(2, t.shape[0] // 2, *t.shape[1:])
        return halves.permute(*reversed(range(halves.dim())))
    if slot.part in ("gate", "up"):
        return t.chunk(2, dim=0)[slot.part == "up"]
    groups = m.num_query_groups or m.num_attention_heads
    per = m.num_attention_heads // groups
    x = t.view(groups, per + 2, head_dim(m), *t.shape[1:])
    return {"q": x[:, :per], "k": x[:, per], "v": x[:, per + 1]}[slot.part]


def mcore_names(slot: Slot) -> list[str]:
    """The Megatron-Core tensors ``slot``'s Hugging Face tensor lives in (one per expert of a stacked slot)."""
    if not slot.experts:
        return [slot.mcore]
    return [slot.mcore.format(e=e) for e in range(slot.experts)]


def put(sd: dict[str, torch.Tensor], slot: Slot, m: ModelConfig, hf: torch.Tensor) -> None:
    """Copy Hugging Face tensor ``hf`` (already of the Megatron-Core tensors' dtype) into its place in the state
    dict ``sd``."""
    parts = hf.unbind(0) if slot.experts else (hf,)
    for name, piece in zip(mcore_names(slot), parts, strict=True):
        view = region(sd[name], slot, m)
        view.copy_(piece.reshape(view.shape))


def take(sd: dict[str, torch.Tensor], slot: Slot, m: ModelConfig) -> torch.Tensor:
    """The Hugging Face tensor of ``slot``, cut from the state dict ``sd`` (contiguous)."""
    one = slot.shape[1:] if slot.experts else slot.shape
    pieces = [region(sd[name], slot, m).reshape(one) for name in mcore_names(slot)]
    return (torch.stack(pieces) if slot.experts else pieces[0]).contiguous()
