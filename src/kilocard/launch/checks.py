"""Validation rules of the Slurm launcher (pure: the config only, no environment, no I/O).

* ``SIGNAL_LEAD_SAVE``: ``launcher.signal_lead_s`` must leave time to finish the current step and
  write a checkpoint before the time limit kills the job: lead >= 1.2 x save time + 30 s, with the
  save time from ``checkpoint.expected_save_time_s`` or estimated as checkpoint bytes /
  ``cluster.fs_write_bandwidth_gbs``.
* ``SIGNAL_LEAD_TIME``: the lead must be shorter than ``launcher.time``.
* ``SBATCH_VALUE``: every value that reaches the batch script is renderable (see ``launch.shell``).
* ``SECRET_VALUE``: ``launcher.secret_env`` holds variable names, never values.
* ``PACKAGING``: ``launcher.packaging`` is ``snapshot``, ``image`` or ``none``; ``image`` needs
  ``cluster.container_image`` (the image ``kilocard image`` built).
"""

from __future__ import annotations

import math

from kilocard.config.schema import RunConfig
from kilocard.launch import shell
from kilocard.launch.package import PACKAGING
from kilocard.layout import Layout
from kilocard.perf.params import count_parameters
from kilocard.validate.issues import Issue, error

#: Seconds allowed for the step in flight to finish and the ranks to agree on the save step.
STEP_MARGIN_S = 30.0
#: Safety factor on the save time (filesystem bandwidth varies under load).
SAVE_FACTOR = 1.2


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Bytes of one checkpoint: weights + Adam moments (fp32) + fp32 main params when mixed precision."""
    params = count_parameters(cfg.model).total
    mixed = cfg.precision.bf16 or cfg.precision.fp16
    per_param = (2 + 4 if mixed else 4) + (8 if cfg.optim.optimizer == "adam" else 4)
    return params * per_param


def expected_save_time_s(cfg: RunConfig) -> float:
    """``checkpoint.expected_save_time_s``, or checkpoint bytes / filesystem write bandwidth."""
    if cfg.checkpoint.expected_save_time_s is not None:
        return float(cfg.checkpoint.expected_save_time_s)
    return checkpoint_bytes(cfg) / (max(cfg.cluster.fs_write_bandwidth_gbs, 1e-9) * 1e9)


def signal_lead_issues(cfg: RunConfig) -> list[Issue]:
    """``SIGNAL_LEAD_SAVE`` / ``SIGNAL_LEAD_TIME``."""
    from kilocard.launch.render import time_to_seconds  # render imports plan; keep this module light

    lead = cfg.launcher.signal_lead_s
    save = expected_save_time_s(cfg)
    need = math.ceil(SAVE_FACTOR * save + STEP_MARGIN_S)
    out: list[Issue] = []
    if lead < need:
        source = (
            "checkpoint.expected_save_time_s"
            if cfg.checkpoint.expected_save_time_s is not None
            else f"{checkpoint_bytes(cfg) / 1e9:.1f} GB"
            f" / cluster.fs_write_bandwidth_gbs={cfg.cluster.fs_write_bandwidth_gbs}"
        )
        out.append(
            error(
                "SIGNAL_LEAD_SAVE",
                "launcher.signal_lead_s",
                lead,
                f"USR1 comes {lead} s before the time limit, but a save takes ~{save:.0f} s ({source}); "
                f"needed {SAVE_FACTOR} x {save:.0f} + {STEP_MARGIN_S:.0f} s = {need} s",
                f"launcher.signal_lead_s={need} (or set checkpoint.expected_save_time_s to a measured value)",
            )
        )
    try:
        limit = time_to_seconds("launcher.time", cfg.launcher.time)
    except shell.ShellValueError as e:
        return out + [error("SBATCH_VALUE", e.field, e.value, str(e), "launcher.time=04:00:00")]
    if lead >= limit:
        out.append(
            error(
                "SIGNAL_LEAD_TIME",
                "launcher.signal_lead_s",
                lead,
                f"USR1 lead {lead} s is not shorter than launcher.time={cfg.launcher.time} ({limit} s)",
                f"launcher.signal_lead_s={max(1, limit // 2)} or a longer launcher.time",
            )
        )
    return out


def secret_issues(cfg: RunConfig) -> list[Issue]:
    """``SECRET_VALUE``: entries of launcher.secret_env must be variable names."""
    out = []
    for i, name in enumerate(cfg.launcher.secret_env):
        if not shell.ENV_NAME.fullmatch(str(name)):
            out.append(
                error(
                    "SECRET_VALUE",
                    f"launcher.secret_env[{i}]",
                    "<hidden>",
                    "launcher.secret_env holds variable NAMES (the value is read from the submitting shell)",
                    "launcher.secret_env=[WANDB_API_KEY] and `export WANDB_API_KEY=...` before submitting",
                )
            )
    return out


def packaging_issues(cfg: RunConfig) -> list[Issue]:
    """``PACKAGING``: a known code-delivery mode, and an image to deliver the code in for ``image``."""
    mode = cfg.launcher.packaging
    if mode not in PACKAGING:
        return [
            error(
                "PACKAGING",
                "launcher.packaging",
                mode,
                f"not a code-delivery mode (expected one of {', '.join(PACKAGING)})",
                "launcher.packaging=snapshot (kilocard's wheel is written into the run directory)",
            )
        ]
    if mode == "image" and not cfg.cluster.container_image:
        return [
            error(
                "PACKAGING",
                "launcher.packaging",
                mode,
                "packaging=image runs kilocard from the container image, but cluster.container_image is not set",
                "build one with `kilocard image` and set cluster.container_image, or launcher.packaging=snapshot",
            )
        ]
    return []


def rule_packaging(cfg: RunConfig, lay: Layout) -> list[Issue]:
    """Validator-rule form of ``packaging_issues`` (Slurm launches only)."""
    return packaging_issues(cfg) if cfg.launcher.kind == "slurm" else []


def rule_signal_lead(cfg: RunConfig, lay: Layout) -> list[Issue]:
    """Validator-rule form of ``signal_lead_issues`` (Slurm launches only)."""
    return signal_lead_issues(cfg) if cfg.launcher.kind == "slurm" else []


def rule_secret_env(cfg: RunConfig, lay: Layout) -> list[Issue]:
    """Validator-rule form of ``secret_issues``."""
    return secret_issues(cfg)


#: In the validator's ``rule(cfg, layout)`` form, for ``kilocard.validate`` to register.
RULES = (rule_signal_lead, rule_secret_env, rule_packaging)


def launcher_issues(cfg: RunConfig) -> list[Issue]:
    """Every Slurm-launcher rule, in order (``kilocard sbatch`` runs them after ``validate``)."""
    return signal_lead_issues(cfg) + secret_issues(cfg) + packaging_issues(cfg)
