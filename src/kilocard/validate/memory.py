"""Rule: the estimated memory per GPU fits in HBM, minus a reserve; if not, nearby layouts that fit."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout, compute_layout
from kilocard.perf.memory import MemoryEstimate, estimate_memory
from kilocard.topology import GiB, cluster_hbm_bytes
from kilocard.validate.issues import Issue, error, warning

#: Share of HBM kept free for the caching allocator's fragmentation. Small, because the estimate
#: is Megatron-LM's formula, which already errs high for fused-kernel runs (it counts layer-norm
#: outputs that Transformer Engine's fused LayerNorm-Linear never stores, and dropout masks).
RESERVE_FRACTION = 0.03
#: Fixed bytes kept free per GPU: CUDA context, NCCL buffers, cuBLAS/TE workspaces.
RESERVE_FIXED_BYTES = 1 * GiB
#: Above this share of HBM a layout that fits still gets a MEMORY_TIGHT warning.
TIGHT_FRACTION = 0.90


def hbm_bytes(cfg: RunConfig) -> int | None:
    """Memory per GPU: cluster.hbm_bytes, else the GPU table's; ``None`` for an unknown GPU."""
    return cluster_hbm_bytes(cfg.cluster.hbm_bytes, cfg.cluster.gpu)


def usable_bytes(hbm: int) -> int:
    """HBM less the reserve (3% + 1 GiB)."""
    return max(0, int(hbm * (1 - RESERVE_FRACTION)) - RESERVE_FIXED_BYTES)


def _gib(b: float) -> str:
    return f"{b / GiB:.1f} GiB"


def rule_memory_fits(
    cfg: RunConfig,
    lay: Layout,
    est: MemoryEstimate | None = None,
    structural: Callable[[RunConfig, Layout], bool] | None = None,
) -> Iterable[Issue]:
    """The most loaded stage's weights + grads + optimizer + activations fit in usable HBM."""
    hbm = hbm_bytes(cfg)
    if hbm is None or lay.dp is None or lay.stage_layers is None:
        return
    est = est or estimate_memory(cfg, lay)
    usable = usable_bytes(hbm)
    if est.total <= usable:
        if est.total > TIGHT_FRACTION * hbm:
            yield warning(
                "MEMORY_TIGHT",
                "parallel.pipeline_model_parallel_size",
                lay.pp,
                f"estimated {_gib(est.total)} per GPU is {est.total / hbm:.0%} of {_gib(hbm)} HBM: "
                f"little headroom for fragmentation spikes",
                "consider the layouts `kilocard plan` ranks",
            )
        return
    fixes = suggest_layouts(cfg, usable, structural)
    hint = (
        ("layouts that fit: " + " | ".join(" ".join(f) for f in fixes))
        if fixes
        else "no nearby layout fits: use more nodes or a GPU with more memory"
    )
    yield error(
        "OUT_OF_MEMORY",
        "parallel.pipeline_model_parallel_size",
        lay.pp,
        f"estimated {_gib(est.total)} per GPU (weights {_gib(est.weights)} + gradients {_gib(est.gradients)} "
        f"+ optimizer {_gib(est.optimizer)} + activations {_gib(est.activations)}) > usable {_gib(usable)} "
        f"of {_gib(hbm)} HBM ({RESERVE_FRACTION:.0%} + {_gib(RESERVE_FIXED_BYTES)} reserved)",
        hint,
    )


def _variants(cfg: RunConfig) -> list[dict[str, object]]:
    """Single and paired changes to try, as ``{dotted.field: value}``."""
    p, m, t = cfg.parallel, cfg.model, cfg.trainer
    single: list[dict[str, object]] = []
    if not p.use_distributed_optimizer:
        single.append({"parallel.use_distributed_optimizer": True})
    if p.recompute_granularity != "full":
        single.append(
            {
                "parallel.recompute_granularity": "full",
                "parallel.recompute_method": "uniform",
                "parallel.recompute_num_layers": 1,
            }
        )
    if p.recompute_granularity is None and p.tensor_model_parallel_size > 1:
        single.append({"parallel.recompute_granularity": "selective", "parallel.sequence_parallel": True})
    for k in (2, 4, 8):
        single.append({"parallel.pipeline_model_parallel_size": p.pipeline_model_parallel_size * k})
    for k in (2, 4):
        tp = p.tensor_model_parallel_size * k
        single.append({"parallel.tensor_model_parallel_size": tp, "parallel.sequence_parallel": True})
    if m.num_moe_experts and m.num_moe_experts > 0:  # larger EP sizes that divide the experts
        ep, e = max(1, p.expert_model_parallel_size), m.num_moe_experts
        for d in [d for d in range(ep + 1, min(e, 1 << 16) + 1) if e % d == 0][:12]:
            single.append({"parallel.expert_model_parallel_size": d})
    if t.micro_batch_size > 1:
        single.append({"trainer.micro_batch_size": 1})
    pairs = [{**a, **b} for i, a in enumerate(single) for b in single[i + 1 :] if not set(a) & set(b)]
    return single + pairs


def _apply(cfg: RunConfig, change: dict[str, object]) -> RunConfig:
    groups: dict[str, dict[str, object]] = {}
    for path, v in change.items():
        g, f = path.split(".", 1)
        groups.setdefault(g, {})[f] = v
    return dataclasses.replace(cfg, **{g: dataclasses.replace(getattr(cfg, g), **fs) for g, fs in groups.items()})


def suggest_layouts(
    cfg: RunConfig, usable: int, structural: Callable[[RunConfig, Layout], bool] | None = None, limit: int = 3
) -> list[list[str]]:
    """Up to ``limit`` override lists, fewest changes first, whose layout is valid and fits."""
    found: list[tuple[int, int, list[str]]] = []
    for change in _variants(cfg):
        cand = _apply(cfg, change)
        lay = compute_layout(cand)
        if lay.dp is None or lay.stage_layers is None or (structural and not structural(cand, lay)):
            continue
        total = estimate_memory(cand, lay).total
        if total <= usable:
            lines = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in change.items()]
            found.append((len(change), total, lines))
    found.sort(key=lambda x: (x[0], x[1]))
    return [f[2] for f in found[:limit]]
