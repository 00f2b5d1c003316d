"""LoRA rules (``peft=lora``; ``kilocard.train.lora``). Pure: they read the config only.

``PEFT_NO_BASE`` refuses LoRA without ``checkpoint.load``, as Megatron-Bridge does ("PEFT requires a
pretrained checkpoint path", ``ConfigContainer.validate``): adapters on a randomly initialised, frozen
base learn nothing useful, and a LoRA step holds no base weights to resume from.

What one field may hold (``peft.type``, each target module's name, a rank of at least 1, alpha, dropout, its
position and the init methods) is the domain table's (``config.domains``, codes ``PEFT_TYPE``, ``LORA_TARGET``,
``LORA_DIM``, ``LORA_SETTING``); these rules check what a value means beside the others.
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import LORA_TARGETS, RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error


def _lora(cfg: RunConfig) -> bool:
    return cfg.peft.type == "lora"


def rule_lora_targets(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``LORA_TARGET``: every ``peft.target_modules`` entry is named once (a module gets one adapter: a repeated
    name would count its adapter twice in memory, step time and checkpoint size), and there is one. That each
    is a linear layer the adapter wraps is the domain table's (``config.domains``)."""
    if not _lora(cfg):
        return
    targets = list(cfg.peft.target_modules)
    repeated = sorted({t for t in targets if targets.count(t) > 1})
    if repeated:
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
    """``LORA_DIM``: the rank divides over the TP ranks (A's rows of a column-parallel target are split over TP,
    as in Megatron-Bridge's adapter)."""
    if not _lora(cfg):
        return
    dim, tp = cfg.peft.dim, lay.tp
    if dim % tp:
        yield error(
            "LORA_DIM",
            "peft.dim",
            dim,
            f"is not a multiple of tensor_model_parallel_size {tp} (A's rank rows are split over TP)",
            f"set peft.dim={((dim + tp - 1) // tp) * tp}",
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


RULES = (rule_lora_targets, rule_lora_dim, rule_lora_base, rule_lora_model)
