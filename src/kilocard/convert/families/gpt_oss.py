"""GPT-OSS (``GptOssForCausalLM``): grouped-query attention with biases on every projection and a learned sink
logit per head (``self_attn.sinks``: Megatron-Core's ``core_attention.softmax_offset``, ``softmax_type:
learnable``), a sliding window on the layers ``layer_types`` calls ``sliding_attention`` (every other one from the
first: ``window_attn_skip_freq`` 2), and in every layer an MoE block: a router with a bias, softmax over the
top-k logits, and experts stored fused, ``gate_up_proj`` [E, H, 2F] with gate and up columns interleaved (gate
even, up odd) and ``down_proj`` [E, F, H], both in the ``x @ W`` layout (transposed against Megatron-Core's
``linear_fc1``/``linear_fc2``), each with its bias. The experts' clamped SwiGLU is Megatron-Core's
``quick_gelu`` (sigmoid gain 1.702: transformers' ``swiglu_alpha``) with ``glu_linear_offset`` 1 and
``activation_func_clamp_value`` (``swiglu_limit``).

transformers' ``sliding_window`` counts the query itself (a query sees the ``sliding_window`` tokens ending at
it), Megatron-Core's ``window_size`` ``[left, 0]`` the tokens before it: ``left = sliding_window - 1``, as
Megatron-Bridge's bridge maps it. YaRN (``rope_parameters.rope_type: yarn``, the published models' and
``GptOssConfig``'s default) is ``position_embedding_type: yarn`` (``factor`` is ``rotary_scaling_factor``,
``truncate`` ``yarn_correction_range_round_to_int``; transformers' temperature ``0.1 ln(factor) + 1``, or the
``mscale``/``mscale_all_dim`` ratio when both are set, is Megatron-Core's ``_yarn_get_concentration_factor``
of the same fields), plain RoPE ``rope``. Not held, refused by name: an explicit ``attention_factor`` and
quantized checkpoints (``quantization_config``: the published models' MXFP4 experts).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.families.base import Family, moe_fields
from kilocard.convert.families.yarn import YARN_FIELDS, YARN_KEYS, check_mscale, yarn_expects, yarn_parameters
from kilocard.convert.spec import ConvertError, Expect, Slot

SWIGLU_ALPHA = 1.702
"""The sigmoid gain of GPT-OSS's SwiGLU: Megatron-Core's ``quick_gelu`` hard-codes it."""

SLIDING, FULL = "sliding_attention", "full_attention"
"""transformers' ``layer_types`` of a windowed and of a full-attention layer."""

CONFIG_DEFAULTS: dict[str, Any] = {"attention_bias": True, "swiglu_alpha": SWIGLU_ALPHA, "swiglu_limit": 7.0}
YARN_DEFAULTS: dict[str, Any] = {
    "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
    "original_max_position_embeddings": 4096,
}  # fmt: skip
"""``GptOssConfig``'s RoPE when a ``config.json`` names none (the published models')."""
"""What ``GptOssConfig`` gives keys a ``config.json`` lacks, where ``maps.normalized`` assumes otherwise
(transformers before 5 has no ``swiglu_alpha``: 1.702 in its code)."""


def windowed(m: ModelConfig) -> list[bool]:
    """Whether each layer attends through ``window_size`` (Megatron-Core's ``is_layer_window_attention``: an int
    ``k`` leaves every k-th layer, 1-based, full; a list says 1 per windowed layer)."""
    freq, n = m.window_attn_skip_freq, m.num_layers
    if not m.window_size:
        return [False] * n
    if freq is None:
        return [True] * n
    if isinstance(freq, int):
        return [(i + 1) % freq != 0 for i in range(n)]
    return [bool(x) for x in freq]


def skip_freq(layer_types: list[str]) -> int | list[int] | None:
    """``window_attn_skip_freq`` of transformers' ``layer_types`` (with a window): 2 for GPT-OSS's alternation,
    ``None`` for every layer windowed, else one 0/1 per layer; refuses a kind it has no window for."""
    other = sorted({t for t in layer_types if t not in (SLIDING, FULL)})
    if other:
        raise ConvertError(
            f"config.json: layer_types has {other[0]!r}; a gpt_oss layer is {SLIDING!r} or {FULL!r}; fix the file"
        )
    flags = [int(t == SLIDING) for t in layer_types]
    if all(flags):
        return None
    return 2 if flags == [(i + 1) % 2 for i in range(len(flags))] else flags


