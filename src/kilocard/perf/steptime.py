"""Analytic step time of a parallel layout on a cluster.

Inputs: the model's ``ModelShape``, the run's one ``kilocard.layout.Layout`` (degrees, DP, layers per
stage), the ``Features`` that change its speed (batch, recompute, overlaps, dtypes, kernels) and the
``Hardware``.

One optimizer step = the pipeline schedule over ``M = GBS / (MBS * DP)`` micro-batches of the
slowest stage, plus what does not hide behind it (data-parallel collectives, optimizer step).
Per micro-batch and layer the model charges:

* GEMMs: per-GPU FLOPs over ``peak * gemm_efficiency``, each of M, N, K adding ``knee / dim``;
* the attention core: flash kernels at ``flash_attention_efficiency`` (FlashAttention-2's at
  ``fa2_attention_ratio`` of that) over the keys each query attends to (half the sequence under the
  causal mask, the window's band on sliding-window layers), or (``local``/``unfused``
  backends) two batched GEMMs plus the s x s score traffic at HBM bandwidth;
* elementwise work (norms, residuals, dropout, activations, RoPE, FP8 casts) at HBM bandwidth,
  replicated over TP ranks unless sequence parallelism shards it;
* TP collectives on NVLink (less what ``tp_comm_overlap`` and the backward overlap hide), CP ring
  exchange behind attention, EP all-to-all;
* full recompute adds a forward, selective recompute the attention core's forward, torchtitan's
  op-level checkpointing (``op``) every other projection GEMM and the elementwise work;
* LoRA (``lora_dim``): the frozen base's GEMMs (the layers' and the output layer's) skip their
  weight-gradient GEMM, half of each one's backward and a third of its training FLOPs (forward + input
  gradient remain: 2x the forward instead of 3x); the adapters' own low-rank GEMMs are charged in full,
  and only the adapters' gradients are reduced, stepped and zeroed.

Then the pipeline bubble ``(P - 1) / V`` stage passes, point-to-point sends, the gradient
reduce-scatter / all-reduce and parameter all-gather over DP x CP, the optimizer step, and the wait for
the slowest of the run's GPUs (per-GPU speed spread times the expected largest of N normal draws).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import NormalDist

from kilocard.layout import Layout
from kilocard.perf.efficiency import FITTED, GpuEfficiency, PerfModelParams
from kilocard.perf.flops import ModelShape
from kilocard.perf.params import linear_shapes, moe_count


@dataclass(frozen=True)
class Hardware:
    """The datasheet facts the model needs about one GPU and its cluster."""

    gpu: str
    """GPU table key (``h100-sxm5-80gb`` ...)."""
    family: str
    """GPU family the efficiencies belong to (``ampere``, ``hopper``, ``blackwell``, ``cdna3``)."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s by dtype (``bf16``, ``fp16``, ``fp8``, ``fp4``, ``fp32``)."""
    hbm_bandwidth: float
    """HBM bandwidth, bytes/s."""
    nvlink_bandwidth: float
    """NVLink bandwidth per GPU, one direction, bytes/s."""
    network_bandwidth: float
    """Network bandwidth per GPU, one direction, bytes/s."""
    gpus_per_node: int
    """GPUs per node."""
    nvlink_domain: int
    """GPUs sharing one NVLink domain."""
    pod_gpus: int = 0
    """GPUs per network pod (full bisection bandwidth inside); 0 when the run's GPUs fit in one pod or
    the network has no oversubscribed layer."""
    pod_oversubscription: float = 1.0
    """A pod's GPU-facing bandwidth over its uplinks to the layer joining the pods (Llama 3: 7)."""


@dataclass(frozen=True)
class Features:
    """What besides the parallel layout changes a step's speed: batch, recompute, overlaps, dtypes, kernels."""

    mbs: int = 1
    """Micro-batch size."""
    gbs: int = 1
    """Global batch size (sequences)."""
    recompute: str = "none"
    """``none``, ``selective``, ``full``, or ``op``: torchtitan's op-level selective checkpointing
    (``selective_ac_option = "op"``), which keeps the attention core's output and every other
    projection's, recomputing the rest of the layer's forward (``op_recompute_gemm_share``)."""
    sequence_parallel: bool = False
    """Sequence parallelism over TP ranks."""
    distributed_optimizer: bool = False
    """Optimizer state sharded over DP x CP (reduce-scatter + all-gather instead of all-reduce)."""
    overlap_grad_reduce: bool = False
    """Gradient reduce overlapped with backward."""
    overlap_param_gather: bool = False
    """Parameter all-gather overlapped with forward."""
    tp_comm_overlap: bool = False
    """TP collectives overlapped with GEMMs."""
    overlap_p2p_comm: bool = False
    """Pipeline sends overlapped with compute."""
    precision: str = "bf16"
    """GEMM precision: ``bf16``, ``fp16``, ``fp8``, ``fp4`` or ``fp32``."""
    fp8_recipe: str = "delayed"
    """FP8 scaling recipe (``delayed``, ``tensorwise``, ``mxfp8``, ``blockwise``): MXFP8 GEMMs carry
    block scales."""
    grad_bytes: int = 4
    """Bytes per gradient element in the DP reduce (4: fp32, 2: bf16)."""
    flash_attention: bool = True
    """Fused attention kernels (no materialised s x s scores)."""
    num_experts: int = 0
    """Routed experts (0: dense)."""
    moe_dispatcher: str = "alltoall"
    """Megatron-Core's ``moe_token_dispatcher_type``: ``alltoall`` sends every routed copy, ``flex``
    (DeepEP / HybridEP) one copy per destination rank inside an NVLink domain and one per destination
    domain across domains, at DeepEP's stated bandwidth (``flex_all_to_all_time``)."""
    dropout: bool = False
    """Hidden/attention dropout on (extra mask traffic)."""
    attention_backend: str = "auto"
    """Megatron-Core's ``attention_backend``: ``flash`` runs FlashAttention-2 kernels (as PyTorch SDPA's
    flash backend does), slower on Hopper than the fused cuDNN kernels ``auto``/``fused`` select
    (``fa2_attention_ratio``)."""
    cross_entropy: str = "unfused"
    """Megatron-Core's vocab-parallel cross-entropy path: ``unfused`` (``cross_entropy_loss_fusion`` off),
    ``native`` or ``te`` (its ``cross_entropy_fusion_impl``); HBM bytes per logit in
    ``CROSS_ENTROPY_BYTES``."""
    fp8_param_gather: bool = False
    """Parameters gathered over DP in FP8 (Megatron-Core ``fp8_param_gather``, torchtitan's
    ``enable_fsdp_float8_all_gather``): one byte per element of the layers' GEMM weights; the
    embedding and output layer stay bf16. Used by the FSDP gathers (``dp_comm_fsdp``); the distributed
    optimizer's gather is counted in bf16."""
    fsdp_reshard_after_forward: bool = False
    """Fully sharded parameters (PyTorch FSDP2, one ``fully_shard`` unit per transformer block and one
    root unit for the embedding, final norm and output layer) freed after each block's forward and
    gathered again for its backward (torchtitan's ``fsdp_reshard_after_forward = "default"`` without
    pipeline parallelism; FSDP2 never reshards the root), every micro-batch, with the gradients
    reduce-scattered every micro-batch (``dp_comm_fsdp``)."""
    float8_converter: bool = False
    """FP8 GEMMs through torchao's ``Float8Linear`` (torchtitan's ``model.converters = ["float8"]``) with
    dynamic tensorwise scaling: every operand cast in its own amax and cast passes, not fused into the
    producing norm or activation as Transformer Engine does (``torchao_cast_bytes``)."""
    cuda_graph_impl: str = "none"
    """Megatron-Core's ``cuda_graph_impl``: ``none``, ``local`` or ``transformer_engine``."""
    cuda_graph_scope: tuple[str, ...] = ()
    """Megatron-Core's ``cuda_graph_scope``: empty = the whole layer (``full_iteration``: the whole step);
    with ``transformer_engine`` the captured modules (``attn``, ``mlp``, ``moe``, ``moe_router``,
    ``moe_preprocess``)."""
    forward_only: bool = False
    """An evaluation step (``trainer.eval_iters`` rounds, Megatron-Core's schedule with ``forward_only=True``):
    each micro-batch's forward only (no backward, no recompute), activations but no gradients between
    stages, and no gradient reduce, optimizer step or parameter pass."""
    lora_dim: int = 0
    """LoRA rank (``peft.dim``; 0: no LoRA, every weight trained): the base is frozen."""
    lora_targets: tuple[str, ...] = ()
    """LoRA target modules (``peft.target_modules``)."""
    pipeline_flushes: int = 1
    """Times the pipeline schedule fills and drains per optimizer step: 1 for Megatron-Core, whose
    schedule runs all of a step's micro-batches; NeMo AutoModel runs one schedule per local batch (LBS
    sequences per GPU) and accumulates GA of them into a step (``recipes/llm/train_ft.py`` at
    NVIDIA-NeMo/Automodel 79d0ccfd: ``_run_train_optim_step`` calls ``_forward_backward_step`` per local
    batch, which runs ``schedule.step``; gradients sync on the last, ``get_sync_ctx``)."""


