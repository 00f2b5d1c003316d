"""Compute backends of the trainer: ``cuda`` (NCCL, Transformer Engine when installed) or ``cpu`` (gloo + shim).

``select()`` decides once per process and prepares torch for it; only the CPU backend imports
``kilocard.backends.cpu_shim``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

FORCE_ENV = "KILOCARD_BACKEND"
"""Set to ``cpu`` to train on CPU ranks even where CUDA is available."""


@dataclass(frozen=True)
class Backend:
    """What the rest of the trainer needs to know about the device it runs on."""

    name: str
    """``cuda`` or ``cpu``."""
    dist_backend: str
    """torch.distributed backend: ``nccl`` or ``gloo``."""
    local_spec: bool
    """Use Megatron-Core's local (pure PyTorch) layer spec instead of Transformer Engine's."""

    @property
    def is_cuda(self) -> bool:
        """Whether ranks run on GPUs."""
        return self.name == "cuda"


def select(local_rank: int) -> Backend:
    """Pick the backend for this rank and prepare torch for it (device, CPU shim)."""
    forced = os.environ.get(FORCE_ENV, "").strip().lower()
    if forced not in ("", "cpu", "cuda"):
        raise ValueError(f"{FORCE_ENV}={forced!r}: expected 'cpu' or 'cuda'")
    use_cuda = forced == "cuda" or (forced == "" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return Backend(name="cuda", dist_backend="nccl", local_spec=not _has_transformer_engine())
    return cpu()


def cpu() -> Backend:
    """The CPU backend: gloo, the local layer spec, Megatron-Core patched by the CPU shim."""
    from kilocard.backends import cpu_shim

    cpu_shim.apply()
    return Backend(name="cpu", dist_backend="gloo", local_spec=True)


def _has_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True
