"""The parallel layout a config implies: sizes, derived DP, micro-batches, stage layers, group placement.

The one object for the layout (like torchtitan's ``ParallelDims``): computed once by
``compute_layout`` and passed to the validator, the performance models, the planner and the launch
plan. Pure and total: any ``RunConfig`` gives a ``Layout`` (derived sizes that are not whole
numbers are ``None``; the validator's rules say why). The world size is the cluster's: ``nodes *
gpus_per_node`` (the config is the source of truth, never the environment).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property
from typing import Any

from kilocard.config.schema import ClusterConfig, RunConfig
from kilocard.topology import GroupPlacement, place_group, rank_order

MEGATRON_NAMES = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "vp": "virtual_pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
}
"""``Layout`` degree -> Megatron-Core's name for it (``parallel.*`` in the config, the keyword of
``initialize_model_parallel``): the one rename between kilocard's short names and Megatron's."""
RANK_FIELDS = ("world_size", "tp", "pp", "vp", "cp", "ep", "etp")
"""What decides which rank holds which shard: per-rank state (RNG) maps one-to-one on resume when equal."""


@dataclass(frozen=True)
class Layout:
    """Parallel sizes of a run and where their process groups sit."""

    world_size: int
    """Ranks: cluster.nodes * cluster.gpus_per_node."""
    nodes: int
    """cluster.nodes."""
    gpus_per_node: int
    """cluster.gpus_per_node."""
    nvlink_domain_size: int
    """cluster.nvlink_domain_size."""
    tp: int
    """Tensor-parallel size."""
    pp: int
    """Pipeline-parallel size."""
    vp: int | None
    """Virtual stages per pipeline rank (``None``: not interleaved)."""
    cp: int
    """Context-parallel size."""
    ep: int
    """Expert-parallel size."""
    etp: int
    """Expert tensor-parallel size (TP when unset)."""
    dp: int | None
    """Data-parallel size world / (tp*pp*cp); ``None`` when not a whole number."""
    expert_dp: int | None
    """Expert data-parallel size world / (etp*ep*pp); ``None`` when not a whole number."""
    num_microbatches: int | None
    """Micro-batches per step per DP rank: global / (micro * dp); ``None`` when not whole."""
    stage_layers: list[int] | None = None
    """Transformer layers on each pipeline stage; ``None`` when the split is invalid."""
    use_tp_pp_dp_mapping: bool = False
    """parallel.use_tp_pp_dp_mapping: rank order ``tp-cp-ep-pp-dp`` (PP inside DP) instead of ``tp-cp-ep-dp-pp``."""
    pod_gpus: int = 0
    """cluster.pod_gpus: GPUs per network pod with full bisection bandwidth (0: no pods)."""

    @property
    def model_parallel_size(self) -> int:
        """tp * pp * cp."""
        return self.tp * self.pp * self.cp

    @property
    def dp_cp(self) -> int:
        """DP x CP ranks (Megatron-Core's ``dp_cp`` group: the gradient reduce and the distributed
        optimizer's shards); DP counts 1 when it is not whole."""
        return (self.dp or 1) * self.cp

    @property
    def pp_stride(self) -> int:
        """Ranks between consecutive pipeline stages: TP x CP, or TP x CP x DP in the default order."""
        return self.tp * self.cp * (1 if self.use_tp_pp_dp_mapping else (self.dp or 1))

    @property
    def dp_stride(self) -> int:
        """Ranks between consecutive data-parallel replicas: TP x CP, or TP x CP x PP with
        ``use_tp_pp_dp_mapping``."""
        return self.tp * self.cp * (self.pp if self.use_tp_pp_dp_mapping else 1)

    @property
    def dp_cp_stride(self) -> int:
        """Mean rank distance between members of a DP x CP group: TP in the default order (CP and DP are
        adjacent); with ``use_tp_pp_dp_mapping`` and DP > 1 the group spans TP x CP x PP x DP ranks, TP x PP
        per member (exact with CP 1; with CP > 1 its CP members sit TP apart and its DP members further,
        and the group's span, which decides what it crosses, is still this stride times its size)."""
        return self.tp * (self.pp if self.use_tp_pp_dp_mapping and (self.dp or 1) > 1 else 1)

    @property
    def tp_enabled(self) -> bool:
        """Tensor parallelism is on (TP > 1)."""
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        """Pipeline parallelism is on (PP > 1)."""
        return self.pp > 1

    @property
    def vp_enabled(self) -> bool:
        """The interleaved schedule is on (virtual stages set)."""
        return self.vp is not None

    @property
    def cp_enabled(self) -> bool:
        """Context parallelism is on (CP > 1)."""
        return self.cp > 1

    @property
    def ep_enabled(self) -> bool:
        """Expert parallelism is on (EP > 1)."""
        return self.ep > 1

    @property
    def dp_enabled(self) -> bool:
        """Data parallelism is on (a whole DP > 1)."""
        return self.dp is not None and self.dp > 1

    @property
    def virtual_stages(self) -> int:
        """Model chunks per pipeline rank: VP, or 1 when not interleaved."""
        return self.vp or 1

    @cached_property
    def groups(self) -> dict[str, GroupPlacement]:
        """Placement of each group kind (empty when DP is not whole; expert groups need a whole expert-DP)."""
        return place_groups(self)

    @property
    def order(self) -> str:
        """Megatron-Core's rank order string (``tp-cp-ep-dp-pp``, or ``tp-cp-ep-pp-dp`` with the mapping)."""
        return "-".join(rank_order(self.use_tp_pp_dp_mapping))

    def same_ranks(self, other: Layout) -> bool:
        """Whether every rank holds the same shard in both layouts (``RANK_FIELDS`` equal)."""
        return all(getattr(self, k) == getattr(other, k) for k in RANK_FIELDS)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: every field, plus the derived ``groups`` (``{name: {size, stride, within_node,
        within_nvlink, scope}}``) and ``model_parallel_size`` for readers; ``from_json`` reads it back."""
        out = asdict(self)
        out["groups"] = {k: {**asdict(g), "scope": g.scope} for k, g in self.groups.items()}
        out["model_parallel_size"] = self.model_parallel_size
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Layout:
        """The layout ``to_json`` wrote (derived keys ignored), or the older checkpoint form
        ``{world_size, tp, pp, vp, cp, ep, etp, distributed_optimizer}`` (``trainer_state.json`` before
        the layout was one object): its degrees and DP are exact; where it has no placement the ranks
        count as one node (``nodes`` 1, ``gpus_per_node`` = world size), which decides nothing on resume."""
        if "nodes" in doc:
            names = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in doc.items() if k in names})
        return of_sizes(
            int(doc["world_size"]), doc["tp"], doc["pp"], doc.get("vp"), doc["cp"], doc["ep"], doc.get("etp")
        )


def megatron_sizes(lay: Layout) -> dict[str, int | None]:
    """The layout's degrees under Megatron-Core's names (``MEGATRON_NAMES``): the parallel-size keywords of
    ``initialize_model_parallel`` and of Megatron-LM's ``args``."""
    return {name: getattr(lay, k) for k, name in MEGATRON_NAMES.items()}


def world_size(cluster: ClusterConfig) -> int:
    """Ranks of a run: ``cluster.nodes * cluster.gpus_per_node`` (a size below 1 counts 1; the rules report it).
    The one computation: the layout, the launch plan, the planner and the reports take it from here."""
    return _pos(cluster.nodes) * _pos(cluster.gpus_per_node)


def data_parallel_size(world: int, tp: int, pp: int, cp: int) -> int | None:
    """DP: ``world / (tp * pp * cp)``, ``None`` when not a whole number (Megatron-Core's rule)."""
    return _exact_div(world, tp * pp * cp)


def of_sizes(
    world: int, tp: int = 1, pp: int = 1, vp: int | None = None, cp: int = 1, ep: int = 1, etp: int | None = None
) -> Layout:
    """A layout from its degrees alone, the ranks on one node (no batch, no stage split): a checkpoint's
    recorded layout, or a single rank (``of_sizes(1)``)."""
    etp = etp or tp
    return Layout(
        world_size=world,
        nodes=1,
        gpus_per_node=world,
        nvlink_domain_size=world,
        tp=tp,
        pp=pp,
        vp=vp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=data_parallel_size(world, tp, pp, cp),
        expert_dp=_exact_div(world, etp * ep * pp),
        num_microbatches=None,
    )


def _pos(x: int | None, default: int = 1) -> int:
    """``x`` when it is a positive int, else ``default`` (bad sizes are reported by rules)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else default


def _exact_div(a: int, b: int) -> int | None:
    return a // b if b > 0 and a % b == 0 else None


def stage_layers(cfg: RunConfig) -> list[int] | None:
    """Layers per pipeline stage, as Megatron-Core's ``get_num_layers_to_build`` splits them."""
    p = cfg.parallel
    return split_layers(
        cfg.model.num_layers,
        _pos(p.pipeline_model_parallel_size),
        p.num_layers_in_first_pipeline_stage,
        p.num_layers_in_last_pipeline_stage,
        p.account_for_embedding_in_pipeline_split,
        p.account_for_loss_in_pipeline_split,
    )


def split_layers(
    layers: int, pp: int, first: int | None, last: int | None, embedding: bool = False, loss: bool = False
) -> list[int] | None:
    """``layers`` over ``pp`` stages: ``first``/``last`` on the end stages and the rest even, or an even
    split with the embedding/loss counted as a layer; ``None`` when the split is not whole."""
    if first is not None or last is not None:
        rest, stages = layers - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if stages < 0 or (stages == 0 and rest != 0) or (stages > 0 and (rest < 0 or rest % stages)):
            return None
        middle = rest // stages if stages else 0
        out = [middle] * pp
        if first is not None:
            out[0] = first
        if last is not None:
            out[-1] = last
        return out
    total = layers + embedding + loss
    if total % pp:
        return None
    out = [total // pp] * pp
    if embedding:
        out[0] -= 1
    if loss:
        out[-1] -= 1
    return out


def place_groups(lay: Layout) -> dict[str, GroupPlacement]:
    """Where each process group of ``lay`` sits, in Megatron-Core's rank order ``tp-cp-ep-dp-pp`` (or
    ``tp-cp-ep-pp-dp`` with ``use_tp_pp_dp_mapping``)."""
    world, gpn, domain, pod = lay.world_size, lay.gpus_per_node, lay.nvlink_domain_size, lay.pod_gpus
    tp, cp, pp, dp, etp, ep, edp = lay.tp, lay.cp, lay.pp, lay.dp, lay.etp, lay.ep, lay.expert_dp
    groups: dict[str, GroupPlacement] = {}
    if dp:
        for name, size, stride in (
            ("tp", tp, 1),
            ("cp", cp, tp),
            ("tp_cp", tp * cp, 1),
            ("dp", dp, lay.dp_stride),
            ("dp_cp", dp * cp, lay.dp_cp_stride),
            ("pp", pp, lay.pp_stride),
        ):
            groups[name] = place_group(name, size, stride, world, gpn, domain, pod)
    if edp:
        edp_stride = etp * ep * (pp if lay.use_tp_pp_dp_mapping else 1)
        for name, size, stride in (("etp", etp, 1), ("ep", ep, etp), ("expert_dp", edp, edp_stride)):
            groups[name] = place_group(name, size, stride, world, gpn, domain, pod)
    return groups


def compute_layout(cfg: RunConfig) -> Layout:
    """The layout of ``cfg`` (never raises; invalid derived sizes are ``None``)."""
    c, p, t = cfg.cluster, cfg.parallel, cfg.trainer
    tp, pp, cp = _pos(p.tensor_model_parallel_size), _pos(p.pipeline_model_parallel_size), _pos(p.context_parallel_size)
    vp = p.virtual_pipeline_model_parallel_size
    vp = vp if isinstance(vp, int) and vp >= 1 else None
    sizes = of_sizes(
        world_size(c), tp, pp, vp, cp, _pos(p.expert_model_parallel_size), _pos(p.expert_tensor_parallel_size, tp)
    )
    dp = sizes.dp
    mb = _exact_div(t.global_batch_size, _pos(t.micro_batch_size) * dp) if dp else None
    return replace(
        sizes,
        nodes=_pos(c.nodes),
        gpus_per_node=_pos(c.gpus_per_node),
        nvlink_domain_size=_pos(c.nvlink_domain_size),
        num_microbatches=mb or None,
        stage_layers=stage_layers(cfg) if pp <= 4096 else None,
        use_tp_pp_dp_mapping=bool(p.use_tp_pp_dp_mapping),
        pod_gpus=_pos(c.pod_gpus, 0),
    )
