"""Rules on the optimizer and the data-parallel overlap switches."""

from __future__ import annotations

import math
from collections.abc import Iterable

from kilocard.config.domains import choices
from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error, warning

P = "parallel."


def rule_overlap_param_gather(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """overlap_param_gather needs the distributed optimizer and overlap_grad_reduce (Megatron-LM)."""
    p = cfg.parallel
    if not p.overlap_param_gather:
        return
    if not p.use_distributed_optimizer:
        yield error(
            "OVERLAP_PARAM_GATHER_NEEDS_DISTOPT",
            P + "use_distributed_optimizer",
            False,
            "overlap_param_gather overlaps the distributed optimizer's all-gather, which is off",
            f"set {P}use_distributed_optimizer=true or {P}overlap_param_gather=false",
        )
    if not p.overlap_grad_reduce:
        yield error(
            "OVERLAP_PARAM_GATHER_NEEDS_GRAD_REDUCE",
            P + "overlap_grad_reduce",
            False,
            "overlap_param_gather must be used with overlap_grad_reduce",
            f"set {P}overlap_grad_reduce=true",
        )


def rule_overlap_p2p(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """overlap_p2p_comm does nothing without the interleaved schedule (Megatron-LM turns it off)."""
    p = cfg.parallel
    if p.overlap_p2p_comm and p.virtual_pipeline_model_parallel_size is None:
        yield warning(
            "OVERLAP_P2P_IGNORED",
            P + "overlap_p2p_comm",
            True,
            "overlap_p2p_comm only applies to the interleaved schedule (virtual_pipeline_model_parallel_size is null)",
            f"set {P}overlap_p2p_comm=false or set {P}virtual_pipeline_model_parallel_size",
        )


def rule_tp_comm_overlap(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """tp_comm_overlap needs sequence parallel (Megatron-LM)."""
    p = cfg.parallel
    if p.tp_comm_overlap and not p.sequence_parallel:
        yield error(
            "TP_COMM_OVERLAP_NEEDS_SP",
            P + "tp_comm_overlap",
            True,
            "tp_comm_overlap overlaps the sequence-parallel all-gather/reduce-scatter, but sequence_parallel is off",
            f"set {P}sequence_parallel=true or {P}tp_comm_overlap=false",
        )


def rule_lr_order(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``optim.min_lr <= optim.lr`` (Megatron-Core's OptimizerParamScheduler asserts it at start-up)."""
    o = cfg.optim
    if math.isfinite(o.lr) and math.isfinite(o.min_lr) and o.min_lr > o.lr:
        yield error(
            "LR_ORDER",
            "optim.min_lr",
            o.min_lr,
            f"optim.min_lr({o.min_lr}) > optim.lr({o.lr}): the decay would end above the peak",
            f"set optim.min_lr <= {o.lr} (e.g. optim.min_lr={o.lr / 10:g})",
        )


STATE_DTYPES = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
"""The optimizer-state dtype fields (the dtypes Megatron-Core takes for each are the domain table's)."""


def rule_precision_aware_optimizer(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Optimizer-state dtypes other than fp32 only with ``use_precision_aware_optimizer``, which needs Adam and
    the distributed optimizer (Megatron-Core ``OptimizerConfig.__post_init__``); which dtypes exist is the domain
    table's ``OPTIM_STATE_DTYPE``."""
    o = cfg.optim
    for name in STATE_DTYPES:
        value = getattr(o, name)
        if value in choices(f"optim.{name}") and value != "float32" and not o.use_precision_aware_optimizer:
            yield error(
                "OPTIM_STATE_DTYPE",
                f"optim.{name}",
                value,
                f"{name} {value!r} takes effect only with use_precision_aware_optimizer (Megatron-Core asserts fp32)",
                f"set optim.use_precision_aware_optimizer=true, or optim.{name}=float32",
            )
    if not o.use_precision_aware_optimizer:
        return
    if o.optimizer != "adam" or not cfg.parallel.use_distributed_optimizer:
        yield error(
            "PRECISION_AWARE_OPTIMIZER",
            "optim.use_precision_aware_optimizer",
            True,
            f"use_precision_aware_optimizer needs optimizer adam ({o.optimizer}) and the distributed optimizer "
            f"(use_distributed_optimizer={cfg.parallel.use_distributed_optimizer})",
            "set optim.optimizer=adam and parallel.use_distributed_optimizer=true, or "
            "optim.use_precision_aware_optimizer=false",
        )


def rule_lr_schedule(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LR_WARMUP_CLAMPED``: a warm-up shorter than the decay, else the trainer shortens the warm-up to the decay
    steps - 1 (Megatron-Core's ``OptimizerParamScheduler`` asserts it; the style and the step counts' ranges
    are their domains, ``kilocard.config.domains``).

    The shortening is a warning only where ``optim.lr_decay_iters`` is set: a decay chosen to end before the
    warm-up does. With the decay over the whole run (``lr_decay_iters=null``), a run shorter than its
    warm-up is a short run of a recipe whose warm-up was sized for the full run (``trainer.train_iters=4``
    to try it): the warm-up is shortened without a word, as Megatron-LM users expect a smoke test to run."""
    o = cfg.optim
    if o.lr_decay_iters is None:
        return  # decay over the run: a run shorter than its warm-up (a short run of a recipe) gets it shortened
    decay = o.lr_decay_iters
    if decay >= 1 and o.lr_warmup_iters >= decay:
        yield warning(
            "LR_WARMUP_CLAMPED",
            "optim.lr_warmup_iters",
            o.lr_warmup_iters,
            f"optim.lr_warmup_iters({o.lr_warmup_iters}) >= the decay steps({decay}): the warm-up is shortened "
            f"to {decay - 1} steps and the peak LR is reached only at the end",
            f"set optim.lr_warmup_iters < {decay} (e.g. {max(decay // 10, 0)})",
        )


RULES = (
    rule_lr_order,
    rule_lr_schedule,
    rule_overlap_param_gather,
    rule_overlap_p2p,
    rule_tp_comm_overlap,
    rule_precision_aware_optimizer,
)
