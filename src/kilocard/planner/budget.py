"""``kilocard budget``: from a compute budget (GPUs x days, or FLOPs) to model size, tokens, batch, layout and jobs.

For the recipe's model family, ``candidate_models`` builds a ladder of sizes with one shape rule
(``scaled_model``); each size is a real ``RunConfig`` whose layout on the budget's GPUs comes from
``kilocard.planner.search.plan`` (the validator accepts it). Its throughput and the goodput model
(``kilocard.perf.goodput``) give the tokens the budget affords; a published scaling law gives the
predicted loss; the candidate with the lowest predicted loss is the pick. The global batch and LR come
from DeepSeek LLM's fit against compute. Every law, its source and its limits: docs/budget.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from kilocard.config.domains import BUDGET_DOMAINS
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.layout import world_size
from kilocard.perf.flops import flops_per_iteration
from kilocard.perf.goodput import DEFAULT_FAILURE_RATE_PER_GPU_S, goodput, save_time_s
from kilocard.perf.params import count_parameters
from kilocard.perf.predict import hardware_for
from kilocard.planner.search import CONVENTION, Ranked, apply, config_values, plan

SECONDS_PER_DAY = 86400.0
BUDGET_KEYS = ("gpus", "days", "flops")
"""Budget arguments of ``kilocard budget`` in the override grammar (taken out before Hydra composition)."""


# --- scaling laws -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Chinchilla:
    """Parametric loss ``L(N, D) = E + A / N^alpha + B / D^beta`` (Hoffmann et al. 2022, approach 3)."""

    name: str
    """Where the constants come from."""
    E: float
    """Irreducible loss (nats per token on the fit's data)."""
    A: float
    """Parameter term coefficient."""
    B: float
    """Data term coefficient."""
    alpha: float
    """Parameter exponent."""
    beta: float
    """Data exponent."""

    def loss(self, params: float, tokens: float) -> float:
        """Predicted loss of ``params`` parameters trained on ``tokens`` tokens."""
        return self.E + self.A / params**self.alpha + self.B / tokens**self.beta

    def optimum(self, flops: float) -> tuple[float, float]:
        """(N, D) minimising the loss under ``C = 6 N D`` (Hoffmann et al. 2022, eq. 4)."""
        a, b = self.alpha, self.beta
        g = (a * self.A / (b * self.B)) ** (1.0 / (a + b))
        n = g * (flops / 6.0) ** (b / (a + b))
        return n, flops / (6.0 * n)


HOFFMANN = Chinchilla("Hoffmann et al. 2022 (approach 3)", 1.69, 406.4, 410.7, 0.34, 0.28)
"""Chinchilla's own fit: with these rounded constants its optimum for 5.76e23 FLOPs lies near 32B parameters
(often quoted as ~40B), well under Chinchilla's 70B."""
BESIROGLU = Chinchilla("Besiroglu et al. 2024 (replication)", 1.8172, 482.01, 2085.43, 0.3478, 0.3658)
"""The replication's refit of approach 3, consistent with Hoffmann's approaches 1 and 2 (~20 tokens/param)."""
DEFAULT_LAW = BESIROGLU
"""The law the pick uses."""


@dataclass(frozen=True)
class JointMoE:
    """Joint MoE scaling law of Ludziejewski et al. 2025 (arXiv 2502.05172):
    ``L = a E^delta N_act^-(alpha + gamma ln E) + b E^omega D^-(beta + zeta ln E) + c``."""

    a: float = 35.91
    """Active-parameter term coefficient."""
    delta: float = 0.2285
    """Expert exponent of the parameter term."""
    alpha: float = 0.1889
    """Active-parameter exponent at one expert."""
    gamma: float = 0.0098
    """Change of that exponent per ``ln E``."""
    b: float = 35.98
    """Data term coefficient."""
    omega: float = -0.5529
    """Expert exponent of the data term."""
    beta: float = 0.1775
    """Data exponent at one expert."""
    zeta: float = -0.0259
    """Change of that exponent per ``ln E``."""
    c: float = 1.3637
    """Irreducible loss (on the fit's data: not comparable with Chinchilla's)."""
    max_experts: int = 64
    """Expert counts above this are clamped: the fit saw small counts, and at hundreds of experts its data
    exponent goes to zero (the paper transforms large counts, which this rule does not reproduce)."""

    def loss(self, active: float, tokens: float, experts: int) -> float:
        """Predicted loss of an MoE with ``active`` parameters per token and ``experts`` experts."""
        e = float(min(max(1, experts), self.max_experts))
        le = math.log(e)
        n_term = self.a * e**self.delta * active ** -(self.alpha + self.gamma * le)
        d_term = self.b * e**self.omega * tokens ** -(self.beta + self.zeta * le)
        return n_term + d_term + self.c


JOINT_MOE = JointMoE()


def deepseek_flops_per_token(layers: int, hidden: int, seq: int) -> float:
    """DeepSeek LLM's non-embedding FLOPs per token ``M = 72 n d^2 + 6 n d l_seq``."""
    return 72.0 * layers * hidden**2 + 6.0 * layers * hidden * seq


def batch_tokens(compute: float) -> float:
    """DeepSeek LLM's optimal batch in tokens, ``0.2920 C^0.3271`` (C = M D in FLOPs)."""
    return 0.2920 * compute**0.3271


def learning_rate(compute: float) -> float:
    """DeepSeek LLM's optimal peak learning rate, ``0.3118 C^-0.1250``."""
    return 0.3118 * compute**-0.1250


def round_batch(sequences: float) -> int:
    """``sequences`` rounded to ``m * 2^k`` with ``m`` in 8..15 (within 6%): a batch many DP sizes divide."""
    s = max(1.0, sequences)
    if s < 16:
        return max(1, round(s))
    k = int(math.floor(math.log2(s))) - 3
    return round(s / 2**k) * 2**k


# --- the shape rule ---------------------------------------------------------------------------------

LLAMA3_DEPTHS = ((4096, 32), (8192, 80), (16384, 126))
"""(hidden size, layers) of Llama 3 8B, 70B and 405B: the depth-vs-width curve every family follows."""


def family_depth(hidden: float) -> float:
    """Layers at ``hidden`` on the Llama 3 curve (piecewise linear in log-log, end segments extended)."""
    pts = [(math.log(h), math.log(n)) for h, n in LLAMA3_DEPTHS]
    x = math.log(hidden)
    (x0, y0), (x1, y1) = pts[0], pts[1]
    if x > pts[1][0]:
        (x0, y0), (x1, y1) = pts[1], pts[2]
    return math.exp(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


LAYER_STEP = 8
MAX_DEPTH_RATIO = 2.0
"""The recipe's depth relative to the Llama 3 curve at its width is kept within this factor either way (a
tiny test model's depth says nothing about a large one's)."""
"""Depths are rounded to a multiple of this, so that power-of-two pipelines divide them."""


def width_step(m: ModelConfig) -> int:
    """Hidden sizes of the ladder are multiples of this: one head's width times the KV groups (heads stay whole
    and divisible by the groups), at least 1024."""
    head = m.kv_channels or m.hidden_size // m.num_attention_heads
    return max(1024, head * (m.num_query_groups or 8))


def scaled_model(m: ModelConfig, hidden: int) -> ModelConfig:
    """``m`` at width ``hidden``: heads, FFN, expert FFNs and the query LoRA rank scale with the width; layers
    follow the Llama 3 depth curve times ``m``'s own depth ratio to it (within ``MAX_DEPTH_RATIO``, rounded
    to a multiple of ``LAYER_STEP``); head size, KV groups, vocabulary, sequence, experts, top-k and the
    leading dense layers are kept."""
    r = hidden / m.hidden_size
    own = min(MAX_DEPTH_RATIO, max(1 / MAX_DEPTH_RATIO, m.num_layers / family_depth(m.hidden_size)))
    depth = own * family_depth(hidden)
    layers = max(LAYER_STEP, round(depth / LAYER_STEP) * LAYER_STEP)
    head = m.kv_channels or m.hidden_size // m.num_attention_heads

    def scale(v: int | None) -> int | None:
        return None if v is None else max(128, round(v * r / 128) * 128)

    changes: dict = {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": hidden // head,
        "ffn_hidden_size": scale(m.ffn_hidden_size or 4 * m.hidden_size),
    }
    if m.num_moe_experts:
        changes["moe_ffn_hidden_size"] = scale(m.moe_ffn_hidden_size)
        changes["moe_shared_expert_intermediate_size"] = scale(m.moe_shared_expert_intermediate_size)
        if not isinstance(m.moe_layer_freq, int):
            dense = next((i for i, x in enumerate(m.moe_layer_freq) if x), 0)
            dense = min(dense, layers - 1)
            changes["moe_layer_freq"] = [0] * dense + [1] * (layers - dense)
    if m.q_lora_rank is not None:
        changes["q_lora_rank"] = scale(m.q_lora_rank)
    return dataclasses.replace(m, **changes)


# --- the budget -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """What the user has."""

    gpus: int | None
    """GPUs of the allocation (``None``: the recipe's own)."""
    days: float | None
    """Wall days of the allocation (``None`` with a FLOPs budget)."""
    flops: float | None
    """Training FLOPs to spend (``None`` with a GPU-days budget)."""


def split_budget_args(overrides: Sequence[str]) -> tuple[Budget, list[str]]:
    """Take ``gpus=``, ``days=``, ``flops=`` out of the overrides; ``ValueError`` (one line) on a bad value."""
    found: dict[str, float] = {}
    rest = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if not eq or key not in BUDGET_KEYS:
            rest.append(o)
            continue
        try:
            v = float(value)
        except ValueError:
            v = float("nan")
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{key}={value}: must be a positive number (e.g. gpus=16384 days=50, or flops=5.76e23)")
        if key == "gpus" and v != int(v):
            raise ValueError(f"gpus={value}: must be a whole number of GPUs (e.g. gpus=16384)")
        domain = BUDGET_DOMAINS[key]
        if not domain.contains(v):
            raise ValueError(f"{key}={value}: {domain.what} must be in {domain.text()}")
        found[key] = v
    has_days = "days" in found
    if "flops" in found and has_days:
        raise ValueError("days= and flops= both given: a budget is GPUs x days, or FLOPs (give one)")
    if "flops" not in found and not (has_days and "gpus" in found):
        raise ValueError("no budget: give gpus=N days=D (e.g. gpus=16384 days=50), or flops=F (e.g. flops=5.76e23)")
    gpus = int(found["gpus"]) if "gpus" in found else None
    return Budget(gpus=gpus, days=found.get("days"), flops=found.get("flops")), rest


def on_gpus(cfg: RunConfig, gpus: int) -> RunConfig:
    """``cfg`` on ``gpus`` GPUs of its cluster's nodes; ``ValueError`` when they are not whole nodes."""
    per = cfg.cluster.gpus_per_node
    if gpus % per:
        raise ValueError(f"gpus={gpus}: not whole nodes of {per} GPUs ({cfg.cluster.gpu}); use a multiple of {per}")
    return dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, nodes=gpus // per))


NOMINAL_MFU = 0.4
"""MFU assumed for the first estimate of a GPU-days budget's compute (sets the ladder and the batch)."""
MAX_CANDIDATES = 8
"""Model sizes evaluated (each costs one planner search, ~0.5 s)."""
RESTART_S = 600.0
"""Seconds a restart after a failure costs (detection, rescheduling, loading the checkpoint)."""
MAX_JOB_TRIES = 4
"""Job sizes tried when one job on all the GPUs has no layout."""


def nominal_compute(cfg: RunConfig, budget: Budget) -> float:
    """The budget's FLOPs: as given, else GPUs x days x dense peak x ``NOMINAL_MFU``."""
    if budget.flops is not None:
        return budget.flops
    peak = hardware_for(cfg.cluster).peak_flops["bf16"]
    return world_size(cfg.cluster) * (budget.days or 0.0) * SECONDS_PER_DAY * peak * NOMINAL_MFU


def is_moe(m: ModelConfig) -> bool:
    """Whether the family is a mixture of experts."""
    return bool(m.num_moe_experts)


def candidate_models(cfg: RunConfig, compute: float, count: int = MAX_CANDIDATES) -> list[ModelConfig]:
    """Up to ``count`` sizes of the recipe's family nearest (in log parameters) to the scaling law's
    compute-optimal size for ``compute`` (active parameters for an MoE), smallest first."""
    m = cfg.model
    step = width_step(m)
    target, _ = DEFAULT_LAW.optimum(compute)
    ladder = []
    for k in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64):
        hidden = k * step // 2 if step >= 2048 else k * step
        if hidden < 1024:
            continue
        model = scaled_model(m, hidden)
        pc = count_parameters(model)
        ladder.append((abs(math.log((pc.active if is_moe(m) else pc.total) / target)), hidden, model))
    ladder = sorted({h: (d, h, mm) for d, h, mm in ladder}.values(), key=lambda x: x[0])[:count]
    return [mm for _, _, mm in sorted(ladder, key=lambda x: x[1])]


@dataclass
class BudgetCandidate:
    """One model size under the budget."""

    params: int
    """Total parameters."""
    active_params: int
    """Parameters a token passes through."""
    num_layers: int
    """Depth."""
    hidden_size: int
    """Width."""
    tokens: float
    """Tokens one job trains on within the budget."""
    global_batch_size: int
    """Sequences per step (DeepSeek LLM's batch law, rounded to ``m * 2^k``)."""
    batch_tokens: float
    """Tokens per step."""
    lr: float
    """DeepSeek LLM's optimal peak LR for the candidate's compute."""
    layout: dict[str, object] | None
    """TP, PP, VP, CP, EP, ETP, MBS, recompute, distributed optimizer of plan's best layout (``None``: none fits)."""
    overrides: list[str]
    """Hydra overrides selecting this candidate's model, batch, GPUs per job and layout."""
    jobs: int
    """Concurrent jobs the allocation is split into (each this candidate, on ``job_gpus`` GPUs)."""
    job_gpus: int
    """GPUs per job."""
    idle_gpus: int
    """GPUs of the allocation no job uses."""
    tokens_per_s: float
    """Predicted tokens per second of one job (plan's best layout)."""
    mfu: float
    """Predicted MFU of that layout."""
    goodput: float
    """Expected fraction of wall time that trains (Young/Daly checkpointing, Llama 3's failure rate)."""
    days: float
    """Predicted wall days to train ``tokens``."""
    flops: float
    """Training FLOPs of one job (the project's FLOPs convention)."""
    loss: float | None
    """Predicted loss (``None`` without a layout)."""
    experts: int = 1
    """Routed experts (1: dense)."""
    note: str = ""
    """Why a job was split, or why no layout fits."""


def flops_per_token(cfg: RunConfig) -> float:
    """Training FLOPs per token of ``cfg``'s model under the project's convention (``CONVENTION``)."""
    one = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, global_batch_size=1))
    return flops_per_iteration(one, CONVENTION) / cfg.model.seq_length


