"""Rules on the launch: launcher kind, local rank count, CUDA_DEVICE_MAX_CONNECTIONS."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.topology import gpu_spec
from kilocard.validate.issues import Issue, error, warning

L = "launcher."
KINDS = ("local", "slurm")
CDMC = "CUDA_DEVICE_MAX_CONNECTIONS"


def rule_launcher_kind(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """The launcher is local or slurm; a local launch is one node with nproc = world size (warnings)."""
    la = cfg.launcher
    if la.kind not in KINDS:
        yield error(
            "LAUNCHER_KIND",
            L + "kind",
            la.kind,
            f"launcher {la.kind!r} is not one of {', '.join(KINDS)}",
            f"set {L}kind=local or slurm",
        )
        return
    if la.kind != "local":
        return
    if lay.nodes > 1:
        yield warning(
            "LOCAL_MULTI_NODE",
            L + "kind",
            la.kind,
            f"the local launcher runs one node, but cluster.nodes({lay.nodes}): `kilocard run` cannot start it",
            "set launcher=slurm (what `kilocard sbatch` uses), or cluster.nodes=1",
        )
    elif la.nproc != lay.world_size:
        yield warning(
            "LOCAL_NPROC",
            L + "nproc",
            la.nproc,
            f"launcher.nproc({la.nproc}) != world size {lay.nodes} nodes * {lay.gpus_per_node} GPUs = {lay.world_size}",
            f"set cluster.gpus_per_node={la.nproc} (the world size comes from the cluster)",
        )


def rule_cuda_device_max_connections(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Before Blackwell, TP > 1 or CP > 1 wants CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron-LM asserts it)."""
    gpu = gpu_spec(cfg.cluster.gpu)
    if gpu is None or gpu.vendor != "nvidia" or gpu.compute_capability >= (10, 0) or (lay.tp == 1 and lay.cp == 1):
        return
    env = {**cfg.cluster.env, **cfg.launcher.env}
    value = env.get(CDMC)
    field = ("launcher.env." if CDMC in cfg.launcher.env else "cluster.env.") + CDMC
    why = (
        f"tp({lay.tp}) / cp({lay.cp}) > 1 on {gpu.name}: "
        "kernels must be queued in issue order so the TP/CP communication overlaps"
    )
    if value is None:
        yield warning(
            "CUDA_DEVICE_MAX_CONNECTIONS",
            field,
            None,
            f"{CDMC} is not set; {why}",
            f"add +launcher.env.{CDMC}=1 (kilocard's launch scripts also set it)",
        )
    elif str(value) != "1":
        make = error if cfg.parallel.tp_comm_overlap else warning
        yield make("CUDA_DEVICE_MAX_CONNECTIONS", field, value, f"{CDMC}={value}; {why}", f"set {field}=1")


RULES = (rule_launcher_kind, rule_cuda_device_max_connections)
