"""Rules on parallel sizes: world divisibility, heads, layers per stage, SP, experts (Megatron-Core's)."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.domains import choices
from kilocard.config.schema import RunConfig
from kilocard.layout import MAX_LAYOUT_LETTERS, Layout, parse_pipeline_layout
from kilocard.validate.issues import Issue, error, warning

P = "parallel."
SIZE_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
)


def _world(lay: Layout) -> str:
    return f"world size {lay.nodes} nodes * {lay.gpus_per_node} GPUs = {lay.world_size}"


def rule_sizes_positive(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Every parallel size is a whole number >= 1."""
    p = cfg.parallel
    for name in SIZE_FIELDS + ("expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size"):
        v = getattr(p, name)
        if v is not None and v < 1:
            yield error(
                "PARALLEL_SIZE", P + name, v, f"{name} = {v} must be >= 1", f"set {P}{name}=1 (or null where allowed)"
            )


def rule_world_divisible(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """tp * pp * cp divides the world size (Megatron-Core ``initialize_model_parallel``); the fix of a local
    run (``launcher.kind=local``, one node) is more local ranks, ``kilocard run --nproc N``, not more nodes."""
    if lay.dp is None:
        mp = lay.model_parallel_size
        yield error(
            "WORLD_NOT_DIVISIBLE",
            P + "tensor_model_parallel_size",
            lay.tp,
            f"tp({lay.tp}) * pp({lay.pp}) * cp({lay.cp}) = {mp} does not divide {_world(lay)}",
            _world_fix(cfg, lay, mp),
        )


def _world_fix(cfg: RunConfig, lay: Layout, mp: int) -> str:
    if cfg.launcher.kind == "local" and lay.nodes == 1:
        n = mp * -(-lay.gpus_per_node // mp)  # the next multiple of tp*pp*cp
        return (
            f"kilocard run --nproc {n} (in other verbs: cluster.gpus_per_node={n} launcher.nproc={n}), "
            f"or pick tp*pp*cp dividing {lay.world_size}"
        )
    nodes = mp // _gcd(mp, lay.gpus_per_node)
    return f"pick tp*pp*cp dividing {lay.world_size}, or set cluster.nodes to a multiple of {nodes}"


def rule_expert_world_divisible(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """etp * ep * pp divides the world size (Megatron-Core's expert rank generator). A dense model whose
    tp * pp * cp already does not divide it gets no expert hint: ``WORLD_NOT_DIVISIBLE`` says it, and with
    no experts there is no expert size to pick."""
    if lay.expert_dp is None and not (not cfg.model.num_moe_experts and lay.dp is None):
        n = lay.etp * lay.ep * lay.pp
        yield error(
            "EXPERT_WORLD_NOT_DIVISIBLE",
            P + "expert_model_parallel_size",
            lay.ep,
            f"etp({lay.etp}) * ep({lay.ep}) * pp({lay.pp}) = {n} does not divide {_world(lay)}",
            f"pick expert_model_parallel_size so that etp*ep*pp divides {lay.world_size}",
        )


def rule_tp_pp_dp_mapping(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """With ``use_tp_pp_dp_mapping`` (order ``tp-cp-ep-pp-dp``) and PP > 1, the expert layers' data-parallel
    size equals the attention layers' (Megatron-Core 0.16.1 ``initialize_model_parallel`` asserts it for
    any order not ending in ``pp``)."""
    if not cfg.parallel.use_tp_pp_dp_mapping or lay.pp == 1 or lay.dp is None or lay.expert_dp in (None, lay.dp):
        return
    yield error(
        "TP_PP_DP_EXPERT_DP",
        P + "use_tp_pp_dp_mapping",
        True,
        f"with PP {lay.pp} the order tp-cp-ep-pp-dp needs the expert data-parallel size "
        f"(world / (etp {lay.etp} * ep {lay.ep} * pp {lay.pp}) = {lay.expert_dp}) to equal DP ({lay.dp})",
        f"set {P}use_tp_pp_dp_mapping=false, or etp * ep = tp * cp ({lay.tp * lay.cp})",
    )


def rule_heads_tp(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Attention heads are a multiple of TP; query groups a multiple or divisor of TP."""
    m = cfg.model
    if m.num_attention_heads < 1:
        return  # MODEL_SHAPE reports it
    if m.num_attention_heads % lay.tp:
        yield error(
            "TP_HEADS",
            P + "tensor_model_parallel_size",
            lay.tp,
            f"num_attention_heads({m.num_attention_heads}) is not a multiple of tp({lay.tp})",
            f"use a TP size that divides {m.num_attention_heads}: {_divisors(m.num_attention_heads, lay.tp)}",
        )
    g = m.num_query_groups
    if g is not None and g >= 1 and g % lay.tp and lay.tp % g:
        yield error(
            "TP_QUERY_GROUPS",
            P + "tensor_model_parallel_size",
            lay.tp,
            f"num_query_groups({g}) is neither a multiple nor a divisor of tp({lay.tp})",
            f"use a TP size that divides {g} or is a multiple of it",
        )
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        yield error(
            "HIDDEN_HEADS",
            "model.num_attention_heads",
            m.num_attention_heads,
            f"hidden_size({m.hidden_size}) is not a multiple of num_attention_heads({m.num_attention_heads})",
            "set model.kv_channels explicitly or pick heads dividing hidden_size",
        )


def rule_sequence_parallel(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """SP needs TP > 1; MoE with TP > 1 needs SP (Megatron-Core's MoELayer refuses to train)."""
    p = cfg.parallel
    if p.sequence_parallel and lay.tp == 1:
        yield error(
            "SP_WITHOUT_TP",
            P + "sequence_parallel",
            True,
            "sequence_parallel needs tensor parallelism, but tp(1)",
            f"set {P}sequence_parallel=false or {P}tensor_model_parallel_size=2+",
        )
    if cfg.model.num_moe_experts and lay.tp > 1 and not p.sequence_parallel:
        yield error(
            "MOE_TP_WITHOUT_SP",
            P + "sequence_parallel",
            False,
            f"an MoE model with tp({lay.tp}) > 1 must use sequence parallelism",
            f"set {P}sequence_parallel=true",
        )


def rule_experts_ep(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """EP needs experts, and the experts divide evenly over EP ranks."""
    e = cfg.model.num_moe_experts
    if e is not None and e <= 0:
        yield error(
            "EXPERTS_NOT_POSITIVE",
            "model.num_moe_experts",
            e,
            f"num_moe_experts({e}) must be > 0",
            "set model.num_moe_experts=null for a dense model",
        )
        return
    if lay.ep > 1 and e is None:
        yield error(
            "EP_WITHOUT_EXPERTS",
            P + "expert_model_parallel_size",
            lay.ep,
            f"ep({lay.ep}) > 1 but the model has no experts (model.num_moe_experts is null)",
            f"set {P}expert_model_parallel_size=1",
        )
    elif e and e % lay.ep:
        yield error(
            "EXPERTS_EP",
            P + "expert_model_parallel_size",
            lay.ep,
            f"num_moe_experts({e}) is not a multiple of ep({lay.ep})",
            f"use an EP size that divides {e}: {_divisors(e, lay.ep)}",
        )


def rule_virtual_pipeline(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Interleaving needs PP > 1 (Megatron-Core) and PP > 2 without p2p overlap (Megatron-LM)."""
    vp = cfg.parallel.virtual_pipeline_model_parallel_size
    if vp is None or vp < 1:
        return
    if lay.pp == 1:
        yield error(
            "VP_WITHOUT_PP",
            P + "virtual_pipeline_model_parallel_size",
            vp,
            f"virtual_pipeline_model_parallel_size({vp}) needs pp > 1, but pp(1)",
            f"set {P}virtual_pipeline_model_parallel_size=null or pipeline_model_parallel_size=2+",
        )
    elif lay.pp == 2 and not cfg.parallel.overlap_p2p_comm:
        yield error(
            "VP_PP2_NO_OVERLAP",
            P + "overlap_p2p_comm",
            False,
            "interleaved schedule with pp(2) and overlap_p2p_comm off sends two p2p ops "
            "between the same two ranks per batch (Megatron-LM requires pp > 2 here)",
            f"set {P}overlap_p2p_comm=true, or pp=3+",
        )


def rule_layers_per_stage(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Layers split over PP stages (even, uneven first/last, embedding/loss accounting) and VP chunks."""
    p, L = cfg.parallel, cfg.model.num_layers
    first, last = p.num_layers_in_first_pipeline_stage, p.num_layers_in_last_pipeline_stage
    vp = p.virtual_pipeline_model_parallel_size
    vp = vp if vp and vp > 0 and lay.pp > 1 else None
    if p.pipeline_model_parallel_layout is not None:
        yield from _layout(cfg, lay)
        return
    if first is not None or last is not None:
        yield from _uneven(cfg, lay, first, last, vp)
        return
    extra = p.account_for_embedding_in_pipeline_split + p.account_for_loss_in_pipeline_split
    total = L + extra
    what = f"num_layers({L})" + (f" + {extra} (embedding/loss counted as layers)" if extra else "")
    if total % lay.pp:
        yield error(
            "LAYERS_PP",
            P + "pipeline_model_parallel_size",
            lay.pp,
            f"{what} = {total} is not divisible by pp({lay.pp})",
            f"use pp dividing {total}: {_divisors(total, lay.pp)}; or set "
            f"{P}num_layers_in_first_pipeline_stage / num_layers_in_last_pipeline_stage",
        )
        return
    per = total // lay.pp
    if vp and per % vp:
        yield error(
            "LAYERS_VP",
            P + "virtual_pipeline_model_parallel_size",
            vp,
            f"{what} / pp({lay.pp}) = {per} layers per stage is not divisible by vp({vp})",
            f"use vp dividing {per}: {_divisors(per, vp)}",
        )
    if extra and lay.stage_layers and min(lay.stage_layers) < 0:
        yield error(
            "LAYERS_ACCOUNTING",
            P + "account_for_embedding_in_pipeline_split",
            True,
            "not enough layers on the first/last stage to count the embedding/loss as a layer",
            "use fewer pipeline stages",
        )


def _layout(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``pipeline_model_parallel_layout``: Megatron-Core's checks (``TransformerConfig.__post_init__`` and
    ``PipelineParallelLayerLayout.validate_layer_layout``, megatron-core 0.16.1), each as one issue."""
    p, m = cfg.parallel, cfg.model
    text = p.pipeline_model_parallel_layout or ""
    field, fix = (
        P + "pipeline_model_parallel_layout",
        "write one letter per layer (E embedding, t layer, m MTP, L loss), | between virtual stages, "
        "e.g. Et*4|(t*4|)*14tL for 61 layers over 16 stages",
    )
    others = [
        name
        for name in (
            "num_layers_in_first_pipeline_stage",
            "num_layers_in_last_pipeline_stage",
            "account_for_embedding_in_pipeline_split",
            "account_for_loss_in_pipeline_split",
        )
        if getattr(p, name) not in (None, False)
    ]
    if others:
        yield error(
            "PIPELINE_LAYOUT_CONFLICT",
            field,
            text,
            f"pipeline_model_parallel_layout cannot be combined with {', '.join(others)}",
            f"use the layout alone: unset {', '.join(P + o for o in others)}",
        )
        return
    problem = layout_problem(text, lay.pp, p.virtual_pipeline_model_parallel_size, m.num_layers, m.mtp_num_layers)
    if problem:
        yield error("PIPELINE_LAYOUT", field, text, problem, fix)


def layout_problem(text: str, pp: int, vp: int | None, num_layers: int, mtp: int | None) -> str | None:
    """What Megatron-Core refuses in a layout string, in one line; ``None`` when it accepts it."""
    stages = parse_pipeline_layout(text)
    if stages is None:
        shown = text if len(text) <= 60 else text[:57] + "..."
        return (
            f"layout {shown!r} does not parse: only E (embedding), t (layer), m (MTP), L (loss), | ( ) * and "
            f"digits, at most {MAX_LAYOUT_LETTERS} letters once expanded"
        )
    if len(stages) % pp:
        return f"layout has {len(stages)} virtual stages, not a multiple of pp({pp})"
    chunks = len(stages) // pp
    if vp is not None and vp != chunks:
        return f"layout has {chunks} virtual stages per pipeline rank but virtual_pipeline_model_parallel_size is {vp}"
    flat = "".join(stages)
    if not flat or flat[0] != "E" or flat[-1] != "L" or flat.count("E") != 1 or flat.count("L") != 1:
        return "layout must start with the embedding (E) and end with the loss (L), each exactly once"
    if flat.count("t") != num_layers:
        return f"layout places {flat.count('t')} transformer layers (t) but num_layers is {num_layers}"
    if flat.count("m") != (mtp or 0):
        return f"layout places {flat.count('m')} MTP layers (m) but mtp_num_layers is {mtp}"
    return _mtp_problem(stages, pp, chunks, flat)


def _mtp_problem(stages: list[str], pp: int, chunks: int, flat: str) -> str | None:
    """Megatron-Core's MTP placement: after every transformer layer, all in one last virtual stage of a rank."""
    if "m" not in flat:
        return None
    if "t" in flat[flat.index("m") :]:
        return "transformer layers (t) must come before the MTP layers (m)"
    holders = [k for k, st in enumerate(stages) if "m" in st]
    if len(holders) > 1 or holders[0] < (chunks - 1) * pp:
        return "the MTP layers (m) must all sit in one last virtual stage of a pipeline rank"
    return None


def _uneven(cfg: RunConfig, lay: Layout, first: int | None, last: int | None, vp: int | None) -> Iterable[Issue]:
    p, L = cfg.parallel, cfg.model.num_layers
    if p.account_for_embedding_in_pipeline_split or p.account_for_loss_in_pipeline_split:
        yield error(
            "UNEVEN_PP_WITH_ACCOUNTING",
            P + "num_layers_in_first_pipeline_stage",
            first,
            "num_layers_in_first/last_pipeline_stage cannot be combined with "
            "account_for_embedding/loss_in_pipeline_split",
            "use one of the two ways of balancing the pipeline",
        )
        return
    for name, v in (("num_layers_in_first_pipeline_stage", first), ("num_layers_in_last_pipeline_stage", last)):
        if v is None:
            continue
        if v <= 0:
            yield error("UNEVEN_PP_STAGE", P + name, v, f"{name}({v}) must be > 0", f"set {P}{name} to 1 or more")
            return
        if vp and v % vp:
            yield error(
                "UNEVEN_PP_VP",
                P + name,
                v,
                f"{name}({v}) is not divisible by vp({vp})",
                f"make {P}{name} a multiple of {vp}",
            )
    rest = L - (first or 0) - (last or 0)
    stages = lay.pp - (first is not None) - (last is not None)
    if stages < 0 or (stages == 0) != (rest == 0) or rest < 0:
        yield error(
            "UNEVEN_PP_MISMATCH",
            P + "num_layers_in_first_pipeline_stage",
            first,
            f"num_layers({L}) - first({first}) - last({last}) = {rest} middle layers, "
            f"but pp({lay.pp}) leaves {stages} middle stages",
            "make the middle layers and middle stages both zero or both positive",
        )
    elif stages and rest % stages:
        yield error(
            "UNEVEN_PP_MIDDLE",
            P + "pipeline_model_parallel_size",
            lay.pp,
            f"{rest} middle layers do not divide over {stages} middle stages",
            "adjust num_layers_in_first/last_pipeline_stage so the rest divides evenly",
        )
    elif stages and vp and (rest // stages) % vp:
        yield error(
            "UNEVEN_PP_VP",
            P + "virtual_pipeline_model_parallel_size",
            vp,
            f"{rest // stages} layers per middle stage is not divisible by vp({vp})",
            f"use vp dividing {rest // stages}",
        )


SHARDING_STRATEGIES = choices("parallel.data_parallel_sharding_strategy")
"""Megatron-Core's ``DistributedDataParallelConfig.data_parallel_sharding_strategy`` values."""


def rule_megatron_fsdp(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """A known sharding strategy, only with Megatron-FSDP (Megatron-Core reads it nowhere else); kilocard's
    trainer does not build Megatron-FSDP yet (a warning: the estimates count it, a launch refuses)."""
    p = cfg.parallel
    strategy = p.data_parallel_sharding_strategy
    if strategy not in SHARDING_STRATEGIES:
        yield error(
            "FSDP_SHARDING_STRATEGY",
            P + "data_parallel_sharding_strategy",
            strategy,
            f"data_parallel_sharding_strategy {strategy!r} is not one of {', '.join(SHARDING_STRATEGIES)}",
            f"set {P}data_parallel_sharding_strategy=optim_grads_params (or another of those)",
        )
    elif strategy != "no_shard" and not p.use_megatron_fsdp:
        yield error(
            "FSDP_STRATEGY_WITHOUT_FSDP",
            P + "data_parallel_sharding_strategy",
            strategy,
            f"data_parallel_sharding_strategy {strategy!r} takes effect only with use_megatron_fsdp",
            f"set {P}use_megatron_fsdp=true, or {P}data_parallel_sharding_strategy=no_shard",
        )
    if p.use_megatron_fsdp:
        yield warning(
            "MEGATRON_FSDP_NOT_BUILT",
            P + "use_megatron_fsdp",
            True,
            "kilocard's trainer wraps the model in Megatron-Core's DistributedDataParallel, not Megatron-FSDP: "
            "the memory estimate and the prediction count the sharding, a launch refuses it",
            f"for a launch, set {P}use_megatron_fsdp=false and {P}use_distributed_optimizer=true",
        )


def rule_cpu_offloading(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Megatron-Core's activation offloading checks (``TransformerConfig.__post_init__``, 0.16.1): offloaded
    layers fewer than ``num_layers``, no pipeline parallelism, no recompute."""
    p, L = cfg.parallel, cfg.model.num_layers
    if not p.cpu_offloading:
        return
    k = p.cpu_offloading_num_layers
    field = P + "cpu_offloading"
    if k < 0 or k >= L:
        yield error(
            "CPU_OFFLOAD_LAYERS",
            P + "cpu_offloading_num_layers",
            k,
            f"cpu_offloading_num_layers({k}) must be at least 0 and less than num_layers({L})",
            f"set {P}cpu_offloading_num_layers between 0 and {L - 1}",
        )
    if lay.pp > 1:
        yield error(
            "CPU_OFFLOAD_PP",
            field,
            True,
            f"activation offloading does not run with pipeline parallelism, but pp({lay.pp})",
            f"set {field}=false or {P}pipeline_model_parallel_size=1",
        )
    if p.recompute_granularity is not None:
        yield error(
            "CPU_OFFLOAD_RECOMPUTE",
            field,
            True,
            f"activation offloading does not run with recompute ({p.recompute_granularity})",
            f"set {field}=false or {P}recompute_granularity=null",
        )


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a or 1


def _divisors(n: int, near: int, k: int = 4) -> str:
    """Up to ``k`` divisors of ``n`` closest to ``near`` (for hints); cheap for huge ``n``."""
    if n <= 0:
        return "none"
    ds: set[int] = set()
    i = 1
    while i * i <= n and i <= 1_000_000:
        if n % i == 0:
            ds.update((i, n // i))
        i += 1
    best = sorted(ds, key=lambda d: (abs(d - near), d))[:k]
    return ", ".join(str(d) for d in sorted(best))


def rule_moe_bias_etp(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``MOE_BIAS_ETP``: expert biases (``model.add_bias_linear`` with experts) need expert TP 1 (Megatron-Core
    asserts "Bias in Moe is only supported when ETP==1")."""
    m = cfg.model
    if m.num_moe_experts and m.add_bias_linear and lay.etp > 1:
        yield error(
            "MOE_BIAS_ETP",
            P + "expert_tensor_parallel_size",
            lay.etp,
            f"expert_tensor_parallel_size({lay.etp}) > 1 with model.add_bias_linear=true: Megatron-Core supports "
            "expert biases only with expert TP 1",
            f"set {P}expert_tensor_parallel_size=1 or model.add_bias_linear=false",
        )


RULES = (
    rule_sizes_positive,
    rule_world_divisible,
    rule_expert_world_divisible,
    rule_tp_pp_dp_mapping,
    rule_heads_tp,
    rule_sequence_parallel,
    rule_experts_ep,
    rule_moe_bias_etp,
    rule_virtual_pipeline,
    rule_layers_per_stage,
    rule_megatron_fsdp,
    rule_cpu_offloading,
)