def batch_compute(m: ModelConfig, tokens: float) -> float:
    """DeepSeek LLM's ``C = M D`` with ``M`` from the non-embedding active parameters (``72 n d^2`` for their
    dense models) plus the attention term ``6 n d l_seq``."""
    pc = count_parameters(m)
    return (6.0 * (pc.active - pc.embedding) + 6.0 * m.num_layers * m.hidden_size * m.seq_length) * tokens


SPLIT_GAIN = 1.05
"""A smaller job is chosen only when its model trains at least this much faster than the larger job's."""
MAX_MFU = 0.65
"""No layout is expected above this MFU: a job at more than ``MAX_MFU / (2 SPLIT_GAIN)`` is not halved for speed."""
MIN_GOODPUT = 0.5
"""A job size whose expected goodput is below this is not planned (failures would cost more than they leave)."""


def job_sizes(gpus: int, per_node: int) -> list[int]:
    """GPUs per job to try after one job on all ``gpus``: power-of-two node counts, largest first (the larger a
    job, the more tokens its model sees), skipping sizes whose restarts alone would cost more than
    ``1 - MIN_GOODPUT`` of the time; at most ``MAX_JOB_TRIES``."""
    sizes, n = [], 1
    while n * per_node < gpus:
        sizes.append(n * per_node)
        n *= 2
    fit = [s for s in reversed(sizes) if RESTART_S * DEFAULT_FAILURE_RATE_PER_GPU_S * s < 1.0 - MIN_GOODPUT]
    return fit[:MAX_JOB_TRIES]


