"""LoRA rules (``peft=lora``; ``kilocard.train.lora``). Pure: they read the config only.

``PEFT_NO_BASE`` refuses LoRA without ``checkpoint.load``, as Megatron-Bridge does ("PEFT requires a
pretrained checkpoint path", ``ConfigContainer.validate``): adapters on a randomly initialised, frozen
base learn nothing useful, and a LoRA step holds no base weights to resume from.
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.domains import choices
from kilocard.config.schema import LORA_INIT_METHODS, LORA_TARGETS, RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error

PEFT_TYPES = (None, *choices("peft.type"))
"""``peft.type`` values."""


def _lora(cfg: RunConfig) -> bool:
    return cfg.peft.type == "lora"


def rule_peft_type(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``PEFT_TYPE``: ``peft.type`` is ``lora`` or null."""
    if cfg.peft.type not in PEFT_TYPES:
        yield error("PEFT_TYPE", "peft.type", cfg.peft.type, "is not lora or null", "select peft=lora or peft=none")


def rule_lora_targets(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LORA_TARGET``: every ``peft.target_modules`` entry is a linear layer the adapter wraps, once (a module gets
    one adapter: a repeated name would count its adapter twice in memory, step time and checkpoint size), and
    there is one."""
    if not _lora(cfg):
        return
    targets = list(cfg.peft.target_modules)
    unknown = [t for t in targets if t not in LORA_TARGETS]
    repeated = sorted({t for t in targets if targets.count(t) > 1})
    if unknown:
        why = f"unknown target module(s) {unknown}"
    elif repeated:
        why = f"names {', '.join(repeated)} more than once"
    elif not targets:
        why = "names no module"
    else:
        return
    yield error(
        "LORA_TARGET",
        "peft.target_modules",
        targets,
        why,
        f"choose among {', '.join(LORA_TARGETS)}, e.g. peft.target_modules=[linear_qkv,linear_proj]",
    )


def rule_lora_dim(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LORA_DIM``: the rank is at least 1 and divides over the TP ranks (A's rows of a column-parallel target
    are split over TP, as in Megatron-Bridge's adapter)."""
    if not _lora(cfg):
        return
    dim, tp = cfg.peft.dim, lay.tp
    if dim < 1:
        yield error("LORA_DIM", "peft.dim", dim, "the LoRA rank must be at least 1", "set peft.dim=8 (or 16, 32, ...)")
    elif dim % tp:
        yield error(
            "LORA_DIM",
            "peft.dim",
            dim,
            f"is not a multiple of tensor_model_parallel_size {tp} (A's rank rows are split over TP)",
            f"set peft.dim={((dim + tp - 1) // tp) * tp}",
        )


def rule_lora_settings(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LORA_SETTING``: alpha positive, dropout in [0, 1), a known dropout position and init methods."""
    if not _lora(cfg):
        return
    p = cfg.peft
    if p.alpha <= 0:
        yield error(
            "LORA_SETTING", "peft.alpha", p.alpha, "must be positive (the scale is alpha / dim)", "set peft.alpha=32"
        )
    if not 0.0 <= p.dropout < 1.0:
        yield error("LORA_SETTING", "peft.dropout", p.dropout, "must lie in [0, 1)", "set peft.dropout=0.0")
    if p.dropout_position not in ("pre", "post"):
        yield error("LORA_SETTING", "peft.dropout_position", p.dropout_position, "is not pre or post", "set it to pre")
    for name in ("lora_A_init_method", "lora_B_init_method"):
        value = getattr(p, name)
        if value not in LORA_INIT_METHODS:
            yield error(
                "LORA_SETTING", f"peft.{name}", value, f"is not one of {', '.join(LORA_INIT_METHODS)}", "use xavier"
            )


def rule_lora_base(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``PEFT_NO_BASE``: LoRA needs base weights to freeze (``checkpoint.load``), as Megatron-Bridge requires."""
    if _lora(cfg) and not cfg.checkpoint.load:
        yield error(
            "PEFT_NO_BASE",
            "checkpoint.load",
            None,
            "peft=lora trains adapters on frozen base weights, and none are given",
            "set checkpoint.load to the base checkpoint (kilocard convert hf-to-mcore HF_DIR DIR writes one)",
        )


def rule_lora_model(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LORA_MODEL``: kilocard's adapter covers dense attention and MLPs (no MoE experts, no MLA projections)."""
    if not _lora(cfg):
        return
    m = cfg.model
    if m.num_moe_experts:
        yield error(
            "LORA_MODEL", "model.num_moe_experts", m.num_moe_experts, "LoRA on MoE models is not built", "use peft=none"
        )
    if m.multi_latent_attention:
        yield error("LORA_MODEL", "model.multi_latent_attention", True, "LoRA on MLA is not built", "use peft=none")


RULES = (rule_peft_type, rule_lora_targets, rule_lora_dim, rule_lora_settings, rule_lora_base, rule_lora_model)
