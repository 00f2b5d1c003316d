"""The one registry of Hugging Face families kilocard converts: a family is one module here (its
``config.json`` names, what it can hold, its config derivation and its weight map: ``base.Family``).

A new family is a module with a ``FAMILY`` and one entry in ``FAMILIES`` (docs/development.md, "A new
model family").
"""

from __future__ import annotations

from typing import Any

from kilocard.config.schema import ModelConfig
from kilocard.convert.families import deepseek_v3, gpt_oss, kimi_k2, llama, mixtral, qwen2, qwen3, qwen3_moe
from kilocard.convert.families.base import Family
from kilocard.convert.spec import ConvertError

FAMILIES: tuple[Family, ...] = (
    gpt_oss.FAMILY,
    deepseek_v3.FAMILY,
    kimi_k2.FAMILY,
    qwen3_moe.FAMILY,
    mixtral.FAMILY,
    qwen3.FAMILY,
    qwen2.FAMILY,
    llama.FAMILY,
)
"""Every family, most specific first: an export with no recorded source takes the first that ``claims`` its model."""

BY_TYPE: dict[str, Family] = {f.model_type: f for f in FAMILIES}
"""The families by ``config.json`` ``model_type``."""


def names() -> tuple[str, ...]:
    """The ``model_type`` values kilocard converts, sorted."""
    return tuple(sorted(BY_TYPE))


def get(model_type: str) -> Family:
    """The family of ``model_type`` (a name ``names`` lists)."""
    return BY_TYPE[model_type]


def of_config(hf_config: dict[str, Any]) -> Family:
    """The family of a ``config.json``; refuses one kilocard has no map for."""
    kind = hf_config.get("model_type")
    if kind not in BY_TYPE:
        raise ConvertError(f"config.json: model_type {kind!r} is not supported (expected one of {', '.join(names())})")
    return BY_TYPE[kind]


def of_model(m: ModelConfig) -> Family:
    """The family a kilocard model with no recorded source exports as (the first in ``FAMILIES`` that claims it)."""
    for family in FAMILIES:
        if family.claims(m):
            return family
    return llama.FAMILY  # check_model then names the field the Llama layout cannot hold
