"""What a family map is made of (no torch): the errors a conversion raises, a ``config.json`` value the recipe
decides (``Expect``) and the place of one Hugging Face tensor in the Megatron-Core state dict (``Slot``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    """``all``, ``q``, ``k``, ``v`` (of linear_qkv), ``gate``, ``up`` (of linear_fc1), ``rows`` (unpadded vocab),
    ``t`` (the transpose: a Hugging Face ``x @ W`` matrix) or ``interleaved`` (a whole ``[gate; up]`` linear_fc1
    weight or bias whose Hugging Face columns alternate gate, up, gate, ..., a matrix also transposed)."""
    shape: tuple[int, ...]
    """The Hugging Face tensor's shape."""
    experts: int = 0
    """A Hugging Face tensor of this many experts stacked on its first dimension (GPT-OSS's fused experts):
    ``mcore`` then names expert ``{e}``'s tensor, and ``part`` says where each expert's slice lives in it;
    0: one Megatron-Core tensor."""
