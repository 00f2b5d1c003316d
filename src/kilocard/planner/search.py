"""``kilocard plan``: the layouts that fit, ranked by predicted throughput.

For the composed model, GPU count and cluster, the planner enumerates TP, PP, VP, CP, EP, ETP,
micro-batch size, recompute and the distributed optimizer, and keeps what the validator accepts
(memory included). Search order, cheapest first:

1. divisibility filters on plain integers (world, heads, query groups, layers, experts, batch,
   interleaved micro-batches), and CP only for long sequences (``MIN_CP_TOKENS`` per CP rank),
   before any config is built;
2. the analytic step time of every survivor (about 0.1 ms each), sorted fastest first;
3. walking that order: the memory estimate (about 0.1 ms), then the full validator (about 10 ms)
   only for candidates that could enter the table; a parallel layout (TP, PP, CP, EP, ETP) is
   listed once, with its fastest accepted VP / micro-batch / recompute / optimizer choice.

The walk stops once the top K layouts and the recipe's own layout are known (or after
``max_validations`` validator calls, which the output then says).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from kilocard.calibration.site import SiteFit
from kilocard.calibration.trust import ErrorBand, model_error
from kilocard.config.schema import RunConfig
from kilocard.layout import MEGATRON_NAMES, compute_layout, data_parallel_size, split_layers, world_size
from kilocard.perf.efficiency import FITTED, PerfModelParams
from kilocard.perf.flops import CURRENT, ModelShape, flops_per_iteration, shape_from_model
from kilocard.perf.memory import estimate_memory
from kilocard.perf.predict import hardware_for, precision_of, step_time
from kilocard.perf.steptime import Hardware
from kilocard.validate import validate
from kilocard.validate.memory import hbm_bytes, usable_bytes

RECOMPUTE_CHOICES = ("none", "selective", "full")
MBS_CHOICES = (1, 2, 4, 8, 16)
CONVENTION = CURRENT
MIN_CP_TOKENS = 4096
"""Context parallelism is tried only while each CP rank keeps at least this many tokens of a sequence:
below it the ring exchange no longer hides behind the attention blocks (CP is a long-context tool)."""


@dataclass(frozen=True)
class Candidate:
    """One point of the search space."""

    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline-parallel size."""
    vp: int | None
    """Virtual stages per pipeline rank (``None``: not interleaved)."""
    cp: int
    """Context-parallel size."""
    ep: int
    """Expert-parallel size."""
    etp: int | None
    """Expert tensor-parallel size (``None``: equal to TP)."""
    mbs: int
    """Micro-batch size."""
    recompute: str
    """``none``, ``selective`` or ``full``."""
    distributed_optimizer: bool
    """Shard the optimizer state over DP x CP."""
    first_stage_layers: int | None = None
    """Layers on the first pipeline stage when the split is uneven (``None``: even)."""
    last_stage_layers: int | None = None
    """Layers on the last pipeline stage when the split is uneven (``None``: even)."""

    @property
    def layout_key(self) -> tuple[int, int, int, int, int]:
        """(TP, PP, CP, EP, ETP): how the model is split; VP, MBS, recompute are schedule choices."""
        return (self.tp, self.pp, self.cp, self.ep, self.etp or self.tp)

    def override_values(self) -> dict[str, str]:
        """``{dotted field: value}`` of every field this candidate sets, as Hydra override values."""
        par = "parallel."
        full = self.recompute == "full"
        return {
            **{par + name: _value(getattr(self, k)) for k, name in MEGATRON_NAMES.items()},
            f"{par}sequence_parallel": _value(self.tp > 1),
            f"{par}recompute_granularity": "null" if self.recompute == "none" else self.recompute,
            f"{par}recompute_method": "uniform" if full else "null",
            f"{par}recompute_num_layers": "1" if full else "null",
            f"{par}num_layers_in_first_pipeline_stage": _value(self.first_stage_layers),
            f"{par}num_layers_in_last_pipeline_stage": _value(self.last_stage_layers),
            f"{par}use_distributed_optimizer": _value(self.distributed_optimizer),
            "trainer.micro_batch_size": str(self.mbs),
        }

    def overrides(self, base: dict[str, str] | None = None) -> list[str]:
        """Hydra overrides that select this candidate; with ``base`` (``config_values``), only the fields
        whose value differs from it."""
        base = base or {}
        return [f"{k}={v}" for k, v in self.override_values().items() if base.get(k) != v]


def config_values(cfg: RunConfig) -> dict[str, str]:
    """The config's own values of the fields a candidate sets, formatted as ``override_values``."""
    out = {}
    for key in Candidate(1, 1, None, 1, 1, None, 1, "none", False).override_values():
        section, _, name = key.partition(".")
        out[key] = _value(getattr(getattr(cfg, section), name))
    return out