def find_job(base: RunConfig, gpus: int, sizes: list[int] | None = None) -> tuple[Ranked, int, float, str] | None:
    """(plan's best layout, GPUs per job, goodput, why a smaller job) for the job size whose model trains the most
    tokens per second (throughput x goodput): one job on all ``gpus``, else down ``job_sizes`` (or ``sizes``),
    walking on while a smaller job is faster per model (its batch no longer forces model parallelism onto
    spare GPUs); sizes without a layout or with goodput below ``MIN_GOODPUT`` are skipped. ``None`` when none
    fits."""
    why, found, rate = "", None, 0.0
    gbs_tokens = base.trainer.global_batch_size * base.model.seq_length
    for size in sizes or [gpus, *job_sizes(gpus, base.cluster.gpus_per_node)]:
        cfg = on_gpus(base, size)
        p = plan(cfg, top=1, max_validations=60)
        if not p.top:
            why = why or (
                f"no layout on {size} GPUs feeds a batch of {base.trainer.global_batch_size} sequences within memory"
            )
            continue
        g = goodput(size, save_time_s(apply(cfg, p.top[0].candidate)), restart_s=RESTART_S)
        gp = 1.0 - g.lost_fraction
        if gp < MIN_GOODPUT:
            why = why or (
                f"one job on {size} GPUs fails every {g.job_mtbf_s / 60:.0f} min on average "
                f"(goodput {max(gp, 0.0):.0%} with {RESTART_S:.0f} s restarts)"
            )
            continue
        r = gbs_tokens / p.top[0].step_time_s * gp
        if found is not None and r <= rate * SPLIT_GAIN:
            break
        if found is not None:
            why = why or (
                f"a batch of {base.trainer.global_batch_size} sequences leaves one job on {found[1]} GPUs to model "
                f"parallelism at {found[0].mfu:.0%} MFU; a job on {size} GPUs trains its model {r / rate:.1f}x faster"
            )
        found, rate = (p.top[0], size, gp, why), r
        if 2 * SPLIT_GAIN * p.top[0].mfu > MAX_MFU:
            break  # half the GPUs would need an MFU no layout reaches to train this model faster
    return found


