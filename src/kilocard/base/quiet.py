"""Known library warnings that say nothing to a kilocard user, filtered by message and by the module that
warns (``warnings.filterwarnings(module=...)``), never by category alone: any other warning still shows.

Installed once per process, before the libraries import: by the CLI (``kilocard.commands.main``) and by
every rank (``python -m kilocard.train``), so a run's terminal and ``train.log`` carry no copy per rank.
"""

from __future__ import annotations

import warnings

NOISE: tuple[tuple[type[Warning], str, str], ...] = (
    # torch.cuda imports pynvml, whose wheel warns that it is deprecated (on every import, GPU or not).
    (FutureWarning, r"The pynvml package is deprecated", r"torch\.cuda"),
    # Megatron-Core without Transformer Engine/Apex (CPU ranks, conversions): it falls back, as intended.
    (UserWarning, r"Transformer Engine and Apex are not installed", r"megatron\."),
    (UserWarning, r"Apex is not installed", r"megatron\."),
    # Megatron-Core's torch_dist strategy still calls torch's deprecated checkpoint entry points.
    (FutureWarning, r"`(load|save)_state_dict` is deprecated", r"megatron\.core\.dist_checkpointing"),
)
"""``(category, message regex, warning module regex)`` of each filtered warning."""


def quiet_library_warnings() -> None:
    """Ignore the ``NOISE`` warnings in this process (idempotent)."""
    for category, message, module in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


LAUNCHER_NOISE = "ignore:The pynvml package is deprecated:FutureWarning:torch.cuda"
"""The pynvml note in ``PYTHONWARNINGS`` form, for the processes kilocard starts but does not run code in
(torchrun, ft_launcher): they import torch.cuda too."""


def with_launcher_filter(pythonwarnings: str | None) -> str:
    """``PYTHONWARNINGS`` for a launcher process: the caller's entries, then ``LAUNCHER_NOISE``."""
    entries = [e for e in (pythonwarnings or "").split(",") if e]
    return ",".join([*entries, LAUNCHER_NOISE] if LAUNCHER_NOISE not in entries else entries)
