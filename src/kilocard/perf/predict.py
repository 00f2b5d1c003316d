"""``predict(run_cfg)``: step time, TFLOP/s per GPU and MFU of a RunConfig on its cluster.

The adapter between the typed config (RunConfig, GPU table) and the step-time model's inputs
(``ModelShape``, the config's one ``Layout``, ``Features``, ``Hardware``). MFU always says which FLOPs
convention and which peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kilocard.config.dtypes import main_grads_fp32
from kilocard.config.schema import ClusterConfig, RunConfig
from kilocard.layout import Layout, compute_layout, world_size
from kilocard.perf.efficiency import FITTED, PerfModelParams
from kilocard.perf.flops import ModelShape, flops_per_iteration, shape_from_model
from kilocard.perf.steptime import Features, Hardware, StepTime, predict_step_time
from kilocard.topology import GpuSpec, compute_dtype, gpu_spec


@dataclass(frozen=True)
class Prediction:
    """What the performance model predicts for one run."""

    step_time_s: float
    """Seconds per optimizer step."""
    tflops_per_gpu: float
    """Achieved TFLOP/s per GPU under ``convention``."""
    mfu: float
    """``tflops_per_gpu`` over ``peak_flops``."""
    convention: str
    """FLOPs convention of ``tflops_per_gpu`` and ``mfu``."""
    peak_flops: float
    """Dense peak FLOP/s per GPU the MFU divides by (the GEMM dtype's datasheet figure)."""
    peak_dtype: str
    """dtype of that peak (``bf16``, ``fp8`` ...)."""
    breakdown: dict[str, float] = field(default_factory=dict)
    """Seconds per step by component (see ``StepTime.breakdown``)."""
    eval_time_s: float = 0.0
    """Seconds of one evaluation: ``trainer.eval_iters`` forward-only global batches (``Features.forward_only``);
    0 without ``trainer.eval_interval``."""
    eval_interval: int | None = None
    """``trainer.eval_interval``: steps between evaluations (``None``: no evaluation)."""

    @property
    def eval_s_per_step(self) -> float:
        """Evaluation time spread over the steps between two evaluations."""
        return self.eval_time_s / self.eval_interval if self.eval_interval else 0.0

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (what ``kilocard validate --format json`` carries as the prediction)."""
        return {
            "step_time_s": self.step_time_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "convention": self.convention,
            "peak_flops": self.peak_flops,
            "peak_dtype": self.peak_dtype,
            "breakdown_s": dict(self.breakdown),
            "eval_time_s": self.eval_time_s,
            "eval_s_per_step": self.eval_s_per_step,
        }


def gpu_family(spec: GpuSpec) -> str:
    """Efficiency family of a GPU: ``ampere``, ``hopper``, ``blackwell``, ``cdna3`` or ``cpu``."""
    if spec.vendor == "amd":
        return "cdna3"
    if spec.vendor == "cpu":
        return "cpu"
    return {8: "ampere", 9: "hopper", 10: "blackwell"}.get(spec.compute_capability[0], "hopper")


def require_gpu(name: str) -> GpuSpec:
    """The GPU table entry, or a ``ValueError`` naming the field and the known GPUs."""
    spec = gpu_spec(name)
    if spec is None:
        from kilocard.topology import GPU_TABLE

        raise ValueError(f"cluster.gpu: unknown GPU {name!r}; use one of {', '.join(GPU_TABLE)}")
    return spec


def hardware_for(cluster: ClusterConfig) -> Hardware:
    """The model's view of a cluster: GPU table peaks and HBM, the profile's links and node shape."""
    spec = require_gpu(cluster.gpu)
    pod = cluster.pod_gpus or 0
    return Hardware(
        gpu=spec.name,
        family=gpu_family(spec),
        peak_flops=dict(spec.peak_flops),
        hbm_bandwidth=spec.hbm_bandwidth,
        nvlink_bandwidth=cluster.intra_node_bandwidth_gbs * 1e9,
        network_bandwidth=cluster.inter_node_bandwidth_gbs * 1e9,
        gpus_per_node=cluster.gpus_per_node,
        nvlink_domain=max(1, cluster.nvlink_domain_size),
        pod_gpus=pod if 0 < pod < world_size(cluster) else 0,
        pod_oversubscription=cluster.pod_oversubscription,
    )


def precision_of(cfg: RunConfig) -> str:
    """GEMM dtype of the run (the peak its MFU divides by)."""
    p = cfg.precision
    return compute_dtype(p.bf16, p.fp16, p.fp8, p.fp4)


def step_layout(cfg: RunConfig, layout: Layout | None = None) -> Layout:
    """The config's ``Layout`` (``layout`` when the caller has computed it), or a ``ValueError`` naming
    the factors when DP is not a whole number."""
    lay = layout or compute_layout(cfg)
    if lay.dp is None:
        raise ValueError(
            f"parallel: TP({lay.tp}) * PP({lay.pp}) * CP({lay.cp}) = {lay.model_parallel_size} "
            f"does not divide the {lay.world_size} GPUs"
        )
    return lay


def features_of(cfg: RunConfig) -> Features:
    """What besides the layout sets the speed of ``cfg``: batch, recompute, overlaps, dtypes, kernels."""
    par, m = cfg.parallel, cfg.model
    return Features(
        mbs=cfg.trainer.micro_batch_size,
        gbs=cfg.trainer.global_batch_size,
        recompute=par.recompute_granularity or "none",
        sequence_parallel=par.sequence_parallel,
        distributed_optimizer=par.use_distributed_optimizer,
        overlap_grad_reduce=par.overlap_grad_reduce,
        overlap_param_gather=par.overlap_param_gather,
        tp_comm_overlap=par.tp_comm_overlap,
        overlap_p2p_comm=par.overlap_p2p_comm,
        precision=precision_of(cfg),
        fp8_recipe=cfg.precision.fp8_recipe,
        grad_bytes=4 if main_grads_fp32(cfg.precision) else 2,
        flash_attention=m.attention_backend not in ("local", "unfused"),
        num_experts=m.num_moe_experts or 0,
        moe_dispatcher=m.moe_token_dispatcher_type,
        dropout=bool(m.hidden_dropout or m.attention_dropout),
        attention_backend=m.attention_backend,
        cross_entropy=m.cross_entropy_fusion_impl if m.cross_entropy_loss_fusion else "unfused",
        fp8_param_gather=cfg.precision.fp8_param,
        cuda_graph_impl=m.cuda_graph_impl,
        cuda_graph_scope=tuple(m.cuda_graph_scope),
        lora_dim=cfg.peft.dim if cfg.peft.type == "lora" else 0,
        lora_targets=tuple(cfg.peft.target_modules) if cfg.peft.type == "lora" else (),
    )


def step_time(
    cfg: RunConfig,
    hw: Hardware,
    params: PerfModelParams = FITTED,
    shape: ModelShape | None = None,
    layout: Layout | None = None,
) -> StepTime:
    """``StepTime`` of ``cfg`` on ``hw`` (``shape`` and ``layout`` when the caller has them already)."""
    lay = step_layout(cfg, layout)
    shape = shape or shape_from_model(cfg.model, lay.tp)
    return predict_step_time(shape, lay, features_of(cfg), hw, params)


@dataclass(frozen=True)
class PredictionInputs:
    """Everything ``predict`` needs from a RunConfig that does not depend on the model's parameters:
    built once, predicted under many parameter sets (the fit and its cross-validation)."""

    shape: ModelShape
    """The model's dimensions."""
    layout: Layout
    """The config's parallel layout."""
    features: Features
    """Batch, recompute, overlaps, dtypes, kernels."""
    hardware: Hardware
    """The cluster as the model sees it."""
    flops: float
    """FLOPs of one iteration under ``convention``."""
    convention: str
    """FLOPs convention of ``flops``."""
    peak_dtype: str
    """The GEMM dtype whose dense peak the MFU divides by."""
    eval_interval: int | None = None
    """``trainer.eval_interval`` (``None``: no evaluation)."""
    eval_iters: int = 0
    """``trainer.eval_iters``: forward-only global batches per evaluation."""


def prepare(run_cfg: RunConfig, convention: str = "megatron_current", layout: Layout | None = None) -> PredictionInputs:
    """The parameter-independent inputs of ``predict`` for ``run_cfg``."""
    hw = hardware_for(run_cfg.cluster)
    lay = step_layout(run_cfg, layout)
    return PredictionInputs(
        shape=shape_from_model(run_cfg.model, lay.tp),
        layout=lay,
        features=features_of(run_cfg),
        hardware=hw,
        flops=flops_per_iteration(run_cfg, convention),
        convention=convention,
        peak_dtype=precision_of(run_cfg),
        eval_interval=run_cfg.trainer.eval_interval,
        eval_iters=run_cfg.trainer.eval_iters,
    )


def predict_prepared(inputs: PredictionInputs, params: PerfModelParams = FITTED) -> Prediction:
    """``predict`` on inputs built by ``prepare``."""
    hw, lay = inputs.hardware, inputs.layout
    step = predict_step_time(inputs.shape, lay, inputs.features, hw, params)
    peak = hw.peak_flops.get(inputs.peak_dtype, hw.peak_flops["bf16"])
    tflops = inputs.flops / step.total_s / lay.world_size / 1e12
    return Prediction(
        step_time_s=step.total_s,
        tflops_per_gpu=tflops,
        mfu=tflops * 1e12 / peak,
        convention=inputs.convention,
        peak_flops=peak,
        peak_dtype=inputs.peak_dtype,
        breakdown=dict(step.breakdown),
        eval_time_s=eval_time_s(inputs, params),
        eval_interval=inputs.eval_interval,
    )


def eval_time_s(inputs: PredictionInputs, params: PerfModelParams = FITTED) -> float:
    """Seconds of one evaluation: ``eval_iters`` runs of the schedule with ``forward_only=True`` over a global
    batch each; 0 without evaluation."""
    if not inputs.eval_interval or inputs.eval_iters < 1:
        return 0.0
    forward = replace(inputs.features, forward_only=True)
    return inputs.eval_iters * predict_step_time(inputs.shape, inputs.layout, forward, inputs.hardware, params).total_s


def predict(
    run_cfg: RunConfig,
    convention: str = "megatron_current",
    params: PerfModelParams = FITTED,
    layout: Layout | None = None,
) -> Prediction:
    """Predicted step time, TFLOP/s per GPU and MFU of ``run_cfg`` (FLOPs counted by ``convention``);
    ``layout`` is the config's ``Layout`` when the caller has computed it."""
    return predict_prepared(prepare(run_cfg, convention, layout), params)