def rope_expects(m: ModelConfig) -> list[Expect]:
    """YaRN's ``rope_parameters`` (``position_embedding_type: yarn``), ``truncate`` included."""
    return [
        Expect("rope_parameters.rope_type", "yarn", "position_embedding_type"),
        Expect("rope_parameters.rope_theta", float(m.rotary_base), "rotary_base"),
        *yarn_expects(m),
        Expect("rope_parameters.truncate", m.yarn_correction_range_round_to_int, "yarn_correction_range_round_to_int"),
    ]


def rope_fields(rope: dict[str, Any]) -> dict[str, Any]:
    """The ``model.*`` RoPE fields of a (``yarn_parameters``) ``rope_parameters``."""
    if rope["rope_type"] != "yarn":
        return {"position_embedding_type": "rope"}
    yarn = {f: rope[k] for k, f in zip(YARN_KEYS, YARN_FIELDS, strict=True)}
    return {"position_embedding_type": "yarn", **yarn, "yarn_correction_range_round_to_int": rope["truncate"]}


class GptOss(Family):
    """Biased GQA with sinks and alternating sliding windows; biased, top-k routed, clamped-SwiGLU experts."""

    model_type = "gpt_oss"
    architecture = "GptOssForCausalLM"
    base_recipe = "tiny_gpt_oss"
    moe = True
    qkv_bias = True

    def claims(self, m: ModelConfig) -> bool:
        return m.softmax_type == "learnable" and bool(m.num_moe_experts)

    def requirements(self, m: ModelConfig) -> list[tuple[str, Any]]:
        return [
            ("normalization", "RMSNorm"),
            ("gated_linear_unit", True),
            ("activation", "quick_gelu"),
            ("glu_linear_offset", 1.0),
            ("add_bias_linear", True),
            ("rotary_percent", 1.0),
            ("rope_scaling", False),
            ("multi_latent_attention", False),
            ("qk_layernorm", False),
            ("softmax_type", "learnable"),
            ("mtp_num_layers", None),
            ("moe_layer_freq", 1),
            ("moe_shared_expert_intermediate_size", None),
            ("moe_router_score_function", "softmax"),
            ("moe_router_pre_softmax", False),
            ("moe_router_topk_scaling_factor", None),
            ("moe_router_num_groups", None),
            ("moe_router_enable_expert_bias", False),
        ]

    def check_model(self, m: ModelConfig) -> None:
        super().check_model(m)
        for field in ("num_moe_experts", "activation_func_clamp_value"):
            if getattr(m, field) is None:
                raise ConvertError(f"model.{field}: None has no gpt_oss Hugging Face equivalent; set it")
        if m.position_embedding_type not in ("rope", "yarn"):
            raise ConvertError(
                f"model.position_embedding_type: {m.position_embedding_type!r} has no gpt_oss Hugging Face "
                f"equivalent (expected 'rope' or 'yarn')"
            )
        if m.position_embedding_type == "yarn":
            check_mscale(m)

    # --- config.json ---------------------------------------------------------------------------------

    def expected_config(self, m: ModelConfig) -> list[Expect]:
        kept = [e for e in super().expected_config(m) if e.key != "hidden_act"]  # the experts ignore hidden_act
        if m.position_embedding_type != "yarn":
            return kept
        return [e for e in kept if not e.key.startswith("rope_parameters.")] + rope_expects(m)

    def mlp_expects(self, m: ModelConfig) -> list[Expect]:
        return [
            Expect("intermediate_size", m.moe_ffn_hidden_size or m.ffn_hidden_size, "moe_ffn_hidden_size"),
            Expect("num_local_experts", m.num_moe_experts, "num_moe_experts"),
            Expect("num_experts_per_tok", m.moe_router_topk, "moe_router_topk"),
            Expect("swiglu_limit", m.activation_func_clamp_value, "activation_func_clamp_value"),
            Expect("swiglu_alpha", SWIGLU_ALPHA, None),
        ]

    def extra_expects(self, m: ModelConfig) -> list[Expect]:
        out = [Expect("attention_bias", True, None)]
        layers = [SLIDING if w else FULL for w in windowed(m)]
        if m.window_size and any(windowed(m)):
            out.append(Expect("sliding_window", m.window_size[0] + 1, "window_size"))
        return [*out, Expect("layer_types", layers, "window_attn_skip_freq")]

    def with_defaults(self, c: dict[str, Any]) -> dict[str, Any]:
        out = {**CONFIG_DEFAULTS, **c}
        if not c.get("rope_parameters") and not c.get("rope_scaling"):
            out["rope_parameters"] = {**YARN_DEFAULTS, "rope_theta": c.get("rope_theta", 150000.0)}
        if out.get("layer_types") is None and isinstance(c.get("num_hidden_layers"), int):
            out["layer_types"] = [SLIDING if (i + 1) % 2 else FULL for i in range(c["num_hidden_layers"])]
        out.setdefault("sliding_window", 128)
        return out

    def normalized(self, c: dict[str, Any]) -> dict[str, Any]:
        """YaRN's values as transformers reads them; refuses what the family cannot hold before anything is
        compared or derived: a quantized checkpoint, a RoPE other than plain or YaRN, an explicit YaRN
        ``attention_factor``."""
        quant = c.get("quantization_config")
        if quant:
            method = quant.get("quant_method") if isinstance(quant, dict) else quant
            raise ConvertError(
                f"config.json: quantization_config has quant_method {method!r}; kilocard imports unquantized weights "
                f"only: dequantize first (transformers: Mxfp4Config(dequantize=True) in from_pretrained, then "
                f"save_pretrained)"
            )
        rope = c["rope_parameters"]
        if rope["rope_type"] not in ("default", "yarn"):
            raise ConvertError(
                f"config.json: rope_parameters.rope_type is {rope['rope_type']!r}; kilocard's gpt_oss model has "
                f"plain RoPE ('default') or YaRN ('yarn')"
            )
        if rope["rope_type"] == "default":
            return c
        context = c.get("max_position_embeddings") or 131072
        return {**c, "rope_parameters": yarn_parameters(rope, context, rounds_only=False)}

    def model_from_config(self, c: dict[str, Any]) -> dict[str, Any]:
        out = {**super().model_from_config(c), **moe_fields(c, "intermediate_size", "num_local_experts")}
        out["activation_func_clamp_value"] = float(c["swiglu_limit"])
        out.update(rope_fields(c["rope_parameters"]))
        types = list(c["layer_types"])
        windows = SLIDING in types
        if windows and c["sliding_window"] is None:
            raise ConvertError(f"config.json: sliding_window is null, but layer_types has {SLIDING!r}; fix the file")
        out["window_size"] = [c["sliding_window"] - 1, 0] if windows else None
        out["window_attn_skip_freq"] = skip_freq(types) if windows else None
        return out

    # --- tensors -------------------------------------------------------------------------------------

    def attention_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        """Llama's attention with a bias on q/k/v (``add_bias_linear`` gives one whatever ``add_qkv_bias`` says)
        and on ``o_proj``, and the sinks."""
        h, attn = m.hidden_size, t + "self_attention."
        return [
            *super().attention_slots(dataclasses.replace(m, add_qkv_bias=True), p, t),
            Slot(p + "self_attn.o_proj.bias", attn + "linear_proj.bias", "all", (h,)),
            Slot(p + "self_attn.sinks", attn + "core_attention.softmax_offset", "all", (m.num_attention_heads,)),
        ]

    def mlp_slots(self, m: ModelConfig, p: str, t: str) -> list[Slot]:
        """The router (weight and bias) and the fused experts, each expert's slice in its own Megatron-Core MLP."""
        h, f = m.hidden_size, m.moe_ffn_hidden_size or m.ffn_hidden_size or 4 * m.hidden_size
        e = m.num_moe_experts or 0
        x, y = p + "mlp.experts.", t + "mlp.experts.local_experts.{e}."
        return [
            Slot(p + "mlp.router.weight", t + "mlp.router.weight", "all", (e, h)),
            Slot(p + "mlp.router.bias", t + "mlp.router.bias", "all", (e,)),
            Slot(x + "gate_up_proj", y + "linear_fc1.weight", "interleaved", (e, h, 2 * f), e),
            Slot(x + "gate_up_proj_bias", y + "linear_fc1.bias", "interleaved", (e, 2 * f), e),
            Slot(x + "down_proj", y + "linear_fc2.weight", "t", (e, f, h), e),
            Slot(x + "down_proj_bias", y + "linear_fc2.bias", "all", (e, h), e),
        ]


FAMILY = GptOss()