def starved(best: Ranked, gbs: int, gpus: int) -> str:
    """A note when the batch cannot feed the GPUs' data parallelism: each replica gets fewer micro-batches than
    pipeline stages, so the GPUs beyond what the batch feeds only add model parallelism (and bubbles)."""
    c = best.candidate
    dp = gpus // (c.tp * c.pp * c.cp)
    micro = gbs // (dp * c.mbs)
    if c.pp == 1 or micro >= c.pp:
        return ""
    return (
        f"a batch of {gbs} sequences feeds {dp} data-parallel replicas with {micro} micro-batch(es) each for "
        f"{c.pp} pipeline stages (MFU {best.mfu:.0%}): the GPUs outgrow the batch; smaller jobs are slower per model"
    )


def layout_of(r: Ranked) -> dict[str, object]:
    """The layout fields of a ranked plan entry."""
    c = r.candidate
    return {
        "tp": c.tp,
        "pp": c.pp,
        "vp": c.vp,
        "cp": c.cp,
        "ep": c.ep,
        "etp": c.etp or c.tp,
        "mbs": c.mbs,
        "recompute": c.recompute,
        "distributed_optimizer": c.distributed_optimizer,
    }


def layout_text(layout: dict[str, object] | None) -> str:
    """``TP8 PP4 VP5 CP2 EP1`` (``-`` without a layout)."""
    if layout is None:
        return "-"
    vp = f" VP{layout['vp']}" if layout["vp"] else ""
    ep = f" EP{layout['ep']}" if layout["ep"] != 1 else ""
    return f"TP{layout['tp']} PP{layout['pp']}{vp} CP{layout['cp']}{ep} mbs{layout['mbs']}"


