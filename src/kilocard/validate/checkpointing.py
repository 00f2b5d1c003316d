"""Checkpoint rules: ``checkpoint.save_interval`` against Young/Daly's (``perf.goodput``), and the
non-persistent (node-local) tier's fields (``RULES``: interval, kind, directory)."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from kilocard.config.domains import choices
from kilocard.config.schema import RunConfig
from kilocard.layout import world_size
from kilocard.perf.goodput import job_goodput, predicted_step_s
from kilocard.validate.issues import Issue, error, warning

INTERVAL_TOLERANCE = 2.0
"""The rule warns when the configured interval is more than this factor away from Young/Daly's."""


def rule_checkpoint_interval(cfg: RunConfig, layout: object = None) -> Iterable[Issue]:
    """Warn (CHECKPOINT_INTERVAL) when ``checkpoint.save_interval`` steps is far from Young/Daly's interval.

    Needs a predicted step time, so it says nothing for CPU ranks or GPUs the table lacks.
    """
    step = predicted_step_s(cfg)
    if step is None:
        return
    g = job_goodput(cfg)
    best_steps = max(1, round(g.optimal_interval_s / step))
    field = "checkpoint.save_interval"
    hint = (
        f"set {field}={best_steps} (Young/Daly: sqrt(2 x save {g.save_time_s:.0f} s x job MTBF "
        f"{g.job_mtbf_s / 3600:.1f} h) = {g.optimal_interval_s / 60:.1f} min at {step:.2f} s/step)"
    )
    interval = cfg.checkpoint.save_interval
    if interval <= 0:
        run_s = cfg.trainer.train_iters * step
        if run_s > INTERVAL_TOLERANCE * g.optimal_interval_s:
            yield warning(
                "CHECKPOINT_INTERVAL",
                field,
                interval,
                f"no periodic checkpoint in a {run_s / 3600:.1f} h run whose "
                f"{world_size(cfg.cluster)} "
                f"GPUs fail every {g.job_mtbf_s / 3600:.1f} h on average",
                hint,
            )
        return
    tau = interval * step
    ratio = tau / g.optimal_interval_s
    if ratio > INTERVAL_TOLERANCE or ratio < 1 / INTERVAL_TOLERANCE:
        loss_cfg, loss_best = g.lost_at(tau), g.lost_fraction
        yield warning(
            "CHECKPOINT_INTERVAL",
            field,
            interval,
            f"saving every {interval} steps ({tau / 60:.1f} min) loses {loss_cfg:.1%} of the time to saves "
            f"and rework; the Young/Daly interval loses {loss_best:.1%}",
            hint,
        )


LOCAL_TYPES = choices("checkpoint.non_persistent_ckpt_type")
"""``checkpoint.non_persistent_ckpt_type`` values kilocard runs (Megatron-LM also has ``global``, ``in_memory``)."""


def rule_local_interval(cfg: RunConfig, layout: object = None) -> Iterable[Issue]:
    """``checkpoint.non_persistent_save_interval``: null or >= 1 (OUT_OF_RANGE); a warning (LOCAL_INTERVAL)
    when it saves nothing the persistent saves do not already cover (every local step is a persistent one,
    it is not shorter than ``checkpoint.save_interval``, or longer than the run)."""
    n, c = cfg.checkpoint.non_persistent_save_interval, cfg.checkpoint
    field = "checkpoint.non_persistent_save_interval"
    if n is None:
        return
    if n < 1:
        yield error(
            "OUT_OF_RANGE",
            field,
            n,
            f"{field}={n} is out of range: steps between local saves must be >= 1 (null turns the tier off)",
            f"set {field}=null or a step count >= 1",
        )
        return
    every = c.save_interval
    if every > 0 and n % every == 0:
        why = f"every local save falls on a persistent save (checkpoint.save_interval={every}), so none is made"
    elif every > 0 and n > every:
        why = f"local saves are rarer than the persistent ones (checkpoint.save_interval={every})"
    elif n >= cfg.trainer.train_iters:
        why = f"no local save happens in a run of trainer.train_iters={cfg.trainer.train_iters} steps"
    else:
        return
    hint = (
        f"set {field} below checkpoint.save_interval (e.g. {max(1, every // 5)}), or null"
        if every
        else f"set {field}=null"
    )
    yield warning("LOCAL_INTERVAL", field, n, f"{field}={n}: {why}", hint)


def rule_local_type(cfg: RunConfig, layout: object = None) -> Iterable[Issue]:
    """``checkpoint.non_persistent_ckpt_type`` is one kilocard runs (``local``) when the tier is on."""
    kind = cfg.checkpoint.non_persistent_ckpt_type
    if cfg.checkpoint.non_persistent_save_interval is None or kind in LOCAL_TYPES:
        return
    yield error(
        "NON_PERSISTENT_TYPE",
        "checkpoint.non_persistent_ckpt_type",
        kind,
        f"checkpoint.non_persistent_ckpt_type={kind!r} is not a kind kilocard runs; it has {', '.join(LOCAL_TYPES)} "
        "(each rank's shard in node-local storage, NVRx's LocalCheckpointManager)",
        "set checkpoint.non_persistent_ckpt_type=local",
    )


def _inside(path: str, root: str) -> bool:
    """Whether absolute ``path`` is ``root`` or below it (lexically: pure, no filesystem access)."""
    p, r = posixpath.normpath(path), posixpath.normpath(root)
    return p == r or p.startswith(r.rstrip("/") + "/")


def rule_local_dir(cfg: RunConfig, layout: object = None) -> Iterable[Issue]:
    """``checkpoint.non_persistent_local_ckpt_dir``, when set, is an absolute node-local path: not under
    ``cluster.shared_fs`` (the run directories) nor ``checkpoint.save`` (LOCAL_CKPT_DIR)."""
    d, field = cfg.checkpoint.non_persistent_local_ckpt_dir, "checkpoint.non_persistent_local_ckpt_dir"
    if d is None:
        return
    fix = f"set {field}=null (node memory: /dev/shm) or an absolute node-local path such as /local/scratch"
    if not posixpath.isabs(str(d)):
        yield error(
            "LOCAL_CKPT_DIR",
            field,
            d,
            f"{field}={d!r} is not an absolute path; each node resolves it for itself",
            fix,
        )
        return
    shared = [("cluster.shared_fs", cfg.cluster.shared_fs), ("checkpoint.save", cfg.checkpoint.save)]
    for name, root in shared:
        if root and posixpath.isabs(str(root)) and _inside(str(d), str(root)):
            yield error(
                "LOCAL_CKPT_DIR",
                field,
                d,
                f"{field}={d!r} is under {name}={root!r}, the shared filesystem: the local tier would be "
                "neither node-local nor cheap",
                fix,
            )
            return


RULES = (rule_local_interval, rule_local_type, rule_local_dir)
"""The local tier's rules (every verb runs them; ``rule_checkpoint_interval`` runs with the prediction)."""