def _value(v: object) -> str:
    """A config value as Hydra's override grammar writes it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def apply(cfg: RunConfig, c: Candidate) -> RunConfig:
    """``cfg`` with the candidate's parallel and micro-batch choices; the config's own pipeline layout
    stays only on a candidate with its PP, VP and no end-stage sizes (it names every stage)."""
    full = c.recompute == "full"
    p = cfg.parallel
    same_stages = (c.pp, c.vp) == (p.pipeline_model_parallel_size, p.virtual_pipeline_model_parallel_size)
    keep_layout = same_stages and c.first_stage_layers is None and c.last_stage_layers is None
    par = dataclasses.replace(
        cfg.parallel,
        pipeline_model_parallel_layout=p.pipeline_model_parallel_layout if keep_layout else None,
        **{name: getattr(c, k) for k, name in MEGATRON_NAMES.items()},
        sequence_parallel=c.tp > 1,
        recompute_granularity=None if c.recompute == "none" else c.recompute,
        recompute_method="uniform" if full else None,
        recompute_num_layers=1 if full else None,
        use_distributed_optimizer=c.distributed_optimizer,
        num_layers_in_first_pipeline_stage=c.first_stage_layers,
        num_layers_in_last_pipeline_stage=c.last_stage_layers,
        overlap_p2p_comm=cfg.parallel.overlap_p2p_comm and c.vp is not None,
        tp_comm_overlap=cfg.parallel.tp_comm_overlap and c.tp > 1,
        overlap_param_gather=cfg.parallel.overlap_param_gather and c.distributed_optimizer,
    )
    return dataclasses.replace(cfg, parallel=par, trainer=dataclasses.replace(cfg.trainer, micro_batch_size=c.mbs))


def current_candidate(cfg: RunConfig) -> Candidate:
    """The candidate a config already is."""
    p = cfg.parallel
    return Candidate(
        **{k: getattr(p, name) for k, name in MEGATRON_NAMES.items()},
        mbs=cfg.trainer.micro_batch_size,
        recompute=p.recompute_granularity or "none",
        distributed_optimizer=p.use_distributed_optimizer,
        first_stage_layers=p.num_layers_in_first_pipeline_stage,
        last_stage_layers=p.num_layers_in_last_pipeline_stage,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def stage_split(cfg: RunConfig, pp: int) -> tuple[int | None, int | None] | None:
    """(first, last) stage layers for ``pp`` stages: the config's uneven split when it still leaves
    layers for the middle stages, else an even split (embedding/loss accounting included); ``None``
    when neither works. Whole splits are ``kilocard.layout.split_layers``'s."""
    p = cfg.parallel
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    ends = (first is not None) + (last is not None)
    if ends and pp > ends and cfg.model.num_layers > (first or 0) + (last or 0):
        if _split(cfg, pp, first, last) is not None:
            return first, last
    return (None, None) if _split(cfg, pp, None, None) is not None else None


def _split(cfg: RunConfig, pp: int, first: int | None, last: int | None) -> list[int] | None:
    """``cfg``'s layers over ``pp`` stages with these end stages, as ``Layout.stage_layers`` splits them."""
    p = cfg.parallel
    embedding, loss = p.account_for_embedding_in_pipeline_split, p.account_for_loss_in_pipeline_split
    return split_layers(cfg.model.num_layers, pp, first, last, embedding, loss)


