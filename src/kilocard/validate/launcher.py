"""Rules on the launch: launcher kind, local rank count, CUDA_DEVICE_MAX_CONNECTIONS."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.topology import DEVICE_CONNECTIONS_ENV, one_device_connection
from kilocard.validate.issues import Issue, error, warning

L = "launcher."
KINDS = ("local", "slurm")
CDMC = DEVICE_CONNECTIONS_ENV


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
    """Where ``topology.one_device_connection`` asks for CUDA_DEVICE_MAX_CONNECTIONS=1 (the launch plan sets
    it), a value the user sets in cluster.env or launcher.env (which override the plan's) must be 1."""
    if not one_device_connection(cfg.cluster.gpu, lay.tp, lay.cp):
        return
    field = ("launcher.env." if CDMC in cfg.launcher.env else "cluster.env.") + CDMC
    value = {**cfg.cluster.env, **cfg.launcher.env}.get(CDMC)
    if value is None or str(value) == "1":
        return  # unset: the launch plan sets it to 1
    why = (
        f"tp({lay.tp}) / cp({lay.cp}) > 1 on {cfg.cluster.gpu}: kernels must be queued in issue order "
        "so the TP/CP communication overlaps (kilocard's launch sets 1 unless overridden)"
    )
    make = error if cfg.parallel.tp_comm_overlap else warning
    yield make(CDMC, field, value, f"{CDMC}={value}; {why}", f"set {field}=1, or remove it")


RULES = (rule_launcher_kind, rule_cuda_device_max_connections)
