"""The step-time model's physical parameters: how close real kernels and collectives come to peak.

Each value is fitted once on ``baselines/published.yaml`` by ``scripts/fit_perf_model.py`` (or,
where no published row constrains it, fixed from a stated measurement) and is the same for every
run: there is no per-run correction. ``docs/perf_model.md`` lists the values and where they come from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class GpuEfficiency:
    """How a GPU family's kernels approach its datasheet peaks."""

    gemm_efficiency: float
    """Fraction of the dense bf16/fp16 peak a large GEMM sustains (cuBLAS, clocks under load)."""
    fp8_gemm_ratio: float
    """FP8 GEMM efficiency relative to bf16 (the fraction of the FP8 peak is this times gemm_efficiency)."""
    mxfp8_gemm_ratio: float
    """Speed of a block-scaled (MXFP8, one scale per 32 elements) FP8 GEMM relative to a tensor-scaled one."""
    gemm_knee: float
    """GEMM dimension (elements) at which a GEMM reaches half its efficiency from that dimension alone:
    each of M, N, K adds ``knee / dim`` to the time of its FLOPs (tiles, waves, operand traffic)."""
    flash_attention_efficiency: float
    """Fraction of the bf16 peak the fused (flash) attention core sustains, forward and backward."""
    hbm_efficiency: float
    """Fraction of the HBM bandwidth that elementwise kernels (norms, activations, softmax) sustain."""
    fa2_attention_ratio: float = 1.0
    """Speed of FlashAttention-2 kernels (Megatron-Core ``attention_backend: flash``; PyTorch SDPA's
    flash backend) relative to the fused cuDNN attention that Transformer Engine selects on Hopper and
    later (``auto``/``fused``), whose speed ``flash_attention_efficiency`` is fitted to. Stated, not
    fitted: Hopper 0.62 from FlashAttention-3 (Shah et al., arXiv 2407.08608) Figures 5 and 6 on H100
    SXM5, head dim 128, sequence 8k (forward, causal: FA2 333 vs cuDNN 529 TFLOP/s; backward: 318 vs
    518), the backward weighted 2.5x the forward as the paper counts FLOPs; 1.0 (no measurement)
    elsewhere."""


@dataclass(frozen=True)
class NetworkEfficiency:
    """How collectives approach the link bandwidth, and how much of them hides behind compute."""

    nvlink_efficiency: float
    """Achieved bus bandwidth of NCCL collectives inside an NVLink domain, over the link bandwidth."""
    network_efficiency: float
    """Achieved bus bandwidth of collectives across nodes, over the per-GPU NIC bandwidth."""
    tp_overlap: float
    """Fraction of tensor-parallel communication hidden behind GEMMs with ``tp_comm_overlap``."""
    tp_bwd_overlap: float
    """Fraction of the backward TP collectives hidden behind weight-gradient GEMMs (always on)."""
    dp_overlap: float
    """Fraction of the backward (forward) time under which the gradient reduce (parameter gather)
    can hide when ``overlap_grad_reduce`` (``overlap_param_gather``) is on."""
    p2p_overlap: float
    """Fraction of pipeline send/receive time hidden with ``overlap_p2p_comm``."""
    ep_overlap: float
    """Fraction of the expert-parallel dispatch/combine all-to-alls hidden behind compute (shared-expert
    and attention work of the same or another micro-batch)."""
    layer_overhead_s: float
    """Fixed time per layer per micro-batch pass (kernel launches, synchronisation), seconds."""
    attn_overhead_share: float
    """Share of ``layer_overhead_s`` spent in a layer's attention block (norm, QKV, attention core, output
    projection): what a Transformer Engine CUDA graph of scope ``attn`` removes."""
    expert_overhead_s: float
    """Fixed time per local expert of an MoE layer per micro-batch pass, seconds: the per-expert kernels
    (one GEMM launch per expert and weight, per-expert FP8 quantisation) that do not shrink with the
    expert's tokens."""
    p2p_latency_s: float
    """Fixed time of one pipeline send/receive (launch, handshake, stream synchronisation), seconds."""
    gpu_speed_spread: float
    """Standard deviation of one GPU's compute speed over the fleet's mean (clocks under power and
    thermal limits, slower links): every step waits for the slowest of the run's GPUs. Stated, not
    fitted (the rows' loss is flat in it: 4.51% at 1%, 1.5% and 2%): Sinha et al. (SC22, "Not All GPUs
    Are Created Equal") measured an 8% average performance variation across the GPUs of one SKU in
    clusters of a few hundred to 27,648 GPUs, the range of N draws, about ``2 * z(N)`` standard
    deviations: 1.0% (27,648 GPUs) to 1.6% (256); the Llama 3 paper's 1-2% diurnal swing moves every
    GPU together and is not a spread."""


@dataclass(frozen=True)
class PerfModelParams:
    """Every parameter of the step-time model."""

    gpu: dict[str, GpuEfficiency]
    """Per GPU family (``ampere``, ``hopper``, ``blackwell``, ``cdna3``)."""
    network: NetworkEfficiency
    """Collectives and overlap."""

    def for_family(self, family: str) -> GpuEfficiency:
        """Efficiencies of ``family``; families without a published row use Hopper's (stated in the docs)."""
        return self.gpu.get(family, self.gpu["hopper"])