def evaluate(
    cfg: RunConfig, model: ModelConfig, budget: Budget, compute: float, tokens: float | None = None
) -> BudgetCandidate:
    """``model`` under the budget: batch from DeepSeek's law at ``compute``, layout from ``plan`` (one job on all
    the GPUs, else the allocation split into concurrent jobs), tokens (or, given ``tokens``, days) from the
    predicted throughput and goodput, and the predicted loss."""
    base = dataclasses.replace(cfg, model=model)
    gpus = world_size(base.cluster)
    pc = count_parameters(model)
    fpt = flops_per_token(base)
    d0 = tokens if tokens is not None else compute / fpt
    gbs = round_batch(batch_tokens(batch_compute(model, d0)) / model.seq_length)
    base = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, global_batch_size=gbs))
    found = find_job(base, gpus)
    if found is None:
        return _no_layout(model, gbs, gpus, d0, fpt)
    best, job_gpus, gp, why = found
    jobs = gpus // job_gpus
    if jobs > 1:  # each job trains its own model on its share of the compute: the batch law at that share
        smaller = round_batch(batch_tokens(batch_compute(model, d0 / jobs)) / model.seq_length)
        again = dataclasses.replace(base, trainer=dataclasses.replace(base.trainer, global_batch_size=smaller))
        refit = find_job(again, gpus, [job_gpus]) if smaller != gbs else None
        if refit is not None:
            best, _, gp, _ = refit
            base, gbs = again, smaller
            why += f"; each job's batch re-derived for its share of the compute: {gbs} sequences"
    note = f"split into {jobs} concurrent jobs of {job_gpus} GPUs: {why}" if jobs > 1 else starved(best, gbs, job_gpus)
    tput = gbs * model.seq_length / best.step_time_s
    if tokens is None:
        if budget.flops is not None:
            tokens = budget.flops / jobs / fpt  # each concurrent job spends its share
        else:
            tokens = (budget.days or 0.0) * SECONDS_PER_DAY * tput * gp
    days = tokens / (tput * gp) / SECONDS_PER_DAY
    loss = (
        JOINT_MOE.loss(pc.active, tokens, model.num_moe_experts or 1)
        if is_moe(model)
        else DEFAULT_LAW.loss(pc.total, tokens)
    )
    return BudgetCandidate(
        params=pc.total,
        active_params=pc.active,
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        tokens=tokens,
        global_batch_size=gbs,
        batch_tokens=gbs * model.seq_length,
        lr=learning_rate(batch_compute(model, tokens)),
        layout=layout_of(best),
        overrides=[
            *model_overrides(model),
            f"trainer.global_batch_size={gbs}",
            f"cluster.nodes={job_gpus // cfg.cluster.gpus_per_node}",
            *best.candidate.overrides(config_values(cfg)),
        ],
        jobs=jobs,
        job_gpus=job_gpus,
        idle_gpus=gpus - jobs * job_gpus,
        tokens_per_s=tput,
        mfu=best.mfu,
        goodput=gp,
        days=days,
        flops=tokens * fpt,
        loss=loss,
        experts=model.num_moe_experts or 1,
        note=note,
    )


