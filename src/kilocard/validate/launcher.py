"""Rules on the launch: launcher kind, local rank count, CUDA_DEVICE_MAX_CONNECTIONS."""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.topology import DEVICE_CONNECTIONS_ENV, one_device_connection
from kilocard.validate.issues import Issue, error, warning

L = "launcher."
CDMC = DEVICE_CONNECTIONS_ENV


def rule_launcher_kind(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """A local launch is one node with nproc = world size (warnings); that the launcher is local or slurm is the
    domain table's ``LAUNCHER_KIND``."""
    la = cfg.launcher
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


RANKS_PER_CORE = 2
"""CPU ranks (gloo processes, each with torch's own threads) one core may carry: the test suite runs 4 on 2."""


def rule_cpu_ranks(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``CPU_RANKS``: CPU ranks per node at most ``RANKS_PER_CORE`` x the profile's ``cluster.cpus_per_node``
    (``gpus_per_node=1000`` of ``cpu`` started a thousand torch processes on a 2-core node)."""
    c = cfg.cluster
    if c.gpu != "cpu" or c.gpus_per_node <= RANKS_PER_CORE * c.cpus_per_node:
        return
    yield error(
        "CPU_RANKS",
        "cluster.gpus_per_node",
        c.gpus_per_node,
        f"{c.gpus_per_node} CPU ranks per node on cluster.cpus_per_node={c.cpus_per_node} cores: at most "
        f"{RANKS_PER_CORE} ranks per core ({RANKS_PER_CORE * c.cpus_per_node})",
        f"set cluster.gpus_per_node (or --nproc) to at most {RANKS_PER_CORE * c.cpus_per_node}, or "
        "cluster.cpus_per_node to the node's cores",
    )


def local_core_issues(cfg: RunConfig, cores: int | None) -> list[Issue]:
    """``CPU_RANKS`` for a run whose CPU ranks start on this machine of ``cores`` cores (``os.cpu_count()``;
    the profile's ``cpus_per_node`` describes the cluster, not necessarily this machine)."""
    ranks = cfg.cluster.gpus_per_node
    if cfg.cluster.gpu != "cpu" or cores is None or ranks <= RANKS_PER_CORE * cores:
        return []
    return [
        error(
            "CPU_RANKS",
            "launcher.nproc",
            ranks,
            f"{ranks} CPU ranks on this machine's {cores} cores: at most {RANKS_PER_CORE} ranks per core "
            f"({RANKS_PER_CORE * cores})",
            f"--nproc {RANKS_PER_CORE * cores} or fewer, or `kilocard sbatch` to a cluster",
        )
    ]


RULES = (rule_launcher_kind, rule_cuda_device_max_connections, rule_cpu_ranks)