def microbatches(lay: Layout, ft: Features) -> int:
    """Micro-batches per DP rank per step."""
    return max(1, ft.gbs // (ft.mbs * (lay.dp or 1)))


@dataclass(frozen=True)
class StepTime:
    """Predicted time of one optimizer step and where it goes (seconds, per step)."""

    total_s: float
    """Predicted step time."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """Seconds per component: gemm, attention, elementwise, tp_comm, cp_comm, ep_comm, bubble,
    pp_p2p, dp_comm, optimizer, param_passes, overhead, straggler."""


ACT_BYTES = 2
"""Bytes per activation element (bf16/fp16) in elementwise kernels and collectives."""


def gemm_time(m: float, n: float, k: float, count: float, peak: float, eff: GpuEfficiency) -> float:
    """Time of ``count`` GEMMs ``(m x k) @ (k x n)``: FLOPs at efficiency, each dim adding knee/dim."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    penalty = 1.0 + eff.gemm_knee * (1.0 / m + 1.0 / n + 1.0 / k)
    return count * 2.0 * m * n * k / (peak * eff.gemm_efficiency) * penalty


def _peak(hw: Hardware, ft: Features, eff: GpuEfficiency) -> float:
    """Effective GEMM peak for the run's precision (FP8's fraction scaled by ``fp8_gemm_ratio``, and by
    ``mxfp8_gemm_ratio`` for block-scaled MXFP8)."""
    precision = ft.precision
    if precision in ("fp8", "fp4") and precision in hw.peak_flops:
        block = eff.mxfp8_gemm_ratio if precision == "fp8" and ft.fp8_recipe == "mxfp8" else 1.0
        return hw.peak_flops[precision] * eff.fp8_gemm_ratio * block
    return hw.peak_flops.get("bf16" if precision in ("fp8", "fp4") else precision, hw.peak_flops["bf16"])


@dataclass(frozen=True)
class _Layer:
    """Forward time of one layer for one micro-batch on one GPU, by component."""

    gemm: float
    attn: float
    """The attention core: its kernels, and for the unfused core also its scores' HBM traffic (softmax,
    dropout), all of which selective recompute reruns."""
    elem: float
    elem_bwd: float
    """Elementwise time of the layer's backward (twice the forward's, plus what FP8 casts add)."""
    tp_comm: float
    cp_comm: float
    ep_comm: float
    adapter_gemm: float = 0.0
    """The LoRA adapters' GEMMs (A then B of every target module)."""


def layer_forward(
    shape: ModelShape, lay: Layout, ft: Features, hw: Hardware, eff: GpuEfficiency, params: PerfModelParams, moe: bool
) -> _Layer:
    """Forward-pass times of one transformer layer for one micro-batch on one GPU."""
    t, h = lay.tp, shape.hidden
    tok = ft.mbs * shape.seq / lay.cp
    q = shape.kv_channels * shape.heads
    kv = shape.kv_channels * shape.query_groups
    peak = _peak(hw, ft, eff)
    gemm = gemm_time(tok, (q + 2 * kv) / t, h, 1, peak, eff) + gemm_time(tok, h, q / t, 1, peak, eff)
    mats = 2 if shape.gated else 1
    if moe:
        moe_ffn = shape.moe_ffn or shape.ffn
        count = local_experts(ft, lay)
        # Each GPU receives its ETP group's routed tokens (tok / TP each, top-k times) for its experts.
        m_e = tok / t * shape.topk * lay.etp / count
        gemm += gemm_time(m_e, moe_ffn * mats / lay.etp, h, count, peak, eff)
        gemm += gemm_time(m_e, h, moe_ffn / lay.etp, count, peak, eff)
        if shape.shared_ffn:
            gemm += gemm_time(tok, shape.shared_ffn * mats / t, h, 1, peak, eff)
            gemm += gemm_time(tok, h, shape.shared_ffn / t, 1, peak, eff)
        ffn_elems = (moe_ffn * shape.topk + shape.shared_ffn) / t
        permute = (2 * shape.topk + 2) * h / t  # tokens copied to expert order (top-k copies) and back
    else:
        gemm += gemm_time(tok, shape.ffn * mats / t, h, 1, peak, eff)
        gemm += gemm_time(tok, h, shape.ffn / t, 1, peak, eff)
        ffn_elems = shape.ffn / t
        permute = 0.0
    core, score_bytes = attention_forward(shape, lay, ft, hw, eff, tok)
    hbm = hw.hbm_bandwidth * eff.hbm_efficiency
    # The unfused core's score traffic (softmax, dropout) belongs to the attention core, which selective
    # recompute reruns as a whole.
    attn = core + score_bytes / hbm
    replicated = h * (10 + (6 if ft.dropout else 0))  # 2 norms, 2 residual adds (+ dropout masks)
    per_token = replicated / (t if ft.sequence_parallel else 1) + ffn_elems * (3 if shape.gated else 2)
    per_token += 2 * (q + kv) / t + permute  # RoPE / bias on q and k
    cast_fwd, cast_bwd = fp8_cast_bytes(shape, lay, ft, ffn_elems)
    plain = tok * per_token * ACT_BYTES / hbm
    return _Layer(
        gemm,
        attn,
        plain + tok * cast_fwd / hbm,
        2 * plain + tok * cast_bwd / hbm,
        tp_comm_forward(tok, h, lay, ft, hw, params),
        cp_comm_forward(tok, kv, lay, ft, hw, params, core),
        ep_comm_forward(tok, h, shape, lay, ft, hw, params) if moe else 0.0,
        adapter_forward(shape, lay, ft, tok, peak, eff),
    )


def lora_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """``(in, out)`` of each LoRA target module of a layer (``kilocard.perf.params.lora_shapes`` on a shape)."""
    q, kv = shape.kv_channels * shape.heads, shape.kv_channels * shape.query_groups
    return linear_shapes(shape.hidden, q, kv, shape.ffn, shape.gated)


def adapter_forward(shape: ModelShape, lay: Layout, ft: Features, tok: float, peak: float, eff: GpuEfficiency) -> float:
    """Forward time of one layer's LoRA adapters: A (``dim`` rows split over TP for a column-parallel target,
    its input columns for a row-parallel one) then B (output rows split over TP)."""
    if not ft.lora_dim:
        return 0.0
    t, r, total = lay.tp, ft.lora_dim, 0.0
    for name, (n_in, n_out) in lora_shapes(shape).items():
        if name not in ft.lora_targets:
            continue
        column = name in ("linear_qkv", "linear_fc1")
        total += gemm_time(tok, r / t, n_in, 1, peak, eff) if column else gemm_time(tok, r, n_in / t, 1, peak, eff)
        total += gemm_time(tok, n_out / t, r, 1, peak, eff)
    return total


def lora_params_per_gpu(shape: ModelShape, lay: Layout, ft: Features, stage_layers: float) -> float:
    """Adapter parameters on one GPU of a stage with ``stage_layers`` layers: ``dim * (in + out)`` per target / TP."""
    per_layer = sum(ft.lora_dim * (i + o) for n, (i, o) in lora_shapes(shape).items() if n in ft.lora_targets)
    return per_layer * stage_layers / lay.tp


def fp8_cast_bytes(shape: ModelShape, lay: Layout, ft: Features, ffn_elems: float) -> tuple[float, float]:
    """HBM bytes per token of one layer's FP8 operand casts, (forward, backward); (0, 0) without FP8.

    Transformer Engine fuses the cast and amax into the producing norm or activation kernel: about
    1.5 bf16 elements of traffic per element of ``3h + q + F`` forward, twice that backward. torchao's
    ``Float8Linear`` with dynamic tensorwise scaling (``float8_converter``; ``torchao/float8/
    float8_linear.py``) scales every GEMM operand from its own amax, so each cast is two passes: the
    amax reads the bf16 tensor (2 B per element), the cast reads it again and writes FP8 (3 B). Forward
    it casts each distinct GEMM input (``2h + q + F``; wq/wk/wv and w1/w3 share theirs); backward each
    output gradient (``q + 2kv + 2h + F_up``) likewise and, because ``torch._scaled_mm`` takes its second
    operand column-major, copies the weight-gradient GEMM's FP8 operands transposed (gradient and saved
    input, 2 B per element: read and write). The weights' transposed copies (per micro-batch, not per
    token) are not counted."""
    if ft.precision not in ("fp8", "fp4"):
        return 0.0, 0.0
    t, h = lay.tp, shape.hidden
    h_in = h / (t if ft.sequence_parallel else 1)
    q = shape.kv_channels * shape.heads / t
    if not ft.float8_converter:
        fwd = 1.5 * (3 * h_in + ffn_elems + q) * ACT_BYTES
        return fwd, 2 * fwd
    kv = shape.kv_channels * shape.query_groups / t
    inputs = 2 * h_in + q + ffn_elems
    grads = q + 2 * kv + 2 * h_in + ffn_elems * (2 if shape.gated else 1)
    return 5.0 * inputs, 7.0 * grads + 2.0 * inputs


def attention_forward(
    shape: ModelShape, lay: Layout, ft: Features, hw: Hardware, eff: GpuEfficiency, tok: float
) -> tuple[float, float]:
    """(compute seconds, score bytes) of the attention core forward for one micro-batch on one GPU."""
    heads = shape.heads / lay.tp
    d = shape.kv_channels
    if shape.mla is not None:
        d = (shape.mla.qk_head_dim + shape.mla.qk_pos_emb_head_dim + shape.mla.v_head_dim) / 2
    # QK^T and PV over the keys each query attends to: half the s x s under the causal mask, the band of
    # a sliding window on its layers (the fused kernels skip the tiles outside it)
    causal_flops = 4.0 * tok * shape.attended_keys * heads * d
    if ft.flash_attention:
        fa2 = eff.fa2_attention_ratio if ft.attention_backend == "flash" else 1.0
        return causal_flops / (hw.peak_flops["bf16"] * eff.flash_attention_efficiency * fa2), 0.0
    # Unfused: two batched GEMMs over the full square, scores written, softmaxed, (dropout), read.
    per_head = gemm_time(shape.seq / lay.cp, shape.seq, d, 2 * ft.mbs * heads, hw.peak_flops["bf16"], eff)
    score_elems = tok * shape.seq * heads
    return per_head, score_elems * ACT_BYTES * (6 if ft.dropout else 4)


def _per_domain(stride: int, size: int, hw: Hardware) -> int:
    """Members of a group of ``size`` ranks ``stride`` apart that share one NVLink domain."""
    return max(1, min(size, hw.nvlink_domain // stride))


def ring_bandwidth(stride: int, size: int, hw: Hardware, params: PerfModelParams) -> float:
    """Achieved per-GPU bus bandwidth of a ring collective (all-reduce, reduce-scatter, all-gather)
    over ``size`` ranks ``stride`` apart.

    Inside one NVLink domain: NVLink. Across domains, the ``k`` members a domain holds drive ``k``
    NICs at once (NCCL runs one ring per NIC, each crossing domains once per domain), so the bus
    bandwidth is ``k`` NICs' worth, never more than NVLink's.
    """
    net = params.network
    nvlink = hw.nvlink_bandwidth * net.nvlink_efficiency
    if stride * size <= hw.nvlink_domain:
        return nvlink
    nics = _per_domain(stride, size, hw) * hw.network_bandwidth * net.network_efficiency
    return min(nvlink, nics, pod_bandwidth(stride, size, hw, params))


def pod_limited(stride: int, size: int, hw: Hardware) -> bool:
    """Whether the groups of ``size`` ranks ``stride`` apart go through an oversubscribed layer: the
    network has one and some group spans two pods (groups tile the ranks in aligned blocks of ``stride *
    size``, ``kilocard.topology.groups_cross``; ``hardware_for`` keeps ``pod_gpus`` only for runs larger
    than one pod)."""
    return hw.pod_oversubscription > 1.0 and hw.pod_gpus > 0 and size > 1 and hw.pod_gpus % (stride * size) != 0


def pod_bandwidth(stride: int, size: int, hw: Hardware, params: PerfModelParams) -> float:
    """Per-GPU bandwidth a ring or chain of ``size`` ranks ``stride`` apart gets across pods (infinite
    when it stays inside one, or the network is not oversubscribed).

    Every group of the kind runs at once. A ring or chain leaves a pod once per pass, so each of the
    ``m`` members a pod holds has ``m`` members' share of the pod's uplinks: the pod's ``pod_gpus``
    NICs over ``pod_oversubscription``, divided over ``pod_gpus / m`` groups, is ``m /
    pod_oversubscription`` NICs per group (Llama 3, arXiv 2407.21783, Section 3.3.1: 3,072-GPU pods
    at full bisection, 1:7 above them)."""
    if not pod_limited(stride, size, hw):
        return float("inf")
    members = max(1, min(size, hw.pod_gpus // stride))
    return members * hw.network_bandwidth * params.network.network_efficiency / hw.pod_oversubscription


def neighbour_bandwidth(span: int, hw: Hardware, params: PerfModelParams) -> float:
    """Achieved per-GPU bandwidth of sends between ranks ``span`` apart (pipeline stages, the CP
    ring): NVLink inside a domain, else the GPU's own NIC (its neighbours' NICs are busy too)."""
    if span <= hw.nvlink_domain:
        return hw.nvlink_bandwidth * params.network.nvlink_efficiency
    return hw.network_bandwidth * params.network.network_efficiency


def all_to_all_time(
    volume: float, stride: int, size: int, hw: Hardware, params: PerfModelParams, off_domain: float | None = None
) -> float:
    """Seconds of an all-to-all in which each of ``size`` ranks ``stride`` apart sends ``volume``
    bytes spread evenly over the group: the share for members of its own NVLink domain goes over
    NVLink, the rest (``off_domain`` bytes when given) over its NIC, both at once."""
    k = _per_domain(stride, size, hw) if stride * size > hw.nvlink_domain else size
    net = params.network
    nic = hw.network_bandwidth * net.network_efficiency
    inside = volume * (k - 1) / size / (hw.nvlink_bandwidth * net.nvlink_efficiency)
    leaving = volume * (size - k) / size if off_domain is None else off_domain
    outside = leaving / nic
    if not pod_limited(stride, size, hw):
        return max(inside, outside)
    # Every GPU of a pod sends the share of its bytes bound for other pods through uplinks worth
    # 1 / pod_oversubscription of its NIC.
    in_pod = max(k, min(size, hw.pod_gpus // stride))
    off_pod = leaving * (size - in_pod) / (size - k) if size > k else 0.0
    return max(inside, outside, off_pod * hw.pod_oversubscription / nic)


def remote_domains_per_token(topk: int, domains: int) -> float:
    """Expected number of other NVLink domains (or ranks) holding at least one of a token's ``topk``
    experts, the experts spread evenly over ``domains`` of them: what a deduplicating dispatcher sends
    per token."""
    return (domains - 1) * (1.0 - (1.0 - 1.0 / domains) ** topk) if domains > 1 else 0.0


def holders_per_token(topk: int, units: int) -> float:
    """Expected number of the ``units`` NVLink domains (or ranks) holding at least one of a token's
    ``topk`` experts, its own included: the copies DeepEP sends per token, one per holder."""
    return units * (1.0 - (1.0 - 1.0 / units) ** topk)


#: DeepEP's normal (training) kernels across NVLink domains, as its README states them (deepseek-ai/DeepEP
#: ``README.md`` at e02e4d2e, "Normal kernels with NVLink and RDMA forwarding"; ``docs/legacy.md`` since
#: V2): H800s, each with one CX7 400 Gb/s NIC (~50 GB/s), top-8 experts, 4096 tokens of hidden 7168. A token
#: goes over RDMA once to the same-rank GPU of each node holding one of its experts and is forwarded
#: there over NVLink. The stated "bottleneck bandwidth" is logical: ``tests/test_internode.py`` divides
#: the bytes of one copy per node holding an expert of the token, its own node included
#: (``num_rdma_token_sent``), by the kernel's time. Per node count, dispatch and combine averaged, over
#: the NIC's 50 GB/s: EP16 (2 nodes) 43 and 43 GB/s, EP32 (4) 58 and 57, EP64 (8) 51 and 50.
DEEPEP_LOGICAL_RDMA: dict[int, float] = {2: 43.0 / 50.0, 4: 57.5 / 50.0, 8: 50.5 / 50.0}


def deepep_logical_ratio(domains: int) -> float:
    """DeepEP's stated logical RDMA bandwidth over the NIC's for a group over ``domains`` NVLink domains:
    the figure of the largest stated node count not above it (``DEEPEP_LOGICAL_RDMA``)."""
    return DEEPEP_LOGICAL_RDMA[max((d for d in DEEPEP_LOGICAL_RDMA if d <= domains), default=2)]


def flex_all_to_all_time(
    token: float, topk: int, stride: int, size: int, hw: Hardware, params: PerfModelParams
) -> float:
    """Seconds of one dispatch (or combine) of the ``flex`` dispatcher (DeepEP / HybridEP) over ``size``
    ranks ``stride`` apart spanning NVLink domains, ``token`` bytes per routed token: one copy per domain
    holding one of its ``topk`` experts (its own included) at DeepEP's stated logical RDMA bandwidth
    (``deepep_logical_ratio``: RDMA to the same-rank GPU, NVLink forwarding behind it), never faster than
    the NIC carries the copies for other domains (``all_to_all_time``, pods included)."""
    domains = max(2, -(-size // _per_domain(stride, size, hw)))  # the group spans at least two
    logical = token * holders_per_token(topk, domains)
    kernel = logical / (deepep_logical_ratio(domains) * hw.network_bandwidth)
    remote = token * remote_domains_per_token(topk, domains)
    return max(kernel, all_to_all_time(token * topk, stride, size, hw, params, remote))


def tp_comm_forward(tok: float, h: int, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams) -> float:
    """Two all-reduces (or AG + RS pairs with SP) of the micro-batch's activations per layer forward."""
    if not lay.tp_enabled:
        return 0.0
    volume = 2 * 2 * (lay.tp - 1) / lay.tp * tok * h * ACT_BYTES
    return volume / ring_bandwidth(1, lay.tp, hw, params)


def cp_comm_forward(
    tok: float, kv: int, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams, attn: float
) -> float:
    """Ring exchange of K and V over CP ranks, exposed beyond the attention it overlaps with."""
    if not lay.cp_enabled:
        return 0.0
    volume = (lay.cp - 1) * 2 * tok * kv / lay.tp * ACT_BYTES
    bw = min(neighbour_bandwidth(lay.tp * lay.cp, hw, params), pod_bandwidth(lay.tp, lay.cp, hw, params))
    return max(0.0, volume / bw - attn)


def ep_comm_forward(
    tok: float, h: int, shape: ModelShape, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams
) -> float:
    """Dispatch and combine all-to-alls of the routed tokens over EP ranks (``etp`` apart: Megatron-Core's
    expert rank order puts ETP fastest, then EP), and with expert TP the gather and scatter of the routed
    tokens inside the ETP group (``etp_comm_forward``)."""
    etp = etp_comm_forward(tok, h, shape, lay, hw, params)
    if not lay.ep_enabled:
        return etp
    token = tok / lay.tp * h * ACT_BYTES
    if ft.moe_dispatcher != "flex":
        return 2 * all_to_all_time(token * shape.topk, lay.etp, lay.ep, hw, params) + etp
    if lay.etp * lay.ep > hw.nvlink_domain:
        return 2 * flex_all_to_all_time(token, shape.topk, lay.etp, lay.ep, hw, params) + etp
    # Inside one domain DeepEP sends a token once to each rank holding one of its experts (the
    # ``is_token_in_rank`` layout of ``Buffer.get_dispatch_layout``), not once per expert.
    copies = token * holders_per_token(shape.topk, lay.ep)
    return 2 * all_to_all_time(copies, lay.etp, lay.ep, hw, params) + etp


def etp_comm_forward(
    tok: float, h: int, shape: ModelShape, lay: Layout, hw: Hardware, params: PerfModelParams
) -> float:
    """All-gather of the routed tokens over the expert-TP group before the experts and reduce-scatter of
    their outputs after them: each GPU holds its ``tok / TP`` tokens' ``topk`` routed copies and receives
    ``ETP - 1`` such shares (Megatron-Core ``MoEAlltoAllTokenDispatcher``: ``dispatch_postprocess``
    AG(TP), ``combine_preprocess`` RS(TP), ``megatron/core/transformer/moe/token_dispatcher.py``). The
    experts' linear layers leave this communication to the dispatcher, so ``tp_comm_overlap`` does not
    hide it."""
    if lay.etp <= 1:
        return 0.0
    routed = tok / lay.tp * shape.topk * h * ACT_BYTES
    return 2 * (lay.etp - 1) * routed / ring_bandwidth(1, lay.etp, hw, params)


def op_recompute_gemm_share(shape: ModelShape) -> float:
    """Share of a dense layer's forward GEMM FLOPs that torchtitan's op-level selective checkpointing
    recomputes. Its policy (``torchtitan/models/llama3/parallelize_llama.py`` ``_custom_policy`` at
    e7c0cae) saves every ``aten.mm`` output except every second one of a block, counted in call order:
    of wq, wk, wv, wo, w1, w3, w2 (gated MLP; w1, w2 ungated) it recomputes wk, wo and w3 (wk, wo and
    w2 ungated). GEMM FLOPs per token are proportional to each weight's size."""
    q = shape.heads * shape.kv_channels
    kv = shape.query_groups * shape.kv_channels
    h, f = shape.hidden, shape.ffn
    mlp = 3 * h * f if shape.gated else 2 * h * f
    recomputed = kv * h + q * h + h * f
    return recomputed / (q * h + 2 * kv * h + q * h + mlp)


def recompute_shares(shape: ModelShape, ft: Features) -> tuple[float, float, float]:
    """Forward work recomputed in the backward, as shares of (GEMMs and collectives, attention core,
    elementwise): full recomputes the whole forward, selective the attention core, ``op`` (torchtitan)
    every other projection and all elementwise work, keeping the attention core."""
    if ft.recompute == "full":
        return 1.0, 1.0, 1.0
    if ft.recompute == "selective":
        return 0.0, 1.0, 0.0
    if ft.recompute == "op":
        return op_recompute_gemm_share(shape), 0.0, 1.0
    return 0.0, 0.0, 0.0


def sp_regather_share(lay: Layout, ft: Features) -> float:
    """Extra TP traffic of the backward with sequence parallelism, as a share of the backward's own: a
    column-parallel linear keeps its input sequence-sharded and all-gathers it again in the backward for
    its weight gradient (``LinearWithGradAccumulationAndAsyncCommunication.backward``, ``megatron/mpu/
    layers.py`` at Megatron-LM 877f6a1bd5; ``megatron/core/tensor_parallel/layers.py`` alike): two
    all-gathers per layer (QKV and MLP input) beside the backward's two all-gather / reduce-scatter pairs,
    overlapped with the input-gradient GEMM as the rest of the backward's collectives are."""
    return 0.5 if ft.sequence_parallel and lay.tp_enabled else 0.0


def tp_gather_bytes_ratio(lay: Layout, ft: Features) -> float:
    """Bytes per element of the sequence-parallel all-gathers of GEMM inputs over bf16's: 0.5 in FP8 runs
    under Transformer Engine, 1 otherwise.

    With FP8 and sequence parallelism Transformer Engine quantizes the norm's output (and a linear's
    input) before gathering it over the TP group and gathers the FP8 bytes, in the forward and again in
    the backward's re-gather for the weight gradient: ``_LayerNormLinear`` gathers its ``uint8``
    ``ln_out`` (``transformer_engine/pytorch/module/layernorm_linear.py`` at 0004dbd0, Megatron-Core
    0.8 / NeMo 24.07 era) and passes the input quantizer to ``gather_along_first_dim`` (same file at
    d0067d0d, Transformer Engine 2.x: FP8 per-tensor, blockwise and MXFP8 all-gathers,
    ``transformer_engine/pytorch/distributed.py``). The reduce-scatters of GEMM outputs stay bf16.
    Transformer Engine also gathers the row-parallel layers' output gradients in FP8 in the backward
    (``grad_output_preprocess`` in ``module/base.py``, both commits); the model charges those in bf16:
    charging them in FP8 made the held-out error worse (``docs/perf_model.md``, TP collectives).
    torchao's ``Float8Linear`` gathers bf16."""
    fp8_gather = ft.precision == "fp8" and not ft.float8_converter and ft.sequence_parallel and lay.tp_enabled
    return 0.5 if fp8_gather else 1.0


def graphed_overhead_share(ft: Features, params: PerfModelParams, moe: bool) -> float:
    """Share of a layer pass's fixed overhead (``layer_overhead_s``) that CUDA graphs remove: a captured
    module launches as one graph instead of its kernels one by one (Megatron-Core ``TransformerConfig``
    ``cuda_graph_impl`` / ``cuda_graph_scope``). ``local`` graphs and an empty scope capture the whole
    layer (or step); a Transformer Engine scope of ``attn`` the attention block
    (``attn_overhead_share`` of it), ``mlp`` (dense layers) or ``moe`` (MoE layers) the rest. The router
    and token preprocessing (``moe_router``, ``moe_preprocess``) and the per-expert kernels
    (``expert_overhead_s``) are not split out of the model's overhead and stay charged."""
    if ft.cuda_graph_impl == "none":
        return 0.0
    scope = set(ft.cuda_graph_scope)
    if ft.cuda_graph_impl == "local" or not scope or scope & {"full", "full_iteration"}:
        return 1.0
    attn = params.network.attn_overhead_share
    return (attn if "attn" in scope else 0.0) + (1.0 - attn if ("moe" if moe else "mlp") in scope else 0.0)


def local_experts(ft: Features, lay: Layout) -> int:
    """Routed experts on one GPU."""
    return max(1, ft.num_experts // lay.ep)


def stage_microbatch_time(
    shape: ModelShape,
    lay: Layout,
    ft: Features,
    hw: Hardware,
    params: PerfModelParams,
    layers: float,
    parts: dict[str, float],
) -> float:
    """Forward + backward (+ recompute) time of one micro-batch through ``layers`` layers of a stage;
    adds each component's seconds to ``parts``."""
    eff = params.for_family(hw.family)
    n_moe = moe_count(shape.moe_layers) / shape.layers if shape.moe_layers else 0.0
    total = 0.0
    for moe, frac in ((False, 1.0 - n_moe), (True, n_moe)):
        if frac <= 0:
            continue
        f = layer_forward(shape, lay, ft, hw, eff, params, moe)
        per_layer = _layer_parts(f, shape, lay, ft, params, moe)
        n = layers * frac
        for key, v in per_layer.items():
            parts[key] = parts.get(key, 0.0) + n * v
            total += n * v
    return total


def _layer_parts(
    f: _Layer, shape: ModelShape, lay: Layout, ft: Features, params: PerfModelParams, moe: bool
) -> dict[str, float]:
    """Seconds of one layer for one micro-batch, by component: forward, backward (2x the forward's GEMM and
    elementwise work) and what the backward recomputes; the forward alone with ``ft.forward_only``."""
    net = params.network
    # tp_comm_overlap hides a share of the collectives, at most behind the GEMMs they pipeline with.
    exposed_tp = f.tp_comm - (min(net.tp_overlap * f.tp_comm, f.gemm) if ft.tp_comm_overlap else 0.0)
    full = 1.0 if ft.recompute == "full" else 0.0
    gather = tp_gather_bytes_ratio(lay, ft)
    forward_tp = (1.0 + gather) / 2  # two all-gathers at ``gather``, two reduce-scatters in bf16
    overhead = net.layer_overhead_s * (1.0 - graphed_overhead_share(ft, params, moe)) + (
        local_experts(ft, lay) * net.expert_overhead_s if moe else 0.0
    )
    if ft.forward_only:
        return {
            "gemm": f.gemm + f.adapter_gemm,
            "attention": f.attn,
            "elementwise": f.elem,
            "tp_comm": exposed_tp * forward_tp,
            "cp_comm": f.cp_comm,
            "ep_comm": f.ep_comm * (1.0 - net.ep_overlap),
            "overhead": overhead,
        }
    gemm_re, attn_re, elem_re = recompute_shares(shape, ft)
    passes = 2 if ft.lora_dim else 3  # a frozen weight: forward and input gradient, no weight gradient
    return {
        "gemm": f.gemm * (passes + gemm_re) + f.adapter_gemm * (3 + gemm_re),
        "attention": f.attn * (3 + attn_re),
        "elementwise": f.elem * (1 + elem_re) + f.elem_bwd,
        "tp_comm": exposed_tp
        * (forward_tp * (1 + full) + (1.0 - net.tp_bwd_overlap) * (1 + sp_regather_share(lay, ft) * gather)),
        "cp_comm": f.cp_comm * (3 + full),
        "ep_comm": f.ep_comm * (1.0 - net.ep_overlap) * (2 + full),
        "overhead": overhead * (3 + full),
    }


#: HBM bytes per logit (one vocabulary entry of one token on this TP rank) that Megatron-Core's
#: vocab-parallel cross-entropy moves, forward + backward, from the bf16 logits the output layer
#: writes to the bf16 gradient its backward GEMMs read. Each kernel reads and writes every element once.
CROSS_ENTROPY_BYTES: dict[str, float] = {
    # ``tensor_parallel/cross_entropy.py`` (megatron-core 0.16.1 and 0.19.2 alike), eager: forward
    # ``calculate_logits_max`` cast to fp32 (2 read + 4 write) and max (4), ``calculate_predicted_logits``
    # in-place subtract (4 + 4), exp (4 + 4) and sum (4), ``calculate_cross_entropy_loss`` softmax
    # divide (4 + 4); backward ``calculate_gradients`` grad scale (4 + 4; the one-hot subtract touches
    # one element per token) and autograd's cast of the fp32 gradient back to bf16 (4 + 2).
    "unfused": 38.0 + 14.0,
    # ``fusions/fused_cross_entropy.py``, the same functions under ``jit_fuser`` (``torch.compile`` for
    # torch >= 2.2, ``jit.py``), one Inductor kernel each: cast+max (2 + 4: the reduction reads the bf16
    # logits it casts), subtract+exp+sum (4 + 4), divide (4 + 4); backward ``calculate_gradients``
    # copies the saved softmax for the one-hot scatter (4 + 4), then scales it, casts it to bf16 and
    # writes the mutated fp32 softmax back (4 + 2 + 4). Inductor's generated code for the four
    # functions (torch 2.13, CPU) has exactly these passes, except that its CPU cast+max re-reads the
    # fp32 copy (10 instead of 6).
    "native": 6.0 + 8.0 + 8.0 + 18.0,
    # Transformer Engine's ``parallel_cross_entropy`` (``pytorch/triton/cross_entropy.py``):
    # ``online_softmax_kernel`` reads the bf16 logits (2), ``cross_entropy_kernel`` reads them again and
    # writes the bf16 gradient in place (2 + 2); backward ``element_mul_kernel`` scales it by the
    # per-token loss gradient (2 + 2; Megatron-Core's loss is per token, never the scalar 1 it skips).
    "te": 2.0 + 4.0 + 4.0,
}


def cross_entropy_bytes(path: str) -> float:
    """HBM bytes per logit of the cross-entropy ``path`` (``unfused``, ``native`` or ``te``)."""
    if path not in CROSS_ENTROPY_BYTES:
        raise ValueError(
            f"model.cross_entropy_fusion_impl: {path!r} is not one of native, te; "
            "set model.cross_entropy_fusion_impl=native"
        )
    return CROSS_ENTROPY_BYTES[path]


def logits_time(shape: ModelShape, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams) -> float:
    """Output layer of one micro-batch on the last stage: the logits GEMM (x3) and the cross-entropy's
    HBM traffic (``CROSS_ENTROPY_BYTES`` of the run's path). The output layer is Megatron-Core's own
    ``ColumnParallelLinear``, outside Transformer Engine's FP8 autocast: its GEMM runs in bf16 even in
    FP8/FP4 runs."""
    eff = params.for_family(hw.family)
    tok = ft.mbs * shape.seq / lay.cp
    # the bf16 peak outside FP8 (what _peak gives a bf16 run), without copying ``ft``: a hot path of the fit
    peak = hw.peak_flops["bf16"] if ft.precision in ("fp8", "fp4") else _peak(hw, ft, eff)
    passes = 2 if ft.lora_dim else 3  # LoRA freezes the output layer: no weight gradient
    t = passes * gemm_time(tok, shape.vocab / lay.tp, shape.hidden, 1, peak, eff)
    logits = tok * shape.vocab / lay.tp
    return t + logits * cross_entropy_bytes(ft.cross_entropy) / (hw.hbm_bandwidth * eff.hbm_efficiency)


def predict_step_time(
    shape: ModelShape,
    lay: Layout,
    ft: Features,
    hw: Hardware,
    params: PerfModelParams = FITTED,
    params_per_gpu: float | None = None,
) -> StepTime:
    """Predicted step time of ``lay`` for ``shape`` on ``hw``; ``params_per_gpu`` defaults to a dense estimate.

    The pipeline runs at the pace of its slowest stage: the one with the most layers, or the last
    stage when the output layer makes it slower.
    """
    per_layer: dict[str, float] = {}
    t_layer = stage_microbatch_time(shape, lay, ft, hw, params, 1.0, per_layer)
    stages = lay.stage_layers or (shape.layers / lay.pp,) * lay.pp
    if ft.forward_only:  # the logits GEMM's forward, and a third of the cross-entropy's traffic (frozen or not)
        logits = logits_time(shape, lay, replace(ft, lora_dim=0), hw, params) / 3
    else:
        logits = logits_time(shape, lay, ft, hw, params)
    widest = max(stages[:-1]) if lay.pp > 1 else 0.0
    last_bound = stages[-1] * t_layer + logits >= widest * t_layer
    slow_layers = stages[-1] if last_bound else widest
    t_slow = slow_layers * t_layer + (logits if last_bound else 0.0)
    m = microbatches(lay, ft)
    parts = {k: v * slow_layers * m for k, v in per_layer.items()}
    parts["logits"] = logits * m if last_bound else 0.0
    # Each run of the schedule fills and drains the pipeline once.
    bubble = (lay.pp - 1) / lay.virtual_stages * max(stages) * t_layer * ft.pipeline_flushes
    p2p = pipeline_p2p(shape, lay, ft, hw, params) * (m * lay.virtual_stages + (lay.pp - 1) * ft.pipeline_flushes)
    if ft.forward_only:
        p2p /= 2  # activations forward, no gradients back
    parts["bubble"] = bubble
    parts["pp_p2p"] = p2p
    compute = m * t_slow + bubble + p2p
    n_params = params_per_gpu if params_per_gpu is not None else dense_params_per_gpu(shape, lay, ft, max(stages))
    # what is reduced, stepped and zeroed: every parameter, or with LoRA the adapters only
    trained = lora_params_per_gpu(shape, lay, ft, max(stages)) if ft.lora_dim else n_params
    if ft.forward_only:  # no gradient reduce, no optimizer step, no parameter pass
        parts.update(dp_comm=0.0, optimizer=0.0, param_passes=0.0)
    elif ft.fsdp_reshard_after_forward:
        parts["dp_comm"] = dp_comm_fsdp(shape, n_params, lay, ft, hw, params, t_slow, m)
    else:
        parts["dp_comm"] = dp_comm(trained, lay, ft, hw, params, t_slow)
    if not ft.forward_only:
        parts["optimizer"] = optimizer_time(trained, lay, ft, hw, params)
        parts["param_passes"] = param_passes_time(
            n_params, shape.vocab * shape.hidden / lay.tp, ft, hw, params, trained=trained
        )
    parts["straggler"] = (m * t_slow + bubble) * params.network.gpu_speed_spread * expected_slowest(lay.world_size)
    total = compute + parts["dp_comm"] + parts["optimizer"] + parts["param_passes"] + parts["straggler"]
    return StepTime(total_s=total, breakdown=parts)


def expected_slowest(n: int) -> float:
    """Expected largest of ``n`` standard normal draws (Blom's approximation), 0 for one GPU: a step
    waits for its slowest GPU, ``gpu_speed_spread`` times this much slower than the mean one."""
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25)) if n > 1 else 0.0


def pipeline_p2p(shape: ModelShape, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams) -> float:
    """Exposed send+receive time of one micro-batch's activations and gradients at a stage boundary."""
    if not lay.pp_enabled:
        return 0.0
    tok = ft.mbs * shape.seq / lay.cp
    # Each TP rank sends its 1/TP slice (sequence parallelism, or SC21's scatter/gather optimisation).
    volume = 2 * tok * shape.hidden * ACT_BYTES / lay.tp
    span = lay.pp_stride * 2  # neighbouring stages sit pp_stride ranks apart (TP x CP (x DP) in the rank order)
    exposed = 1.0 - (params.network.p2p_overlap if ft.overlap_p2p_comm else 0.0)
    regather = volume * (lay.tp - 1) / ring_bandwidth(1, lay.tp, hw, params)  # all-gather of the slices in TP
    send = volume / min(neighbour_bandwidth(span, hw, params), pod_bandwidth(lay.pp_stride, lay.pp, hw, params))
    return (send + regather + 2 * params.network.p2p_latency_s) * exposed


def dense_params_per_gpu(shape: ModelShape, lay: Layout, ft: Features, stage_layers: float | None = None) -> float:
    """Parameters held by one GPU of a stage with ``stage_layers`` layers (default layers / PP): matrices
    / TP, experts / (EP x ETP), plus the embedding."""
    h, q, kv = shape.hidden, shape.kv_channels * shape.heads, shape.kv_channels * shape.query_groups
    mats = 3 if shape.gated else 2
    attn = (h * (q + 2 * kv) + q * h) / lay.tp
    n_moe = moe_count(shape.moe_layers)
    dense = (shape.layers - n_moe) * (attn + mats * h * shape.ffn / lay.tp)
    moe_ffn = shape.moe_ffn or shape.ffn
    experts = ft.num_experts / lay.ep
    moe = n_moe * (attn + mats * h * (moe_ffn * experts / lay.etp + shape.shared_ffn / lay.tp))
    per_layer = (dense + moe) / shape.layers
    return per_layer * (stage_layers if stage_layers is not None else shape.layers / lay.pp) + shape.vocab * h / lay.tp


def dp_comm(
    n_params: float, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams, t_microbatch: float
) -> float:
    """Exposed gradient reduce (and parameter all-gather) over DP x CP ranks; none without a trained parameter
    (LoRA whose targets name no module).

    ``t_microbatch`` is one micro-batch through the stage (forward + backward). Without overlap the whole
    collective is exposed. With ``overlap_grad_reduce`` / ``overlap_param_gather`` each model chunk's share
    hides behind the compute that runs after its gradients are ready (before its weights are needed):
    ``chunk_queue_exposed``. At least one bucket of the first chunk is always exposed: the last to reduce,
    the first to gather."""
    group = lay.dp_cp
    if group == 1 or n_params <= 0:
        return 0.0
    bw = ring_bandwidth(lay.dp_cp_stride, group, hw, params)  # TP fastest, then CP, (PP,) DP
    frac = (group - 1) / group
    if ft.distributed_optimizer:
        reduce = frac * n_params * ft.grad_bytes / bw
        gather = frac * n_params * ACT_BYTES / bw
    else:
        reduce, gather = 2 * frac * n_params * ft.grad_bytes / bw, 0.0
    overlap = params.network.dp_overlap
    edge = min(dp_bucket_params(group), n_params / lay.virtual_stages) / n_params
    exposed_reduce = reduce
    if ft.overlap_grad_reduce:
        queue = chunk_queue_exposed(reduce, overlap * t_microbatch * 2 / 3, lay.virtual_stages, lay.pp)
        exposed_reduce = max(edge * reduce, queue)
    exposed_gather = gather
    if ft.overlap_param_gather:
        queue = chunk_queue_exposed(gather, overlap * t_microbatch / 3, lay.virtual_stages, lay.pp)
        exposed_gather = max(edge * gather, queue)
    return exposed_reduce + exposed_gather


def chunk_queue_exposed(work: float, window: float, chunks: int, pp: int) -> float:
    """Exposed part of a DP collective of ``work`` seconds on the first pipeline stage, overlapped chunk
    by chunk with the passes (``window``: the hideable part of one micro-batch's backward, or forward,
    through the whole stage).

    The first pipeline stage finishes its backward last and starts its forward first, so its collectives
    are the ones on the critical path (Megatron-Core buckets only the first stage's gradients for this
    reason: ``DistributedDataParallel.__init__`` at core_v0.8.0, "data-parallel communication on these
    stages is not on the critical path"). Interleaved 1F1B runs each chunk for a group of ``pp``
    micro-batches in turn (``microbatch_group_size_per_vp_stage``, default PP): chunk ``c``'s last backward
    ends ``c · pp`` chunk-passes before the step's last one, and its reduce-scatter starts then
    (``register_grad_ready`` -> ``start_grad_sync`` per bucket; later chunks are one bucket each at
    core_v0.8.0, bucketed like the first today); chunk ``c``'s first forward starts ``c · pp``
    chunk-passes after the first, and its all-gather must be done by then (forward pre-hooks wait on
    each bucket's handle). The chunks' collectives run one after another on the DP communicator, a
    queue: the exposed time is the queue's worst lateness, ``max_c((c + 1) · w − c · pp · t)`` with
    ``w = work / chunks`` and ``t = window / chunks`` (chunk 0's own bucketed overlap gives it ``t``).
    Without interleaving (one chunk) that is the work less one micro-batch's pass."""
    w, t = work / chunks, window / chunks
    lateness = [(c + 1) * w - (c * pp * t if c else t) for c in range(chunks)]
    return max(0.0, *lateness)


def dp_comm_fsdp(
    shape: ModelShape,
    n_params: float,
    lay: Layout,
    ft: Features,
    hw: Hardware,
    params: PerfModelParams,
    t_microbatch: float,
    m: int,
) -> float:
    """Exposed PyTorch FSDP2 traffic of one step (``fsdp_reshard_after_forward``; ``n_params`` as for
    ``dp_comm``, the output layer added when untied).

    Every micro-batch gathers each block before its forward, again before its backward (every block
    but the last, which torchtitan's ``apply_fsdp`` does not reshard; ``parallelize_llama.py`` at
    e7c0cae) and reduce-scatters its gradients (in ``ft.grad_bytes``: torchtitan's
    ``mixed_precision_reduce = "float32"``). The blocks' traffic hides behind the pass it prefetches
    for (``dp_overlap`` of it); the root unit (embedding, final norm, output layer) cannot: FSDP2
    gathers it before anything else runs, keeps it for the backward (``_fsdp_state.py``
    ``_lazy_init``: the root is never resharded after forward) and reduce-scatters it after the last
    backward kernel. Block weights travel in FP8 with ``fp8_param_gather``, the root in bf16."""
    group = lay.dp_cp
    if group == 1:
        return 0.0
    bw = ring_bandwidth(lay.dp_cp_stride, group, hw, params)
    frac = (group - 1) / group
    root = shape.vocab * shape.hidden / lay.tp * (1 if shape.tied_embeddings else 2)
    total = n_params + (0 if shape.tied_embeddings else shape.vocab * shape.hidden / lay.tp)
    blocks = max(0.0, total - root)
    w_bytes = 1 if ft.fp8_param_gather and ft.precision == "fp8" else ACT_BYTES
    gather = frac * blocks * w_bytes / bw
    regather = gather * (shape.layers - 1) / shape.layers
    reduce_blocks = frac * blocks * ft.grad_bytes / bw
    net = params.network
    forward = frac * root * ACT_BYTES / bw + max(0.0, gather - net.dp_overlap * t_microbatch / 3)
    backward = frac * root * ft.grad_bytes / bw + max(
        0.0, regather + reduce_blocks - net.dp_overlap * t_microbatch * 2 / 3
    )
    return m * (forward + backward)


def dp_bucket_params(dp_cp: int) -> float:
    """Parameters per gradient bucket: Megatron-Core's default ``max(40M, 1M x DP)`` (larger DP, larger
    buckets, so that each ring reduce stays bandwidth-bound); later model chunks are one bucket each."""
    return max(40e6, 1e6 * dp_cp)


def optimizer_time(n_params: float, lay: Layout, ft: Features, hw: Hardware, params: PerfModelParams) -> float:
    """Adam step: ~32 bytes of HBM traffic per parameter (fp32 param, grad, two moments; bf16 copy)."""
    shard = n_params / lay.dp_cp if ft.distributed_optimizer else n_params
    return shard * 32 / (hw.hbm_bandwidth * params.for_family(hw.family).hbm_efficiency)


#: HBM bytes per GEMM weight element of Transformer Engine's FP8 weight cache refresh: the fused
#: cast-transpose reads the bf16 weight (2) and writes the FP8 weight and its transpose (1 + 1; MXFP8's
#: rowwise and columnwise copies alike, their block scales 1/32 of that).
FP8_WEIGHT_CAST_BYTES = 4.0

#: Extra HBM bytes per weight element with current (``tensorwise``) scaling: the weight's amax is read
#: in a pass of its own before the cast (2).
FP8_CURRENT_AMAX_BYTES = 2.0


def param_passes_time(
    n_params: float,
    embedding: float,
    ft: Features,
    hw: Hardware,
    params: PerfModelParams,
    trained: float | None = None,
) -> float:
    """Once-per-step HBM passes over the GPU's ``n_params`` parameters besides the optimizer's, seconds.

    * Megatron-Core zeroes the gradient buffer (``grad_bytes`` per parameter, the whole local buffer, not
      the optimizer's shard) before each step: ``DistributedDataParallel.zero_grad_buffer`` ->
      ``_ParamAndGradBuffer.reset`` -> ``grad_data.zero_()`` (``megatron/core/distributed/``
      ``distributed_data_parallel.py`` and ``param_and_grad_buffer.py``, megatron-core 0.16.1). PyTorch
      FSDP2 (``fsdp_reshard_after_forward``) frees its sharded gradients instead (``set_to_none``).
    * FP8/FP4 runs cast every GEMM weight (all but the ``embedding`` parameters: the output layer stays
      bf16, ``logits_time``) to FP8 once per step and reuse the cached copy and its transpose for the
      step's later micro-batches: Megatron-Core's schedules call ``set_is_first_microbatch`` on the first
      micro-batch of each model chunk (``pipeline_parallel/schedules.py``, ``transformer/module.py``,
      0.16.1) and ``TELinear.forward`` passes ``is_first_microbatch`` to Transformer Engine
      (``extensions/transformer_engine.py``), whose ``Linear.forward`` then "allows caching of the FP8
      versions of the weights" (``transformer_engine/pytorch/module/linear.py`` at 0004dbd0). torchao's
      ``Float8Linear`` (``float8_converter``) keeps no cache: its per-micro-batch weight casts are not
      counted (``fp8_cast_bytes``).

    ``trained``: the parameters with a gradient buffer (LoRA's adapters; default all ``n_params``)."""
    hbm = hw.hbm_bandwidth * params.for_family(hw.family).hbm_efficiency
    zero = 0.0 if ft.fsdp_reshard_after_forward else (n_params if trained is None else trained) * ft.grad_bytes
    cast = 0.0
    if ft.precision in ("fp8", "fp4") and not ft.float8_converter:
        per_weight = FP8_WEIGHT_CAST_BYTES + (FP8_CURRENT_AMAX_BYTES if ft.fp8_recipe == "tensorwise" else 0.0)
        cast = max(0.0, n_params - embedding) * per_weight
    return (zero + cast) / hbm
