"""Rules of the Slurm launcher (pure: the config only, no environment, no I/O).

* ``SIGNAL_LEAD_SAVE``: ``launcher.signal_lead_s`` must leave time to finish the current step and
  write a checkpoint before the time limit kills the job: lead >= 1.2 x save time + 30 s, with the
  save time from ``checkpoint.expected_save_time_s`` or estimated as checkpoint bytes /
  ``cluster.fs_write_bandwidth_gbs``.
* ``SIGNAL_LEAD_TIME``: the lead must be shorter than ``launcher.time``.
* ``PACKAGING``: ``launcher.packaging`` is ``snapshot``, ``image`` or ``none``; ``image`` needs
  ``cluster.container_image`` (the image ``kilocard image`` built).

A malformed ``launcher.time`` is ``LAUNCHER_TIME`` (``validate.inputs``), reported once, there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kilocard.base.shell import ShellValueError
from kilocard.base.slurmtime import time_to_seconds
from kilocard.config.schema import PACKAGING_MODES, RunConfig
from kilocard.layout import Layout
from kilocard.perf.memory import checkpoint_bytes
from kilocard.validate.issues import Issue, error
from kilocard.validate.model import model_shape_ok

#: Seconds allowed for the step in flight to finish and the ranks to agree on the save step.
STEP_MARGIN_S = 30.0
#: Safety factor on the save time (filesystem bandwidth varies under load).
SAVE_FACTOR = 1.2


def expected_save_time_s(cfg: RunConfig) -> float:
    """``checkpoint.expected_save_time_s``, or checkpoint bytes / filesystem write bandwidth."""
    if cfg.checkpoint.expected_save_time_s is not None:
        return float(cfg.checkpoint.expected_save_time_s)
    return checkpoint_bytes(cfg) / (max(cfg.cluster.fs_write_bandwidth_gbs, 1e-9) * 1e9)


def _lead_vs_save(cfg: RunConfig) -> Issue | None:
    """``SIGNAL_LEAD_SAVE`` when USR1 comes too late for a save to finish."""
    lead = cfg.launcher.signal_lead_s
    save = expected_save_time_s(cfg)
    need = math.ceil(SAVE_FACTOR * save + STEP_MARGIN_S)
    if lead >= need:
        return None
    bandwidth = f"cluster.fs_write_bandwidth_gbs={cfg.cluster.fs_write_bandwidth_gbs}"
    source = (
        "checkpoint.expected_save_time_s"
        if cfg.checkpoint.expected_save_time_s is not None
        else f"{checkpoint_bytes(cfg) / 1e9:.1f} GB / {bandwidth}"
    )
    return error(
        "SIGNAL_LEAD_SAVE",
        "launcher.signal_lead_s",
        lead,
        f"USR1 comes {lead} s before the time limit, but a save takes ~{save:.0f} s ({source}); "
        f"needed {SAVE_FACTOR} x {save:.0f} + {STEP_MARGIN_S:.0f} s = {need} s",
        f"launcher.signal_lead_s={need} (or set checkpoint.expected_save_time_s to a measured value)",
    )


def _lead_vs_limit(cfg: RunConfig) -> Issue | None:
    """``SIGNAL_LEAD_TIME`` when the lead is not shorter than the time limit (a malformed limit: no issue here)."""
    lead = cfg.launcher.signal_lead_s
    try:
        limit = time_to_seconds("launcher.time", cfg.launcher.time)
    except ShellValueError:
        return None  # LAUNCHER_TIME (validate.inputs) names it
    if lead < limit:
        return None
    return error(
        "SIGNAL_LEAD_TIME",
        "launcher.signal_lead_s",
        lead,
        f"USR1 lead {lead} s is not shorter than launcher.time={cfg.launcher.time} ({limit} s)",
        f"launcher.signal_lead_s={max(1, limit // 2)} or a longer launcher.time",
    )


def signal_lead_issues(cfg: RunConfig) -> list[Issue]:
    """``SIGNAL_LEAD_SAVE`` / ``SIGNAL_LEAD_TIME`` (whatever the launcher kind)."""
    return [i for i in (_lead_vs_save(cfg), _lead_vs_limit(cfg)) if i is not None]


def rule_signal_lead(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The USR1 lead against the save time and the time limit (Slurm launches of a valid model shape)."""
    if cfg.launcher.kind != "slurm" or not model_shape_ok(cfg):  # the save-time estimate counts parameters
        return []
    save, bandwidth = cfg.checkpoint.expected_save_time_s, cfg.cluster.fs_write_bandwidth_gbs
    if not math.isfinite(bandwidth) or (save is not None and not math.isfinite(save)):
        return []  # NOT_FINITE (validate.inputs) names it
    return signal_lead_issues(cfg)


def packaging_issues(cfg: RunConfig) -> list[Issue]:
    """``PACKAGING``: a known code-delivery mode, and an image to deliver the code in for ``image``."""
    mode = cfg.launcher.packaging
    if mode not in PACKAGING_MODES:
        why = f"not a code-delivery mode (expected one of {', '.join(PACKAGING_MODES)})"
        fix = "launcher.packaging=snapshot (kilocard's wheel is written into the run directory)"
        return [error("PACKAGING", "launcher.packaging", mode, why, fix)]
    if mode == "image" and not cfg.cluster.container_image:
        why = "packaging=image runs kilocard from the container image, but cluster.container_image is not set"
        fix = "build one with `kilocard image` and set cluster.container_image, or launcher.packaging=snapshot"
        return [error("PACKAGING", "launcher.packaging", mode, why, fix)]
    return []


def rule_packaging(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The code-delivery mode of a Slurm launch."""
    return packaging_issues(cfg) if cfg.launcher.kind == "slurm" else []


RULES = (rule_signal_lead, rule_packaging)
