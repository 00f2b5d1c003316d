"""Pre-launch validation: ``validate(cfg) -> Report`` (pure: no environment, no I/O).

Each concern is a module of small named rules ``rule_x(cfg, layout) -> Iterable[Issue]``:
``model``, ``moe``, ``attention``, ``parallel``, ``batch``, ``precision``, ``optimizer``, ``recompute``, ``topology``,
``launcher``, ``inputs``, ``dataset``, ``evaluation``, ``peft``, ``environment``, ``slurm``, ``checkpointing``,
``resilience`` and ``memory`` (the list of the start-up and silently-wrong rules: docs/validation.md). The
report holds
every problem at once, the layout and the estimates (memory per GPU by component against HBM, FLOPs per
iteration).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout, compute_layout
from kilocard.perf.efficiency import FITTED, PerfModelParams
from kilocard.perf.flops import flops_per_iteration
from kilocard.perf.memory import estimate_memory
from kilocard.perf.predict import Prediction, predict
from kilocard.validate import (
    attention,
    batch,
    checkpointing,
    dataset,
    domains,
    environment,
    evaluation,
    inputs,
    launcher,
    model,
    moe,
    optimizer,
    parallel,
    peft,
    precision,
    recompute,
    resilience,
    slurm,
    topology,
)
from kilocard.validate import tokenizer as tokenizer_rules
from kilocard.validate.estimates import FLOPS_CONVENTION, Estimates
from kilocard.validate.issues import ERROR, WARNING, Issue, Report
from kilocard.validate.memory import hbm_bytes, rule_memory_fits, usable_bytes

Rule = Callable[[RunConfig, Layout], Iterable[Issue]]

#: Rules whose errors make a layout structurally invalid (used to filter memory suggestions).
STRUCTURAL_RULES: tuple[Rule, ...] = (
    model.RULES + moe.RULES + attention.RULES + parallel.RULES + batch.RULES + recompute.RULES
)


#: Every rule except the memory fit, in report order.
RULES: tuple[Rule, ...] = (
    STRUCTURAL_RULES
    + precision.RULES
    + optimizer.RULES
    + topology.RULES
    + launcher.RULES
    + inputs.RULES
    + dataset.RULES
    + evaluation.RULES
    + peft.RULES
    + tokenizer_rules.RULES
    + environment.RULES
    + slurm.RULES
    + checkpointing.RULES
    + resilience.RULES
)

#: Issue codes for conditions Megatron-Core itself rejects (at config, group or model construction).
MCORE_CODES = frozenset(
    {
        "PARALLEL_SIZE",
        "WORLD_NOT_DIVISIBLE",
        "EXPERT_WORLD_NOT_DIVISIBLE",
        "TP_PP_DP_EXPERT_DP",
        "TP_HEADS",
        "TP_QUERY_GROUPS",
        "SP_WITHOUT_TP",
        "MOE_TP_WITHOUT_SP",
        "EP_WITHOUT_EXPERTS",
        "EXPERTS_EP",
        "EXPERTS_NOT_POSITIVE",
        "VP_WITHOUT_PP",
        "LAYERS_PP",
        "LAYERS_VP",
        "LAYERS_ACCOUNTING",
        "UNEVEN_PP_WITH_ACCOUNTING",
        "UNEVEN_PP_STAGE",
        "UNEVEN_PP_VP",
        "UNEVEN_PP_MISMATCH",
        "UNEVEN_PP_MIDDLE",
        "PIPELINE_LAYOUT",
        "PIPELINE_LAYOUT_CONFLICT",
        "CPU_OFFLOAD_LAYERS",
        "CPU_OFFLOAD_PP",
        "CPU_OFFLOAD_RECOMPUTE",
        "OPTIM_STATE_DTYPE",
        "PRECISION_AWARE_OPTIMIZER",
        "FP16_AND_BF16",
        "FP8_AND_FP4",
        "FP8_PARAM_WITHOUT_FP8",
        "RECOMPUTE_GRANULARITY",
        "RECOMPUTE_METHOD",
        "RECOMPUTE_NUM_LAYERS",
    }
)


def structurally_valid(cfg: RunConfig, lay: Layout) -> bool:
    """No error from the structural rules (model, parallel, batch, recompute) or TP placement."""
    rules = (domains.rule_field_domains,) + STRUCTURAL_RULES + (topology.rule_tp_nvlink,)
    return not any(i.severity == ERROR for r in rules for i in r(cfg, lay))


def run_rules(cfg: RunConfig, lay: Layout, rules: Iterable[Rule] = RULES) -> list[Issue]:
    """Every issue the rules find, in order."""
    return [issue for rule in rules for issue in rule(cfg, lay)]


def estimates(cfg: RunConfig, lay: Layout) -> Estimates:
    """Memory per GPU by component, HBM, FLOPs per iteration (``None`` where the shape is invalid)."""
    hbm = hbm_bytes(cfg)
    usable = usable_bytes(hbm) if hbm else None
    if not model.model_shape_ok(cfg):
        return Estimates(hbm_bytes=hbm, hbm_usable_bytes=usable)
    flops = _flops(cfg) if cfg.parallel.tensor_model_parallel_size >= 1 else None  # the shape pads vocab by TP
    return Estimates(
        memory=estimate_memory(cfg, lay), hbm_bytes=hbm, hbm_usable_bytes=usable, flops_per_iteration=flops
    )


def _flops(cfg: RunConfig) -> float | None:
    return float(flops_per_iteration(cfg, convention=FLOPS_CONVENTION))


def validate(cfg: RunConfig, params: PerfModelParams = FITTED) -> Report:
    """Check ``cfg`` against every rule and estimate its memory and FLOPs (pure); the prediction uses the
    performance model's ``params`` (a site refit's, or the shipped fit)."""
    lay = compute_layout(cfg)
    outside = list(domains.rule_field_domains(cfg, lay))
    issues = run_rules(cfg, lay)
    if outside:  # a field outside its domain is said once, and nothing is estimated from it
        named = {o.field.partition("[")[0] for o in outside}
        issues = [i for i in issues if i.severity == ERROR and i.field.partition("[")[0] not in named]
        return Report(issues=outside + issues, layout=lay, estimates=Estimates(hbm_bytes=hbm_bytes(cfg)))
    est = estimates(cfg, lay)
    if est.memory is not None and not any(i.code == "WORLD_NOT_DIVISIBLE" for i in issues):
        issues.extend(rule_memory_fits(cfg, lay, structural=structurally_valid))
    if not any(i.severity == ERROR for i in issues):
        est = replace(est, prediction=_prediction(cfg, lay, issues, params))
    return Report(issues=issues, layout=lay, estimates=est)


def _prediction(cfg: RunConfig, lay: Layout, issues: list[Issue], params: PerfModelParams) -> Prediction:
    """For a valid config: predicted step time and MFU; adds the checkpoint-interval (goodput) rule's issues.

    Both need a layout that Megatron-Core would build, so they run only when no rule found an error.
    """
    issues.extend(checkpointing.rule_checkpoint_interval(cfg, lay))
    return predict(cfg, params=params, layout=lay)


__all__ = ["validate", "Report", "Issue", "Estimates", "RULES", "MCORE_CODES", "ERROR", "WARNING", "compute_layout"]
