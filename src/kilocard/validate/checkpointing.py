"""The checkpoint-interval rule: ``checkpoint.save_interval`` against Young/Daly's (``perf.goodput``)."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.perf.goodput import job_goodput, predicted_step_s
from kilocard.validate.issues import Issue, warning

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
                f"{cfg.cluster.nodes * cfg.cluster.gpus_per_node} "
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
