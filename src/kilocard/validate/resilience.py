"""Rules on the hang guard: a ``trainer.hang_timeout_s`` the trainer can keep.

The watchdog of every rank exits FAULT when the step loop makes no progress for ``hang_timeout_s``
(``kilocard.train.signals``); under Slurm FAULT requeues the job. A timeout shorter than a step or a
save therefore declares a healthy run hung at every start: a requeue loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error, warning
from kilocard.validate.model import model_shape_ok
from kilocard.validate.slurm import expected_save_time_s

MIN_HANG_TIMEOUT_S = 10.0
"""Shortest hang timeout accepted: a step of a small model, a collective's retry and a log flush fit in it."""


def rule_hang_timeout(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``HANG_TIMEOUT``: ``trainer.hang_timeout_s`` is 0 (off) or >= ``MIN_HANG_TIMEOUT_S``; a warning when a
    checkpoint save is expected to take longer than it (the save would be declared a hang)."""
    h = cfg.trainer.hang_timeout_s
    if not math.isfinite(h) or h <= 0:
        return  # off, or NOT_FINITE / OUT_OF_RANGE (kilocard.validate.inputs)
    if h < MIN_HANG_TIMEOUT_S:
        yield error(
            "HANG_TIMEOUT",
            "trainer.hang_timeout_s",
            h,
            f"trainer.hang_timeout_s={h:g} is shorter than a training step can be relied on to take "
            f"(minimum {MIN_HANG_TIMEOUT_S:g} s): every rank would be declared hung at its first step (FAULT, "
            "and under Slurm a requeue loop)",
            f"set trainer.hang_timeout_s to at least {MIN_HANG_TIMEOUT_S:g} (the default is 300), or 0 to turn the "
            "guard off",
        )
        return
    save_s, bandwidth = cfg.checkpoint.expected_save_time_s, cfg.cluster.fs_write_bandwidth_gbs
    if save_s is None and not model_shape_ok(cfg):
        return  # no size to estimate the save from (MODEL_SHAPE names it)
    if not math.isfinite(bandwidth) or bandwidth <= 0 or (save_s is not None and not math.isfinite(save_s)):
        return  # NOT_FINITE / OUT_OF_RANGE (validate.inputs) name them
    save = expected_save_time_s(cfg)
    if save >= h:
        yield warning(
            "HANG_TIMEOUT_SAVE",
            "trainer.hang_timeout_s",
            h,
            f"trainer.hang_timeout_s={h:g} is not longer than the expected checkpoint save ({save:.0f} s): a save "
            "would be declared a hang",
            f"set trainer.hang_timeout_s above {math.ceil(save * 2)} (or checkpoint.expected_save_time_s to the "
            "measured save time)",
        )


RULES = (rule_hang_timeout,)
