"""The cluster model: accelerator specs, and where Megatron-Core puts each rank.

GPU table: vendor datasheet *dense* peak FLOP/s (no 2:4 sparsity) per dtype, device memory as the
driver reports it (MiB, e.g. ``nvidia-smi``), HBM bandwidth, NVLink bandwidth per GPU (one
direction, half the datasheet's bidirectional figure) and the default NVLink domain size.

``cpu`` is the entry for local CPU ranks (gloo): its figures are nominal, not measured
(50 GFLOP/s per rank in fp32 and bf16; 8 GiB of memory per rank), so estimates on CPU ranks say
how a layout scales rather than what a given machine does.

Placement: ranks fill nodes in order (node ``r // gpus_per_node``, NVLink domain
``r // nvlink_domain_size``, network pod ``r // pod_gpus``), and a rank's coordinates follow
Megatron-Core's default order ``tp-cp-ep-dp-pp`` (``parallel_state.initialize_model_parallel(order=
"tp-cp-ep-dp-pp")``): TP is the fastest-varying index, then CP, then DP, then PP; or, with
``parallel.use_tp_pp_dp_mapping`` (Megatron-LM ``megatron/training/initialize.py`` at 00c2c0ad:
``order='tp-cp-ep-pp-dp'``), PP before DP. The expert groups use the same order with ``cp = 1``: ETP
fastest, then EP, then expert-DP and PP in the run's order. A process group of one dimension is the
set ``{offset + stride * i}``, with ``stride`` the product of the faster dimensions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MiB = 1 << 20
GiB = 1 << 30

#: Megatron-Core's default rank order (fastest first), 0.16.1 ``initialize_model_parallel``.
RANK_ORDER = ("tp", "cp", "ep", "dp", "pp")
#: The order Megatron-LM's ``--use-tp-pp-dp-mapping`` selects: data-parallel replicas outermost.
TP_PP_DP_ORDER = ("tp", "cp", "ep", "pp", "dp")


def rank_order(use_tp_pp_dp_mapping: bool) -> tuple[str, ...]:
    """The rank order (fastest first) ``initialize_model_parallel`` gets for this setting."""
    return TP_PP_DP_ORDER if use_tp_pp_dp_mapping else RANK_ORDER


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model."""

    name: str
    """Key in the table (``h100-sxm5-80gb``)."""
    vendor: str
    """``nvidia``, ``amd`` or ``cpu``."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s by dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``fp4``)."""
    hbm_bytes: int
    """Device memory in bytes."""
    hbm_bandwidth: float
    """Device memory bandwidth, bytes/s."""
    nvlink_bandwidth: float
    """NVLink (or Infinity Fabric) bandwidth per GPU, one direction, bytes/s."""
    nvlink_domain_size: int
    """GPUs that share one NVLink/NVSwitch domain in the usual system (DGX: 8, NVL72: 72)."""
    compute_capability: tuple[int, int] = (0, 0)
    """CUDA compute capability (8.0 Ampere, 9.0 Hopper, 10.0 Blackwell); (0, 0) when not CUDA."""
    note: str = ""
    """Where the figures come from."""

    @property
    def has_fp8(self) -> bool:
        """Whether the tensor cores run FP8 GEMMs."""
        return "fp8" in self.peak_flops

    @property
    def has_fp4(self) -> bool:
        """Whether the tensor cores run FP4 GEMMs."""
        return "fp4" in self.peak_flops

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype`` (``bf16``...); raises KeyError naming the known ones."""
        if dtype not in self.peak_flops:
            raise KeyError(f"{self.name} has no {dtype} peak (known: {', '.join(self.peak_flops)})")
        return self.peak_flops[dtype]


def _nv(
    name: str,
    bf16: float,
    fp8: float | None,
    fp4: float | None,
    fp32: float,
    tf32: float,
    mem_mib: int,
    hbm_bw: float,
    nvlink_bidir: float,
    domain: int,
    cc: tuple[int, int],
    note: str,
) -> GpuSpec:
    peaks = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": bf16}
    if fp8:
        peaks["fp8"] = fp8
    if fp4:
        peaks["fp4"] = fp4
    return GpuSpec(name, "nvidia", peaks, mem_mib * MiB, hbm_bw, nvlink_bidir / 2, domain, cc, note)


GPU_TABLE: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _nv(
            "a100-sxm4-40gb",
            312e12,
            None,
            None,
            19.5e12,
            156e12,
            40960,
            1.555e12,
            600e9,
            8,
            (8, 0),
            "NVIDIA A100 datasheet (dense)",
        ),
        _nv(
            "a100-sxm4-80gb",
            312e12,
            None,
            None,
            19.5e12,
            156e12,
            81920,
            2.039e12,
            600e9,
            8,
            (8, 0),
            "NVIDIA A100 datasheet (dense)",
        ),
        _nv(
            "h100-sxm5-80gb",
            989e12,
            1979e12,
            None,
            67e12,
            494.5e12,
            81559,
            3.35e12,
            900e9,
            8,
            (9, 0),
            "NVIDIA H100 SXM5 datasheet (dense)",
        ),
        _nv(
            "h100-pcie-80gb",
            756e12,
            1513e12,
            None,
            51e12,
            378e12,
            81559,
            2.0e12,
            600e9,
            2,
            (9, 0),
            "NVIDIA H100 PCIe datasheet (dense); NVLink bridge pairs",
        ),
        _nv(
            "h200-sxm-141gb",
            989e12,
            1979e12,
            None,
            67e12,
            494.5e12,
            143771,
            4.8e12,
            900e9,
            8,
            (9, 0),
            "NVIDIA H200 SXM datasheet (dense): H100 compute, 141 GB HBM3e",
        ),
        _nv(
            "b200-sxm-180gb",
            2.25e15,
            4.5e15,
            9e15,
            75e12,
            1.1e15,
            183359,
            8.0e12,
            1.8e12,
            8,
            (10, 0),
            "NVIDIA HGX B200 datasheet, per GPU (dense)",
        ),
        _nv(
            "gb200-nvl72",
            2.5e15,
            5e15,
            10e15,
            80e12,
            1.25e15,
            189471,
            8.0e12,
            1.8e12,
            72,
            (10, 0),
            "NVIDIA GB200 NVL72 datasheet, per GPU (dense)",
        ),
        GpuSpec(
            "mi300x",
            "amd",
            {"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307e12, "fp16": 1307e12, "fp8": 2615e12},
            192 * GiB,
            5.3e12,
            448e9,
            8,
            (0, 0),
            "AMD Instinct MI300X datasheet (dense)",
        ),
        GpuSpec(
            "cpu",
            "cpu",
            {"fp32": 50e9, "bf16": 50e9, "fp16": 50e9},
            8 * GiB,
            20e9,
            5e9,
            1,
            (0, 0),
            "nominal figures for one CPU rank (gloo), not a measurement",
        ),
    )
}


def gpu_spec(name: str) -> GpuSpec | None:
    """The table entry for ``name``, or ``None`` when the table has no such GPU."""
    return GPU_TABLE.get(name)


def cluster_hbm_bytes(hbm_bytes: int | None, gpu: str) -> int | None:
    """Memory per GPU: a cluster's own ``hbm_bytes``, else its GPU's in the table; ``None`` for an unknown GPU."""
    if hbm_bytes:
        return int(hbm_bytes)
    spec = gpu_spec(gpu)
    return spec.hbm_bytes if spec else None


DEVICE_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
"""The variable that limits a GPU to one hardware queue per device when set to ``1``."""


def one_device_connection(gpu: str, tp: int, cp: int) -> bool:
    """Whether the ranks need ``CUDA_DEVICE_MAX_CONNECTIONS=1``: TP or CP > 1 on any GPU not known to be an
    NVIDIA Blackwell or newer (compute capability >= 10); unknown and AMD GPUs included, as Megatron-LM
    asserts it for every device architecture below 10. TP/CP communication overlaps compute only when
    kernels are queued in issue order. The one rule: the launch plan sets it, the validator checks only
    a value the user sets against it."""
    spec = gpu_spec(gpu)
    if (tp <= 1 and cp <= 1) or (spec is not None and spec.vendor == "cpu"):
        return False
    return spec is None or spec.vendor != "nvidia" or spec.compute_capability < (10, 0)


def compute_dtype(bf16: bool, fp16: bool, fp8: str | None, fp4: str | None) -> str:
    """The dtype the GEMMs run in for these precision flags (the peak an MFU divides by)."""
    if fp4:
        return "fp4"
    if fp8:
        return "fp8"
    if bf16:
        return "bf16"
    if fp16:
        return "fp16"
    return "fp32"


# --- placement ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupPlacement:
    """Where the process groups of one parallel dimension sit."""

    name: str
    """Group name (``tp``, ``cp``, ``ep``, ``etp``, ``dp``, ``expert_dp``, ``pp``, ``tp_cp``...)."""
    size: int
    """Ranks per group."""
    stride: int
    """Rank distance between consecutive members (product of the faster dimensions)."""
    within_node: bool
    """Every group of this kind lies inside one node."""
    within_nvlink: bool
    """Every group of this kind lies inside one NVLink domain."""
    within_pod: bool = True
    """Every group of this kind lies inside one network pod (``cluster.pod_gpus``; always without pods)."""

    @property
    def scope(self) -> str:
        """``nvlink`` (inside one NVLink domain), ``node`` (inside a node, across domains) or ``network``."""
        if self.size <= 1 or self.within_nvlink:
            return "nvlink"
        return "node" if self.within_node else "network"


def groups_cross(size: int, stride: int, unit: int, world: int) -> bool:
    """Whether some group ``{offset + stride*i, i < size}`` spans two units of ``unit`` ranks.

    Groups tile the world in aligned blocks of ``stride * size`` ranks. With ``size >= 2`` a group
    crosses a unit boundary exactly when some boundary falls strictly inside a block, i.e. when a
    multiple of ``unit`` below ``world`` is not a multiple of the block.
    """
    if size <= 1 or unit <= 0 or world <= unit:
        return False
    block = stride * size
    return unit % block != 0


def place_group(
    name: str, size: int, stride: int, world: int, gpus_per_node: int, domain: int, pod: int = 0
) -> GroupPlacement:
    """Placement of one group kind on nodes of ``gpus_per_node``, NVLink domains of ``domain`` and network
    pods of ``pod`` GPUs (0: no pods)."""
    return GroupPlacement(
        name=name,
        size=size,
        stride=stride,
        within_node=not groups_cross(size, stride, gpus_per_node, world),
        within_nvlink=not groups_cross(size, stride, domain, world),
        within_pod=not groups_cross(size, stride, pod, world),
    )


def rank_coordinates(rank: int, sizes: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Coordinates of ``rank`` for dimensions ``sizes`` given fastest first (Megatron-Core order)."""
    out: dict[str, int] = {}
    for name, n in sizes:
        out[name] = rank % n
        rank //= n
    return out


def ep_peers_on_node(ep: int, etp: int, gpus_per_node: int) -> int:
    """EP peers (self included) that share a rank's node: EP members sit ``etp`` ranks apart."""
    if ep <= 1:
        return 1
    return max(1, min(ep, gpus_per_node // max(1, etp)))
