"""Rules on the cluster: world size, GPU model, which groups stay inside a node / NVLink domain."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.perf.params import moe_count, moe_layer_pattern
from kilocard.topology import GPU_TABLE, ep_peers_on_node, gpu_spec
from kilocard.validate.issues import Issue, error, warning

C = "cluster."


def rule_cluster_shape(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The NVLink domain tiles nodes; the GPU is known (the sizes' ranges: ``kilocard.config.domains``)."""
    c = cfg.cluster
    d, g = c.nvlink_domain_size, c.gpus_per_node
    if d >= 1 and g >= 1 and g % d and d % g:
        yield warning(
            "NVLINK_DOMAIN_SHAPE",
            C + "nvlink_domain_size",
            d,
            f"nvlink_domain_size({d}) neither divides nor is a multiple of gpus_per_node({g})",
            f"set {C}nvlink_domain_size to the GPUs sharing one NVSwitch domain",
        )
    if gpu_spec(c.gpu) is None:
        yield error(
            "UNKNOWN_GPU",
            C + "gpu",
            c.gpu,
            f"GPU {c.gpu!r} is not in kilocard's GPU table",
            f"use one of: {', '.join(GPU_TABLE)}",
        )


def rule_tp_nvlink(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """TP (and TP*CP with cp_within_nvlink) stays inside one NVLink domain."""
    gpu = gpu_spec(cfg.cluster.gpu)
    if gpu is None or gpu.vendor == "cpu" or "tp" not in lay.groups:
        return
    p = cfg.parallel
    tp = lay.groups["tp"]
    if p.tp_within_node and not tp.within_nvlink:
        yield error(
            "TP_CROSSES_NVLINK",
            "parallel.tensor_model_parallel_size",
            lay.tp,
            f"tp({lay.tp}) groups span more than one NVLink domain of {lay.nvlink_domain_size} GPUs "
            f"(gpus_per_node {lay.gpus_per_node}): every TP all-reduce would cross the network",
            f"use tp dividing {lay.nvlink_domain_size}, or set parallel.tp_within_node=false",
        )
    tpcp = lay.groups["tp_cp"]
    if p.cp_within_nvlink and lay.cp > 1 and not tpcp.within_nvlink:
        yield error(
            "TP_CP_CROSSES_NVLINK",
            "parallel.context_parallel_size",
            lay.cp,
            f"tp({lay.tp}) * cp({lay.cp}) = {lay.tp * lay.cp} spans more than one NVLink domain "
            f"of {lay.nvlink_domain_size} GPUs",
            "lower cp or tp, or set parallel.cp_within_nvlink=false",
        )
    g = lay.gpus_per_node
    if lay.tp > 1 and g % lay.tp and lay.tp % g:
        yield warning(
            "GPUS_PER_NODE_TP",
            "parallel.tensor_model_parallel_size",
            lay.tp,
            f"gpus_per_node({g}) is not divisible by tp({lay.tp}): some TP groups straddle nodes",
            f"use tp dividing {g}",
        )


def rule_stage_split(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """A replica's pipeline stage (its TP*CP ranks) split across nodes is slow (warning)."""
    gpu = gpu_spec(cfg.cluster.gpu)
    if gpu is None or gpu.vendor == "cpu" or "tp_cp" not in lay.groups or lay.tp * lay.cp <= 1:
        return
    if not lay.groups["tp_cp"].within_node:
        yield warning(
            "STAGE_CROSSES_NODES",
            "parallel.context_parallel_size",
            lay.cp,
            f"one pipeline stage of a replica is tp({lay.tp}) * cp({lay.cp}) = {lay.tp * lay.cp} GPUs, "
            f"split across nodes of {lay.gpus_per_node} GPUs",
            "make tp*cp divide gpus_per_node",
        )


def ep_alltoall_bytes_per_step(cfg: RunConfig, lay: Layout) -> float:
    """Bytes one GPU sends over the network per step in the MoE all-to-alls (estimate).

    Per MoE layer and micro-batch: dispatch + combine, forward and backward (4 all-to-alls) of
    tokens * topk * hidden * 2 bytes, times the share of EP peers outside the rank's NVLink domain (its node,
    or a rack of nodes such as GB200 NVL72's 72 GPUs).
    """
    m = cfg.model
    if not m.num_moe_experts or lay.ep <= 1 or lay.num_microbatches is None:
        return 0.0
    tokens = m.seq_length // lay.cp * cfg.trainer.micro_batch_size
    if cfg.parallel.sequence_parallel:
        tokens //= lay.tp
    moe_layers = moe_count(moe_layer_pattern(m)) / lay.pp
    off_domain = 1 - ep_peers_on_node(lay.ep, lay.etp, lay.nvlink_domain_size) / lay.ep
    return 4 * tokens * m.moe_router_topk * m.hidden_size * 2 * moe_layers * lay.num_microbatches * off_domain


def rule_ep_network(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """EP all-to-all leaving the NVLink domain: warn with the estimated network bytes per step. An expert group
    that spans nodes inside one NVLink domain (GB200 NVL72) exchanges over NVLink, not the network."""
    gpu = gpu_spec(cfg.cluster.gpu)
    ep = lay.groups.get("ep")
    if gpu is None or gpu.vendor == "cpu" or ep is None or ep.within_nvlink or not cfg.model.num_moe_experts:
        return
    b = ep_alltoall_bytes_per_step(cfg, lay)
    bw = cfg.cluster.inter_node_bandwidth_gbs * 1e9
    secs = f", about {b / bw:.2f} s at {cfg.cluster.inter_node_bandwidth_gbs:g} GB/s" if bw > 0 else ""
    yield warning(
        "EP_CROSSES_NODES",
        "parallel.expert_model_parallel_size",
        lay.ep,
        f"etp({lay.etp}) * ep({lay.ep}) = {lay.etp * lay.ep} GPUs per expert group span NVLink domains "
        f"of {lay.nvlink_domain_size}: the all-to-all sends {b / 1e9:.2f} GB per GPU a step over the network{secs}",
        f"keep etp*ep <= {lay.nvlink_domain_size} if the experts fit, or overlap the all-to-all",
    )


def rule_gpu_only_features(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """On CPU ranks, GPU-only features are errors (FP8/FP4, TP comm overlap, grouped GEMM, CUDA graphs)."""
    gpu = gpu_spec(cfg.cluster.gpu)
    if gpu is None or gpu.vendor != "cpu":
        return
    feats = (
        ("precision.fp8", cfg.precision.fp8 is not None, cfg.precision.fp8, "null"),
        ("precision.fp4", cfg.precision.fp4 is not None, cfg.precision.fp4, "null"),
        ("parallel.tp_comm_overlap", cfg.parallel.tp_comm_overlap, True, "false"),
        ("model.moe_grouped_gemm", cfg.model.moe_grouped_gemm, True, "false"),
        ("model.cuda_graph_impl", cfg.model.cuda_graph_impl != "none", cfg.model.cuda_graph_impl, "none"),
    )
    for field, on, value, off in feats:
        if on:
            yield error(
                "GPU_ONLY_ON_CPU",
                field,
                value,
                f"{field} needs a GPU (Transformer Engine / CUDA); cluster.gpu is cpu",
                f"set {field}={off} for CPU ranks",
            )


RULES = (rule_cluster_shape, rule_tp_nvlink, rule_stage_split, rule_ep_network, rule_gpu_only_features)