def _no_layout(model: ModelConfig, gbs: int, gpus: int, tokens: float, fpt: float) -> BudgetCandidate:
    pc = count_parameters(model)
    return BudgetCandidate(
        params=pc.total,
        active_params=pc.active,
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        tokens=0.0,
        global_batch_size=gbs,
        batch_tokens=gbs * model.seq_length,
        lr=learning_rate(batch_compute(model, tokens)),
        layout=None,
        overrides=model_overrides(model),
        jobs=0,
        job_gpus=0,
        idle_gpus=gpus,
        tokens_per_s=0.0,
        mfu=0.0,
        goodput=0.0,
        days=0.0,
        flops=0.0,
        loss=None,
        note="no layout the validator accepts on these GPUs (nor on the job sizes tried)",
    )


MODEL_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "ffn_hidden_size",
    "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size",
    "q_lora_rank",
)


def model_overrides(m: ModelConfig) -> list[str]:
    """Hydra overrides that give a recipe this candidate's shape (``moe_layer_freq`` as a list when it is one)."""
    out = [f"model.{f}={getattr(m, f)}" for f in MODEL_FIELDS if getattr(m, f) is not None]
    if m.num_moe_experts and not isinstance(m.moe_layer_freq, int):
        out.append("model.moe_layer_freq=[" + ",".join(str(int(x)) for x in m.moe_layer_freq) + "]")
    return out


@dataclass
class BudgetPlan:
    """``kilocard budget``'s answer."""

    budget: Budget
    """What was asked."""
    gpus: int
    """GPUs of the allocation."""
    gpu: str
    """GPU model."""
    compute: float
    """Budget FLOPs that set the ladder and the batch (given, or GPUs x days x peak x ``NOMINAL_MFU``)."""
    optimum: tuple[float, float]
    """(params, tokens) of the scaling law's compute optimum for ``compute``."""
    law: str
    """The law the losses come from."""
    candidates: list[BudgetCandidate]
    """Smallest first."""
    pick: int | None
    """Index of the pick in ``candidates`` (``None``: no candidate has a layout)."""
    why: str
    """Why the pick."""


FLOPS_BUDGET_DAYS = 60.0
"""Without ``gpus=``, a FLOPs budget is planned on the GPUs that spend it in about this many days."""


