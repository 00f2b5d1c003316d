"""Known library warnings that say nothing to a kilocard user, filtered by message and by the module that
warns (``warnings.filterwarnings(module=...)``), never by category alone: any other warning still shows.

Installed once per process, before the libraries import: by the CLI (``kilocard.commands.main``) and by
every rank (``python -m kilocard.train``), so a run's terminal and ``train.log`` carry no copy per rank.
They are kept at debug level: with ``KILOCARD_DEBUG=1`` nothing is filtered. The torch profiler's own
lines (Kineto's ``USDT: ... profiler_start``, printed whenever ``trainer.profile_steps`` traces) are
silenced the same way, through Kineto's ``KINETO_LOG_LEVEL`` unless it is set already.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping

NOISE: tuple[tuple[type[Warning], str, str], ...] = (
    # torch.cuda imports pynvml, whose wheel warns that it is deprecated (on every import, GPU or not).
    (FutureWarning, r"The pynvml package is deprecated", r"torch\.cuda"),
    # Megatron-Core without Transformer Engine/Apex (CPU ranks, conversions): it falls back, as intended.
    (UserWarning, r"Transformer Engine and Apex are not installed", r"megatron\."),
    (UserWarning, r"Apex is not installed", r"megatron\."),
    # Megatron-Core's torch_dist strategy still calls torch's deprecated checkpoint entry points.
    (FutureWarning, r"`(load|save)_state_dict` is deprecated", r"megatron\.core\.dist_checkpointing"),
    # ... and still hands torch's checkpoint planner ShardedTensors (every load of a step, on every rank).
    (FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor", r"torch\.distributed"),
)
"""``(category, message regex, warning module regex)`` of each filtered warning."""


DEBUG_ENV = "KILOCARD_DEBUG"
"""``KILOCARD_DEBUG=1``: library warnings unfiltered (and a crashing verb's traceback, ``kilocard.commands``)."""
KINETO_LEVEL = ("KINETO_LOG_LEVEL", "6")
"""Kineto's log level above its highest (``USDT`` is 5, above ``ERROR``): the profiler prints nothing."""


def debug(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether ``KILOCARD_DEBUG`` asks for everything (set and not ``0``)."""
    return (os.environ if environ is None else environ).get(DEBUG_ENV, "") not in ("", "0")


def quiet_library_warnings(environ: MutableMapping[str, str] | None = None) -> None:
    """Ignore the ``NOISE`` warnings in this process and silence the profiler's lines (idempotent); nothing at
    debug level (``DEBUG_ENV``)."""
    environ = os.environ if environ is None else environ
    if debug(environ):
        return
    environ.setdefault(*KINETO_LEVEL)
    for category, message, module in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


LAUNCHER_NOISE = "ignore:The pynvml package is deprecated:FutureWarning:torch.cuda"
"""The pynvml note in ``PYTHONWARNINGS`` form, for the processes kilocard starts but does not run code in
(torchrun, ft_launcher): they import torch.cuda too."""


def with_launcher_filter(pythonwarnings: str | None) -> str:
    """``PYTHONWARNINGS`` for a launcher process: the caller's entries, then ``LAUNCHER_NOISE``."""
    entries = [e for e in (pythonwarnings or "").split(",") if e]
    return ",".join([*entries, LAUNCHER_NOISE] if LAUNCHER_NOISE not in entries else entries)
