"""Goodput under failures: the Young/Daly checkpoint interval and the expected fraction of time lost.

A job on N GPUs, each failing at rate ``lambda`` per second, fails every ``M = 1 / (lambda N)``
seconds on average. Saving a checkpoint costs ``delta`` seconds of training time; after a failure
the job restarts (``restart_s``) and redoes on average half an interval. To first order (Young
1974, Daly 2006) the interval that minimises the loss is ``tau = sqrt(2 delta M)`` and the fraction
of wall time lost is ``delta / tau + (tau + delta) / (2 M) + restart_s / M``.

The default failure rate is Llama 3's (Meta, "The Llama 3 Herd of Models", 2024, section 3.3.4):
419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kilocard.config.schema import RunConfig
from kilocard.layout import world_size
from kilocard.perf.memory import checkpoint_bytes
from kilocard.perf.predict import predict
from kilocard.topology import gpu_spec

LLAMA3_INTERRUPTIONS = 419
"""Unexpected interruptions during Llama 3 405B pre-training."""
LLAMA3_DAYS = 54
"""Over this many days."""
LLAMA3_GPUS = 16384
"""On this many GPUs."""
DEFAULT_FAILURE_RATE_PER_GPU_S = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 86400.0 * LLAMA3_GPUS)
"""Failures per GPU per second (about 0.17 per GPU-year: one per 5.8 GPU-years)."""
HOST_COPY_BANDWIDTH = 25e9
"""Bytes/s at which an asynchronous save stages a GPU's shard to host memory (PCIe Gen4 x16, practical)."""


@dataclass(frozen=True)
class Goodput:
    """Checkpoint interval and expected loss for one job."""

    job_mtbf_s: float
    """Mean time between failures of the whole job."""
    save_time_s: float
    """Training time one checkpoint save costs."""
    optimal_interval_s: float
    """Young/Daly interval sqrt(2 * save * MTBF)."""
    lost_fraction: float
    """Expected fraction of wall time lost at the optimal interval (saves + rework + restarts)."""

    def lost_at(self, interval_s: float, restart_s: float = 0.0) -> float:
        """Expected fraction of time lost when saving every ``interval_s`` seconds."""
        return lost_fraction(interval_s, self.save_time_s, self.job_mtbf_s, restart_s)


def lost_fraction(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """First-order expected loss: ``save/tau + (tau + save)/(2 M) + restart/M``."""
    if interval_s <= 0:
        raise ValueError(f"checkpoint interval {interval_s} s must be positive")
    return save_s / interval_s + (interval_s + save_s) / (2 * mtbf_s) + restart_s / mtbf_s


def goodput(
    num_gpus: int,
    save_time_s: float,
    failure_rate_per_gpu_s: float = DEFAULT_FAILURE_RATE_PER_GPU_S,
    restart_s: float = 0.0,
) -> Goodput:
    """Young/Daly interval and loss for ``num_gpus`` GPUs and a save costing ``save_time_s``."""
    if num_gpus < 1 or failure_rate_per_gpu_s <= 0 or save_time_s < 0:
        raise ValueError(
            f"goodput: need num_gpus >= 1 ({num_gpus}), a positive failure rate "
            f"({failure_rate_per_gpu_s}) and a save time >= 0 ({save_time_s})"
        )
    mtbf = 1.0 / (failure_rate_per_gpu_s * num_gpus)
    tau = math.sqrt(2.0 * max(save_time_s, 1e-9) * mtbf)
    return Goodput(
        job_mtbf_s=mtbf,
        save_time_s=save_time_s,
        optimal_interval_s=tau,
        lost_fraction=lost_fraction(tau, save_time_s, mtbf, restart_s),
    )


def save_time_s(cfg: RunConfig) -> float:
    """Training time one save costs: the configured figure, else ``checkpoint_bytes`` / filesystem
    bandwidth (async saves: the largest GPU shard staged to host memory)."""
    if cfg.checkpoint.expected_save_time_s is not None:
        return float(cfg.checkpoint.expected_save_time_s)
    size = checkpoint_bytes(cfg)
    gpus = world_size(cfg.cluster)
    if cfg.checkpoint.async_save:
        return size / max(1, gpus) / HOST_COPY_BANDWIDTH
    return size / (cfg.cluster.fs_write_bandwidth_gbs * 1e9)


def job_goodput(cfg: RunConfig, failure_rate_per_gpu_s: float = DEFAULT_FAILURE_RATE_PER_GPU_S) -> Goodput:
    """Goodput of the job ``cfg`` describes."""
    return goodput(world_size(cfg.cluster), save_time_s(cfg), failure_rate_per_gpu_s)


def predicted_step_s(cfg: RunConfig) -> float | None:
    """Predicted wall seconds per step on the configured GPUs, the evaluations spread over the steps between
    them included (``trainer.eval_interval``); ``None`` for CPU ranks, unknown GPUs or bad layouts."""
    spec = gpu_spec(cfg.cluster.gpu)
    if spec is None or spec.vendor == "cpu":
        return None
    try:
        p = predict(cfg)
        return p.step_time_s + p.eval_s_per_step
    except (ValueError, ZeroDivisionError, KeyError):
        return None  # an invalid layout: the parallel/batch rules already report it
