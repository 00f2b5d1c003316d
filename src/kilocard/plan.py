"""LaunchPlan: how many processes go where and with which environment; the one source for launchers.

The Slurm renderer and the local launcher both read a ``LaunchPlan``; neither decides a process
count or an environment variable on its own. The plan is pure: it reads the config only (never the
environment), and it never changes a parallel size.

Environment, lowest precedence first:
  1. layout-driven defaults (``CUDA_DEVICE_MAX_CONNECTIONS=1`` where ``topology.one_device_connection``
     says so: TP or CP > 1 on any GPU but a known Blackwell or newer, so kernels are issued in the
     order Megatron-Core's communication overlap relies on; NCCL error handling;
     the CUDA caching-allocator setting; ``OMP_NUM_THREADS`` per rank),
  2. ``cluster.env`` (site settings: NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...),
  3. ``launcher.env`` (this job).
Secrets are never values in the plan: ``launcher.secret_env`` lists variable NAMES that are passed
through from the submitting environment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout, compute_layout
from kilocard.topology import DEVICE_CONNECTIONS_ENV, one_device_connection

CPU_GPU = "cpu"
#: The caching-allocator setting for GPU ranks: fewer fragmentation OOMs at large scale.
CUDA_ALLOC_CONF = "expandable_segments:True"


@dataclass(frozen=True)
class LaunchPlan:
    """Processes, placement and environment of one training job."""

    nodes: int
    """Nodes the job spans (cluster.nodes)."""
    tasks_per_node: int
    """Ranks per node: one per GPU (on ``gpu: cpu`` clusters, one per CPU rank slot)."""
    world_size: int
    """nodes * tasks_per_node: the layout's world size (``kilocard.layout.world_size``)."""
    cpus_per_task: int
    """CPU cores per rank: cluster.cpus_per_node // tasks_per_node (at least 1)."""
    gpus_per_node: int
    """GPUs to request per node; 0 on ``gpu: cpu`` clusters (no GRES request)."""
    layout: Layout
    """The config's parallel layout (``kilocard.layout.compute_layout``): degrees, DP, stage layers."""
    master_port: int | None
    """Fixed rendezvous port (launcher.master_port); ``None``: derived from the Slurm job id."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment every rank gets (values are plain strings; quoting is the renderer's job)."""
    secret_env: list[str] = field(default_factory=list)
    """Names of variables passed through from the submitting environment; values never stored."""

    @property
    def on_gpu(self) -> bool:
        """True when the ranks drive GPUs (``gpus_per_node > 0``)."""
        return self.gpus_per_node > 0

    def to_json(self) -> str:
        """The plan as JSON text (``plan.json`` in the run directory; ``layout`` as ``Layout.to_json()``, which
        ``Layout.from_json`` reads back)."""
        doc = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "layout"}
        doc.update(layout=self.layout.to_json(), on_gpu=self.on_gpu)
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def layout_env(cfg: RunConfig, lay: Layout, on_gpu: bool, cpus_per_task: int) -> dict[str, str]:
    """Environment the layout and hardware call for (before cluster/launcher settings)."""
    env: dict[str, str] = {"OMP_NUM_THREADS": str(cpus_per_task)}
    if not on_gpu:
        return env
    if one_device_connection(cfg.cluster.gpu, lay.tp, lay.cp):
        env[DEVICE_CONNECTIONS_ENV] = "1"
    env["PYTORCH_CUDA_ALLOC_CONF"] = CUDA_ALLOC_CONF
    # a failed or hung collective raises on every rank (-> exit FAULT) instead of hanging forever
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "3"
    env["NCCL_DEBUG"] = "WARN"
    if cfg.cluster.nodes > 1:
        env["TORCH_NCCL_AVOID_RECORD_STREAMS"] = "1"
    return env


def build_plan(cfg: RunConfig, layout: Layout | None = None) -> LaunchPlan:
    """The launch plan of a (validated) config; ``layout`` when the caller computed it already."""
    c, lay = cfg.cluster, layout or compute_layout(cfg)
    on_gpu = c.gpu != CPU_GPU
    tasks = lay.gpus_per_node  # one rank per GPU (per CPU rank slot on ``gpu: cpu``)
    cpus_per_task = max(1, c.cpus_per_node // tasks)
    env = layout_env(cfg, lay, on_gpu, cpus_per_task)
    env.update({str(k): str(v) for k, v in c.env.items()})
    env.update({str(k): str(v) for k, v in cfg.launcher.env.items()})
    return LaunchPlan(
        nodes=lay.nodes,
        tasks_per_node=tasks,
        world_size=lay.world_size,
        cpus_per_task=cpus_per_task,
        gpus_per_node=c.gpus_per_node if on_gpu else 0,
        layout=lay,
        master_port=cfg.launcher.master_port,
        env=env,
        secret_env=list(cfg.launcher.secret_env),
    )