def default_gpus(cfg: RunConfig, flops: float) -> int:
    """GPUs spending ``flops`` in ``FLOPS_BUDGET_DAYS`` at ``NOMINAL_MFU``, rounded up to a power-of-two node count."""
    peak = hardware_for(cfg.cluster).peak_flops["bf16"]
    per = cfg.cluster.gpus_per_node
    nodes = flops / (FLOPS_BUDGET_DAYS * SECONDS_PER_DAY * peak * NOMINAL_MFU) / per
    return per * 2 ** max(0, math.ceil(math.log2(max(1.0, nodes))))


def budget_plan(cfg: RunConfig, budget: Budget, count: int = MAX_CANDIDATES) -> BudgetPlan:
    """Evaluate up to ``count`` sizes of ``cfg``'s family under ``budget``; pick the lowest predicted loss."""
    if budget.gpus is not None:
        cfg = on_gpus(cfg, budget.gpus)
    elif budget.flops is not None:
        cfg = on_gpus(cfg, default_gpus(cfg, budget.flops))
    compute = nominal_compute(cfg, budget)
    flops = BUDGET_DOMAINS["flops"]
    if budget.flops is None and not flops.contains(compute):
        raise ValueError(
            f"gpus={budget.gpus} days={budget.days:g} give {compute:.3g} FLOPs at MFU {NOMINAL_MFU}: {flops.what} "
            f"must be in {flops.text()}"
        )
    cands: list[BudgetCandidate] = []
    for m in candidate_models(cfg, compute, count):
        cands.append(evaluate(cfg, m, budget, compute))
        if cands[-1].loss is None and any(c.loss is not None for c in cands):
            break  # larger sizes need more memory still: none of them fits either
    scored = [(c.loss, i) for i, c in enumerate(cands) if c.loss is not None]
    pick = min(scored)[1] if scored else None
    moe = is_moe(cfg.model)
    law = "Ludziejewski et al. 2025, joint MoE law (compare among MoE sizes only)" if moe else DEFAULT_LAW.name
    why = "no candidate has a layout the validator accepts"
    if pick is not None:
        why = f"the lowest predicted loss of the {len(scored)} sizes that fit the budget"
    return BudgetPlan(
        budget=budget,
        gpus=world_size(cfg.cluster),
        gpu=cfg.cluster.gpu,
        compute=compute,
        optimum=DEFAULT_LAW.optimum(compute),
        law=law,
        candidates=cands,
        pick=pick,
        why=why,
    )


# --- output -----------------------------------------------------------------------------------------


def _si(x: float) -> str:
    """1.23e12 -> '1.23T'."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def budget_line(p: BudgetPlan) -> str:
    """What was planned for, in one line."""
    b = p.budget
    if b.flops is not None:
        given = f"{b.flops:.3g} FLOPs on {p.gpus} x {p.gpu}" + (
            "" if b.gpus else f" (about {FLOPS_BUDGET_DAYS:.0f} days' worth)"
        )
    else:
        given = f"{p.gpus} x {p.gpu} for {b.days:g} days (~{p.compute:.3g} FLOPs at {NOMINAL_MFU:.0%} MFU)"
    n, d = p.optimum
    h, _ = HOFFMANN.optimum(p.compute)
    return (
        f"budget: {given}; compute optimum of {DEFAULT_LAW.name}: {_si(n)} params on {_si(d)} tokens "
        f"(Hoffmann's approach-3 constants: {_si(h)} params)"
    )


HEADER = (
    "",
    "params",
    "active",
    "layers",
    "hidden",
    "tokens",
    "GBS",
    "tok/step",
    "LR",
    "layout",
    "jobs",
    "MFU",
    "goodput",
    "days",
    "loss",
)


def _row(mark: str, c: BudgetCandidate) -> tuple[str, ...]:
    jobs = f"{c.jobs}x{c.job_gpus}" if c.jobs else "-"
    return (
        mark,
        _si(c.params),
        _si(c.active_params),
        str(c.num_layers),
        str(c.hidden_size),
        _si(c.tokens) if c.loss is not None else "-",
        str(c.global_batch_size),
        _si(c.batch_tokens),
        f"{c.lr:.2g}",
        layout_text(c.layout),
        jobs,
        f"{c.mfu:.0%}" if c.loss is not None else "-",
        f"{c.goodput:.1%}" if c.loss is not None else "-",
        f"{c.days:.1f}" if c.loss is not None else "-",
        f"{c.loss:.4f}" if c.loss is not None else "-",
    )


def render_text(p: BudgetPlan) -> str:
    """The candidates table, the pick marked ``*`` and why, its overrides, and each candidate's notes."""
    rows = [HEADER] + [_row("*" if i == p.pick else "", c) for i, c in enumerate(p.candidates)]
    widths = [max(len(r[j]) for r in rows) for j in range(len(HEADER))]
    out = [budget_line(p)]
    out += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    for c in p.candidates:
        if c.note:
            out.append(f"{_si(c.params)}: {c.note}")
    if p.pick is None:
        out.append(f"no pick: {p.why}")
        return "\n".join(out)
    c = p.candidates[p.pick]
    out.append(f"pick *: {_si(c.params)} params on {_si(c.tokens)} tokens, {p.why}; loss from {p.law}")
    if c.jobs > 1:
        out.append(
            f"  run {c.jobs} concurrent jobs of {c.job_gpus} GPUs (e.g. seeds or ablations); {c.idle_gpus} GPUs idle"
        )
    out.append("  overrides: " + " ".join(c.overrides))
    out.append("laws, sources and limits: docs/budget.md (fitted on other data and models: a guide, not a promise)")
    return "\n".join(out)


