"""Rules on the optimizer and the data-parallel overlap switches."""

from __future__ import annotations

import math
from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, below_floor, error, not_one_of, warning

P = "parallel."
OPTIMIZERS = ("adam", "sgd")
LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
"""The decay styles of Megatron-Core's ``OptimizerParamScheduler`` (any other raises at its first step)."""


def rule_optimizer_name(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The optimizer is one Megatron-Core builds."""
    if cfg.optim.optimizer not in OPTIMIZERS:
        yield error(
            "OPTIMIZER",
            "optim.optimizer",
            cfg.optim.optimizer,
            f"optimizer {cfg.optim.optimizer!r} is not one of {', '.join(OPTIMIZERS)}",
            "set optim.optimizer=adam",
        )


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


def rule_adam_betas(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``ADAM_BETA``: 0 <= ``optim.adam_beta1``, ``optim.adam_beta2`` < 1 (``torch.optim.Adam`` raises at
    start-up otherwise; a beta of 1 never forgets the first gradient)."""
    if cfg.optim.optimizer != "adam":
        return
    for name in ("adam_beta1", "adam_beta2"):
        v = getattr(cfg.optim, name)
        if math.isfinite(v) and not 0 <= v < 1:
            yield error(
                "ADAM_BETA",
                f"optim.{name}",
                v,
                f"optim.{name}={v} is outside [0, 1): torch.optim.Adam refuses it at start-up",
                f"set optim.{name}={0.9 if name == 'adam_beta1' else 0.95} (the usual values are 0.9 and 0.95-0.999)",
            )


def rule_adam_eps(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``ADAM_EPS``: ``optim.adam_eps`` > 0 (torch takes 0, but a parameter whose gradient is zero then gets
    0/0 = NaN: training goes silently wrong)."""
    if cfg.optim.optimizer == "adam":
        why = "Adam divides by sqrt(v) + eps, which is 0 for a zero gradient"
        yield from below_floor("ADAM_EPS", "optim.adam_eps", cfg.optim.adam_eps, 0, True, why, "set it to 1e-8")


def rule_clip_grad(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``CLIP_GRAD``: ``optim.clip_grad`` >= 0 (0 turns clipping off; a negative norm would flip the gradients'
    sign in Megatron-Core's clip: training ascends the loss)."""
    why = "a negative clip norm points the clipped gradients uphill"
    yield from below_floor(
        "CLIP_GRAD", "optim.clip_grad", cfg.optim.clip_grad, 0, False, why, "set it to 1.0 (or 0 to turn clipping off)"
    )


def rule_lr_schedule(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The LR schedule Megatron-Core's ``OptimizerParamScheduler`` builds: a known decay style, warm-up steps
    >= 0, decay steps >= 1 (it asserts ``lr_decay_steps > 0``), and a warm-up shorter than the decay (else
    the trainer shortens the warm-up: a warning)."""
    o = cfg.optim
    yield from not_one_of(
        "LR_DECAY_STYLE", "optim.lr_decay_style", o.lr_decay_style, LR_DECAY_STYLES, "set optim.lr_decay_style=cosine"
    )
    if o.lr_warmup_iters < 0:
        yield error(
            "LR_WARMUP_ITERS",
            "optim.lr_warmup_iters",
            o.lr_warmup_iters,
            f"optim.lr_warmup_iters={o.lr_warmup_iters} is negative",
            "set optim.lr_warmup_iters=0 (no warm-up) or a positive number of steps",
        )
    if o.lr_decay_iters is not None and o.lr_decay_iters < 1:
        yield error(
            "LR_DECAY_ITERS",
            "optim.lr_decay_iters",
            o.lr_decay_iters,
            f"optim.lr_decay_iters={o.lr_decay_iters} must be >= 1 (Megatron-Core asserts lr_decay_steps > 0)",
            "set optim.lr_decay_iters=null (decay over trainer.train_iters) or a positive number of steps",
        )
    decay = o.lr_decay_iters or cfg.trainer.train_iters
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
    rule_optimizer_name,
    rule_lr_order,
    rule_adam_betas,
    rule_adam_eps,
    rule_clip_grad,
    rule_lr_schedule,
    rule_overlap_param_gather,
    rule_overlap_p2p,
    rule_tp_comm_overlap,
)
