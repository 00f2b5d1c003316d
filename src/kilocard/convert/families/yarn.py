"""YaRN (transformers' ``rope_type: yarn``) as Megatron-Core holds it: its ``rope_parameters`` keys, their
``model.*`` fields (``MLATransformerConfig``'s names; ``position_embedding_type: yarn`` reads the same), the
defaults transformers applies and what the two sides cannot agree on. Used by the families with YaRN
(``deepseek_v3``, ``gpt_oss``)."""

from __future__ import annotations

import math
from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.spec import ConvertError, Expect

YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
"""YaRN's ``rope_parameters`` keys (transformers' ``_compute_yarn_parameters``)."""
YARN_FIELDS = ("rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
               "mscale_all_dim")  # fmt: skip
"""The ``model.*`` fields of ``YARN_KEYS``, in the same order (Megatron-Core's ``MLATransformerConfig`` names)."""


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's temperature ``0.1 * mscale * ln(factor) + 1`` (1 for a factor up to 1): Megatron-Core's
    ``_yarn_get_mscale`` and transformers' ``get_mscale``, the same formula."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_parameters(rope: dict[str, Any], max_positions: int, rounds_only: bool = True) -> dict[str, Any]:
    """YaRN's ``rope_parameters`` with the defaults transformers applies made explicit, in the forms Megatron-Core's
    YaRN holds; refuses, naming the key, what it cannot. ``truncate`` (round the correction range to whole
    dimensions; transformers' default true) is kept; ``rounds_only`` (MLA's YaRN, which always rounds) refuses
    false.

    transformers scales the rotary cos/sin by ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` only when
    both are nonzero, else by ``mscale(factor, 1)``; Megatron-Core always by the ratio. With ``mscale_all_dim``
    0 the two agree at ``mscale`` 1, which the result then holds (transformers ignores the file's ``mscale``).
    """

    def refuse(key: str, why: str) -> ConvertError:
        return ConvertError(f"config.json: rope_parameters.{key} is {rope.get(key)!r}; {why}")

    if "original_max_position_embeddings" not in rope:
        raise refuse("original_max_position_embeddings", "YaRN needs the context it extends; fix the file")
    original = rope["original_max_position_embeddings"]
    if original != int(original) or original < 1:
        raise refuse("original_max_position_embeddings", "expected a whole number of positions; fix the file")
    if rounds_only and rope.get("truncate", True) is not True:
        raise refuse("truncate", "Megatron-Core's YaRN rounds its correction range to whole dimensions (true)")
    if rope.get("attention_factor") is not None:
        raise refuse(
            "attention_factor",
            "Megatron-Core's YaRN derives the cos/sin factor from mscale and mscale_all_dim; remove it and give those",
        )
    out = dict(rope, original_max_position_embeddings=int(original), truncate=bool(rope.get("truncate", True)))
    out["factor"] = float(rope.get("factor") or max_positions / original)  # transformers' default for a null
    out["beta_fast"] = float(rope.get("beta_fast") or 32.0)
    out["beta_slow"] = float(rope.get("beta_slow") or 1.0)
    out["mscale_all_dim"] = float(rope.get("mscale_all_dim") or 0.0)
    if out["mscale_all_dim"] and not rope.get("mscale"):
        raise refuse(
            "mscale",
            "with a nonzero mscale_all_dim transformers then scales cos/sin by mscale(factor) alone, "
            "Megatron-Core by mscale / mscale_all_dim; give mscale",
        )
    out["mscale"] = float(rope["mscale"]) if out["mscale_all_dim"] else 1.0
    return out


def yarn_expects(m: ModelConfig) -> list[Expect]:
    """YaRN's six ``rope_parameters`` values (``YARN_KEYS``) of model ``m``."""
    out = []
    for key, field in zip(YARN_KEYS, YARN_FIELDS, strict=True):
        v = getattr(m, field)
        out.append(Expect(f"rope_parameters.{key}", v if isinstance(v, int) else float(v), field))
    return out


def check_mscale(m: ModelConfig) -> None:
    """Refuse a YaRN ``mscale`` transformers would read otherwise than Megatron-Core, naming the field."""
    if not ((m.mscale and m.mscale_all_dim) or (m.mscale == 1 and not m.mscale_all_dim)):
        raise ConvertError(
            f"model.mscale: {m.mscale} with mscale_all_dim {m.mscale_all_dim}: transformers scales YaRN's cos/sin by "
            f"mscale / mscale_all_dim only when both are nonzero (else as mscale 1), Megatron-Core always; set "
            f"model.mscale=1.0 or a nonzero model.mscale_all_dim"
        )