def to_json(p: BudgetPlan) -> dict:
    """``--format json``: the budget, ``pick`` (index into ``candidates``) and ``candidates``."""
    return {
        "budget": dataclasses.asdict(p.budget),
        "gpus": p.gpus,
        "gpu": p.gpu,
        "compute": p.compute,
        "optimum": {"params": p.optimum[0], "tokens": p.optimum[1], "law": DEFAULT_LAW.name},
        "law": p.law,
        "pick": p.pick,
        "why": p.why,
        "candidates": [dataclasses.asdict(c) for c in p.candidates],
    }


def plot_frontier(p: BudgetPlan, png: str) -> None:
    """Predicted loss against training FLOPs for each candidate size, the frontier they make, the budget's
    line and the pick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    fitted = [c for c in p.candidates if c.loss is not None and c.flops > 0]
    pick = p.candidates[p.pick] if p.pick is not None else None
    lo = min([p.compute, *(c.flops for c in fitted)]) / 30
    hi = max([p.compute, *(c.flops for c in fitted)]) * 30
    xs = [lo * (hi / lo) ** (i / 99) for i in range(100)]
    curves = [[_loss_of(c, x / (c.flops / c.tokens)) for x in xs] for c in fitted]
    if curves:
        frontier = [min(col) for col in zip(*curves, strict=True)]
        ax.plot(xs, frontier, color="0.75", lw=5, label="frontier (best size per compute)")
    for c, ys in zip(fitted, curves, strict=True):
        ax.plot(xs, ys, lw=1.2, label=f"{_si(c.params)} params ({_si(c.active_params)} active)")
    nominal = "" if p.budget.flops is not None else f" (GPU-days at {NOMINAL_MFU:.0%} MFU)"
    ax.axvline(p.compute, color="0.3", ls="-.", lw=1.2, label=f"budget {p.compute:.3g} FLOPs{nominal}")
    if pick is not None and pick.jobs > 1:
        share = f"one job's share: 1/{pick.jobs} of the budget ({pick.job_gpus} GPUs)"
        ax.axvline(p.compute / pick.jobs, color="0.5", ls=":", lw=1.2, label=share)
    if pick is not None and pick.loss is not None:
        label = f"pick: {_si(pick.params)} on {_si(pick.tokens)} tokens"
        ax.plot([pick.flops], [pick.loss], "r*", ms=14, label=label, zorder=5)
    ax.set_xscale("log")
    ax.set_xlabel(f"training FLOPs per model ({CONVENTION})")
    ax.set_ylabel("predicted loss (the law's units)")
    if fitted:
        ax.set_ylim(min(min(ys) for ys in curves) - 0.02, max(c.loss for c in fitted if c.loss is not None) + 0.25)
    ax.set_title(f"{p.gpus} x {p.gpu}: predicted loss vs compute\n{p.law}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _loss_of(c: BudgetCandidate, tokens: float) -> float:
    """Predicted loss of ``c``'s size on ``tokens`` (the law ``c.loss`` came from)."""
    if c.experts > 1:
        return JOINT_MOE.loss(c.active_params, tokens, c.experts)
    return DEFAULT_LAW.loss(c.params, tokens)