def enumerate_candidates(cfg: RunConfig, world: int) -> Iterator[Candidate]:
    """Every candidate that passes the divisibility filters (no config is built here)."""
    m, p, gbs = cfg.model, cfg.parallel, cfg.trainer.global_batch_size
    groups = m.num_query_groups or m.num_attention_heads
    domain = max(1, cfg.cluster.nvlink_domain_size)
    tps = [
        t
        for t in _pow2_upto(min(domain, m.num_attention_heads))
        if m.num_attention_heads % t == 0 and groups % t == 0 and world % t == 0
    ]
    split_layers = m.num_layers + p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split
    experts = m.num_moe_experts or 0
    cps = [c for c in _pow2_upto(64) if c == 1 or (m.seq_length % (2 * c) == 0 and m.seq_length // c >= MIN_CP_TOKENS)]
    for tp, cp in itertools.product(tps, cps):
        if world % (tp * cp):
            continue
        for pp in range(1, m.num_layers + 1):
            split = stage_split(cfg, pp) if world % (tp * cp * pp) == 0 else None
            if split is None:
                continue
            dp = data_parallel_size(world, tp, pp, cp)
            assert dp is not None  # the split above exists only for a whole DP
            vps: list[int | None] = [None]
            if pp > 1 and split == (None, None):
                vps += [v for v in _divisors(split_layers // pp) if 1 < v <= 16]
            eps = [e for e in _divisors(experts) if (dp * cp * tp) % e == 0] if experts else [1]
            etps: list[int | None] = [None, 1] if experts and tp > 1 else [None]
            for mbs in MBS_CHOICES:
                if gbs % (mbs * dp):
                    continue
                micro = gbs // (mbs * dp)
                for vp, ep, etp in itertools.product(vps, eps, etps):
                    if vp is not None and micro % pp:
                        continue
                    if experts and (world // pp) % ((etp or tp) * ep):
                        continue
                    for rc, dist in itertools.product(RECOMPUTE_CHOICES, (True, False)):
                        yield Candidate(tp, pp, vp, cp, ep, etp, mbs, rc, dist, *split)


@dataclass(frozen=True)
class Ranked:
    """A candidate the validator accepted, with its prediction."""

    candidate: Candidate
    """The choices."""
    step_time_s: float
    """Predicted seconds per step."""
    tflops_per_gpu: float
    """Predicted TFLOP/s per GPU (megatron_current)."""
    mfu: float
    """Predicted MFU against the dense peak of the run's GEMM dtype."""
    memory: dict[str, int]
    """Bytes per GPU by component (weights, gradients, optimizer, activations, total)."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """Predicted seconds per step by component."""


@dataclass
class Plan:
    """The planner's answer."""

    world: int
    """GPUs planned for."""
    gpu: str
    """GPU model."""
    peak_flops: float
    """Dense peak FLOP/s per GPU the MFUs divide by."""
    top: list[Ranked]
    """Best accepted candidate of each of the top layouts, fastest first."""
    recipe_layout_rank: int | None
    """1-based rank of the config's own layout among accepted layouts (``None``: not found)."""
    recipe: Ranked | None
    """The config's own layout as configured, when accepted."""
    recipe_issue: str | None
    """Why the config's own layout was not accepted (first error), if it was not."""
    candidates: int
    """Candidates after the divisibility filters."""
    validated: int
    """Validator calls made."""
    exhausted: bool
    """The validation budget ran out before the recipe's layout was placed."""
    hbm_usable_bytes: int | None = None
    """Usable memory per GPU the validator checks against."""
    over_memory: int = 0
    """Candidates skipped because their memory estimate exceeds the usable HBM."""
    min_memory_bytes: int | None = None
    """Smallest memory estimate among those skipped."""
    recipe_layout_best: Ranked | None = None
    """The fastest accepted choice of the config's own layout (row ``recipe_layout_rank`` of the ranking)."""
    base: dict[str, str] = field(default_factory=dict)
    """The config's own values of the fields a candidate sets (``config_values``): override lines list
    only the fields that differ from them."""
    model_error: ErrorBand | None = None
    """The performance model's held-out error on the published rows most like this run."""
    model_error_issue: str | None = None
    """Why ``model_error`` is unknown (no stored fold fits, or a broken file)."""
    site_fit: SiteFit | None = None
    """The site refit the predictions used (``perf.site_baselines``), with its rows' leave-one-out error."""


def _predictor(
    cfg: RunConfig, hw: Hardware, params: PerfModelParams = FITTED
) -> tuple[Callable[[Candidate], float], dict[int, float]]:
    """``step(candidate) -> seconds`` (shapes and FLOPs cached per TP) and the FLOPs per TP."""
    shapes: dict[int, ModelShape] = {}
    flops: dict[int, float] = {}
    par = cfg.parallel

    def step(c: Candidate) -> float:
        if c.tp not in shapes:
            shapes[c.tp] = shape_from_model(cfg.model, c.tp)
            flops[c.tp] = flops_per_iteration(
                dataclasses.replace(cfg, parallel=dataclasses.replace(par, tensor_model_parallel_size=c.tp)), CONVENTION
            )
        return step_time(apply(cfg, c), hw, params, shape=shapes[c.tp]).total_s

    return step, flops


def plan(cfg: RunConfig, top: int = 10, max_validations: int = 600, site: SiteFit | None = None) -> Plan:
    """Rank the accepted layouts of ``cfg``'s model on its cluster by predicted throughput (with ``site``'s
    refitted parameters when given, else the shipped fit)."""
    hw = hardware_for(cfg.cluster)
    world = world_size(cfg.cluster)
    params = site.params_for(cfg.cluster.gpu) if site else FITTED
    step, flops = _predictor(cfg, hw, params)
    cands = list(enumerate_candidates(cfg, world))
    own = current_candidate(cfg)
    own_issue = None
    if world % (own.tp * own.pp * own.cp):
        own_issue = (
            f"WORLD_NOT_DIVISIBLE: TP({own.tp}) * PP({own.pp}) * CP({own.cp}) = "
            f"{own.tp * own.pp * own.cp} does not divide the {world} GPUs"
        )
    elif own not in cands:
        cands.append(own)
    timed = sorted(((step(c), i, c) for i, c in enumerate(cands)), key=lambda x: (x[0], x[1]))
    hbm = hbm_bytes(cfg)
    usable = usable_bytes(hbm) if hbm else None
    peak = hw.peak_flops.get(precision_of(cfg), hw.peak_flops["bf16"])
    walk = _Walk(cfg, own, own_issue, usable, world, peak, hw, flops, params)
    exhausted = walk.run(timed, top, max_validations)
    rank = walk.order.index(own.layout_key) + 1 if own.layout_key in walk.accepted else None
    band, band_issue = model_error(cfg)
    return Plan(
        world=world,
        gpu=hw.gpu,
        peak_flops=peak,
        top=[walk.accepted[k] for k in walk.order[:top]],
        recipe_layout_rank=rank,
        recipe=walk.own_ranked,
        recipe_issue=walk.own_issue,
        candidates=len(cands),
        validated=walk.validated,
        exhausted=exhausted,
        hbm_usable_bytes=usable,
        over_memory=walk.over_memory,
        min_memory_bytes=walk.min_memory,
        recipe_layout_best=walk.accepted.get(own.layout_key),
        base=config_values(cfg),
        model_error=band,
        model_error_issue=band_issue,
        site_fit=site,
    )


@dataclass
class _Walk:
    """Down the candidates fastest first: memory estimate, then the validator, one layout key once."""

    cfg: RunConfig
    own: Candidate
    own_issue: str | None
    usable: int | None
    world: int
    peak: float
    hw: Hardware
    flops: dict[int, float]
    params: PerfModelParams
    accepted: dict[tuple, Ranked] = field(default_factory=dict)
    order: list[tuple] = field(default_factory=list)
    own_ranked: Ranked | None = None
    validated: int = 0
    over_memory: int = 0
    min_memory: int | None = None

    def run(self, timed: Iterable[tuple[float, int, Candidate]], top: int, max_validations: int) -> bool:
        """Walk until ``top`` layouts and the config's own are known; True when the budget ran out."""
        for t, _, c in timed:
            is_own = c == self.own
            if c.layout_key in self.accepted and not is_own:
                continue
            if len(self.order) >= top and (self.own_ranked is not None or self.own_issue is not None):
                return False
            run = apply(self.cfg, c)
            mem = estimate_memory(run, compute_layout(run))
            if self.usable is not None and mem.total > self.usable and not is_own:
                self.over_memory += 1
                self.min_memory = mem.total if self.min_memory is None else min(self.min_memory, mem.total)
                continue
            if self.validated >= max_validations:
                return True
            report = validate(run)
            self.validated += 1
            if not report.valid:
                if is_own:
                    self.own_issue = f"{report.errors[0].code}: {report.errors[0].message}"
                continue
            ranked = _rank(c, t, self.flops[c.tp], self.world, self.peak, mem.to_json(), run, self.hw, self.params)
            if is_own:
                self.own_ranked = ranked
            if c.layout_key not in self.accepted:
                self.accepted[c.layout_key] = ranked
                self.order.append(c.layout_key)
        return False


def _rank(
    c: Candidate,
    t: float,
    flops: float,
    world: int,
    peak: float,
    memory: dict[str, int],
    run: RunConfig,
    hw: Hardware,
    params: PerfModelParams,
) -> Ranked:
    tflops = flops / t / world / 1e12
    breakdown = step_time(run, hw, params).breakdown
    return Ranked(
        candidate=c, step_time_s=t, tflops_per_gpu=tflops, mfu=tflops * 1e12 / peak, memory=memory, breakdown=breakdown
    )


# --- output ---------------------------------------------------------------------------------


OWN_MARK = "*"
"""Marks the table row of the config's own layout."""
AS_CONFIGURED = "cfg"
"""The ``#`` of the extra row showing the config's own layout exactly as configured."""


def table_rows(p: Plan) -> list[tuple[str, Ranked]]:
    """(``#``, entry) of every table row: the top layouts, the config's own layout marked ``*`` (appended
    with its rank when below the top), then the own layout as configured (``cfg*``) when that is not
    the row's choice of VP, micro-batch, recompute and optimizer."""
    rank, best = p.recipe_layout_rank, p.recipe_layout_best
    rows = [(f"{i + 1}{OWN_MARK if i + 1 == rank else ''}", r) for i, r in enumerate(p.top)]
    if rank is not None and best is not None and rank > len(p.top):
        rows.append((f"{rank}{OWN_MARK}", best))
    if p.recipe is not None and (best is None or p.recipe.candidate != best.candidate):
        rows.append((AS_CONFIGURED + OWN_MARK, p.recipe))
    return rows
