"""The one mapping from a ``RunConfig`` to Megatron's argument names.

The schema already uses Megatron-Core's field names, so the mapping is the schema's own field list
(``dataclasses.fields``) of the groups Megatron reads, less ``KILOCARD_OWN_FIELDS``. Each consumer
(the trainer's adapter, the FLOPs and memory formulas) takes these values and adds only what
Megatron derives or what is not a plain value (a dtype, a callable, padded sizes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kilocard.config.schema import KILOCARD_OWN_FIELDS, ModelConfig, RunConfig

#: Config groups whose fields are Megatron-Core config fields (kilocard's own ones aside).
MEGATRON_GROUPS = ("model", "parallel", "precision", "optim")


def megatron_fields(cfg: RunConfig) -> dict[str, Any]:
    """Every Megatron field of ``cfg`` by its Megatron name (``{"num_layers": 80, ...}``)."""
    out: dict[str, Any] = {}
    for group in MEGATRON_GROUPS:
        node = getattr(cfg, group)
        for f in dataclasses.fields(node):
            if f"{group}.{f.name}" not in KILOCARD_OWN_FIELDS:
                out[f.name] = getattr(node, f.name)
    return out


def megatron_kwargs(cfg: RunConfig, target: type) -> dict[str, Any]:
    """The Megatron fields of ``cfg`` that the dataclass ``target`` (e.g. ``TransformerConfig``) takes."""
    names = {f.name for f in dataclasses.fields(target)}
    return {k: v for k, v in megatron_fields(cfg).items() if k in names}


def vocab_multiple(m: ModelConfig, tp: int = 1) -> int:
    """What the embedding's rows are padded to a multiple of: ``make_vocab_size_divisible_by * tp`` (Megatron-LM)."""
    return m.make_vocab_size_divisible_by * tp


def padded_vocab_size(m: ModelConfig, tp: int = 1) -> int:
    """Rows of the embedding Megatron builds: ``model.vocab_size`` rounded up to ``vocab_multiple``. The one
    computation: the trainer, its checkpoints, the data checks, the validator and the FLOPs take it from here."""
    multiple = vocab_multiple(m, tp)
    return ((m.vocab_size + multiple - 1) // multiple) * multiple