#: Fitted by scripts/fit_perf_model.py (the better of 3 starts from the previous values and a cold fit
#: with basin hops: the cold fit) on baselines/published.yaml (130 scored rows, the Megatron-LM README's
#: H100 table among them: mean |error| 4.41%, max 28.2%). Three values sit on a bound of their physical
#: range (gemm_knee 0, p2p_latency_s 1 ms, attn_overhead_share 1): docs/perf_model.md, Parameters. Not
#: fitted (stated values): the MXFP8 ratio of Ampere and Hopper and Ampere's FP8 ratio (no such GEMMs),
#: ampere flash_attention_efficiency (the A100 rows ran unfused attention), tp_bwd_overlap, dp_overlap,
#: p2p_overlap, fa2_attention_ratio, gpu_speed_spread (Sinha et al., above). Families without a row use
#: Hopper's values.
#: docs/perf_model.md lists each value and the rows that set it.
FITTED = PerfModelParams(
    gpu={
        "ampere": GpuEfficiency(
            gemm_efficiency=0.8709,
            fp8_gemm_ratio=1.0,
            mxfp8_gemm_ratio=1.0,
            gemm_knee=0.0,
            flash_attention_efficiency=0.50,
            hbm_efficiency=0.7744,
        ),
        "hopper": GpuEfficiency(
            gemm_efficiency=0.6738,
            fp8_gemm_ratio=0.8935,
            mxfp8_gemm_ratio=1.0,
            gemm_knee=0.0,
            flash_attention_efficiency=0.5466,
            hbm_efficiency=0.6922,
            fa2_attention_ratio=0.62,
        ),
        "blackwell": GpuEfficiency(
            gemm_efficiency=0.6211,
            fp8_gemm_ratio=0.8946,
            mxfp8_gemm_ratio=0.9341,
            gemm_knee=0.0,
            flash_attention_efficiency=0.3687,
            hbm_efficiency=0.6922,
        ),
    },
    network=NetworkEfficiency(
        nvlink_efficiency=0.4822,
        network_efficiency=0.9472,
        tp_overlap=0.628,
        tp_bwd_overlap=0.5,
        dp_overlap=0.9,
        p2p_overlap=0.8,
        ep_overlap=0.2467,
        layer_overhead_s=0.0002921,
        attn_overhead_share=0.998,
        expert_overhead_s=7.634e-05,
        p2p_latency_s=0.001,
        gpu_speed_spread=0.015,
    ),
)


#: The range each fitted parameter may take: no kernel or link sustains its datasheet rate, a GEMM
#: knee beyond 512 would make every real GEMM memory-bound, a pipeline send's fixed cost stays under 1 ms;
#: a collective across nodes reaches at most 95% of the NIC (nccl-tests' bus bandwidth over one 400 Gb/s
#: NIC per GPU on a rail-optimised fabric, where each GPU's data-parallel ring leaves its node through its
#: own NIC); the GPU speed spread stays within what Sinha et al. (SC22) measured (its 8% average and 22%
#: largest variation over a few hundred to 27,648 GPUs: 0.5% to 2.5%). scripts/fit_perf_model.py prints
#: each fitted value with its range and says which sit on a bound.
PHYSICAL_RANGES: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.4, 0.95),
    "gemm_knee": (0.0, 512.0),
    "flash_attention_efficiency": (0.2, 0.8),
    "hbm_efficiency": (0.5, 0.9),
    "nvlink_efficiency": (0.3, 0.9),
    "network_efficiency": (0.3, 0.95),
    "tp_overlap": (0.0, 0.95),
    "p2p_latency_s": (0.0, 0.001),
    "gpu_speed_spread": (0.005, 0.025),
    "fp8_gemm_ratio": (0.5, 1.0),
    "mxfp8_gemm_ratio": (0.5, 1.0),
    "tp_bwd_overlap": (0.0, 1.0),
    "dp_overlap": (0.0, 1.0),
    "p2p_overlap": (0.0, 1.0),
    "ep_overlap": (0.0, 0.95),
    "layer_overhead_s": (0.0, 1e-3),
    "expert_overhead_s": (0.0, 1e-3),
    "fa2_attention_ratio": (0.3, 1.0),
    "attn_overhead_share": (0.0, 1.0),
}


def flat(params: PerfModelParams) -> dict[str, float]:
    """``{"hopper.gemm_efficiency": 0.75, "network.tp_overlap": 0.7, ...}``: every parameter by name."""
    out = {f"{fam}.{f.name}": getattr(eff, f.name) for fam, eff in params.gpu.items() for f in fields(eff)}
    out.update({f"network.{f.name}": getattr(params.network, f.name) for f in fields(params.network)})
    return out


def with_values(params: PerfModelParams, values: dict[str, float]) -> PerfModelParams:
    """A copy of ``params`` with the named values (``flat`` names) replaced."""
    gpu = dict(params.gpu)
    network = params.network
    for name, value in values.items():
        group, _, field_name = name.partition(".")
        if group == "network":
            network = replace(network, **{field_name: value})
        elif group in gpu:
            gpu[group] = replace(gpu[group], **{field_name: value})
        else:
            raise KeyError(f"unknown performance-model parameter {name!r}")
    return PerfModelParams(gpu=gpu, network=network)
