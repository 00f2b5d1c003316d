"""The domain of every exposed field, in one table: a range for each number, the choices for each string.

``DOMAINS`` maps the dotted name of every field of ``kilocard.config.schema.RunConfig`` that is not a
bool to what it may hold. ``validate`` checks a composed config against it (one rule,
``kilocard.validate.domains``), ``convert`` checks the config it derives from a Hugging Face
``config.json`` against it before it writes anything, and ``budget`` checks its own inputs
(``BUDGET_DOMAINS``). ``tests/config/test_config_domains.py`` walks the schema: a field without a
row here fails it.

Adding a schema field: add its row here, beside its section's others.

- a number: ``Range(low, high, what)``; ``None`` as a value is always allowed for a field that may be
  null (it means "the default" and is never compared). A whole-number field has a finite ``high``:
  counts, sizes and iterations are what a run allocates or loops over, and a value nothing real uses
  (``num_layers=1e9``) must be refused before it is built, not after.
- a string with fixed values: ``Choices(values, what)`` with Megatron-Core's names, listed here once.
- a list: the row applies to each element.
- free text (a path, a name, an expression with its own grammar): ``Text(what)``, saying which rule
  checks its form.

``code`` is the issue code validate reports (``OUT_OF_RANGE`` / ``CHOICE`` unless the field had its own).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kilocard.config.schema import LORA_INIT_METHODS, LORA_TARGETS, PACKAGING_MODES, WANDB_MODES, RunConfig

#: Highest seed: numpy's ``RandomState`` takes 0 .. 2**32 - 1.
SEED_MAX = 2**32 - 1
#: A step count no run reaches (2**40 steps at a millisecond each is 35 years); the product with the
#: batch is bounded by validate's TRAIN_SAMPLES / EVAL_SAMPLES.
STEPS = 2**40
#: A layer count no model comes near (the largest published dense and MoE models have 61 to 160).
LAYERS = 10_000
#: A width (hidden, FFN, head or rank dimension) no model comes near (the largest published: 53,248 FFN).
WIDTH = 2**20
#: Ranks along one parallel dimension, or GPUs of a pod: more than any machine has.
RANKS = 2**24


@dataclass(frozen=True)
class Range:
    """A number in ``[low, high]`` (an end is excluded when ``low_open`` / ``high_open``; ``high=None``: no top)."""

    low: float
    high: float | None
    what: str
    low_open: bool = False
    high_open: bool = False
    code: str = "OUT_OF_RANGE"

    def contains(self, v: float) -> bool:
        """Whether finite ``v`` lies in the range."""
        above = v > self.low if self.low_open else v >= self.low
        below = self.high is None or (v < self.high if self.high_open else v <= self.high)
        return above and below

    def text(self) -> str:
        """``[1, 10000]``, ``(0, 1)``, ``>= 0``."""
        low = f"{'(' if self.low_open else '['}{_num(self.low)}"
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_num(self.low)}"
        return f"{low}, {_num(self.high)}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class Choices:
    """One of ``values`` (``None`` among them: the field may be null)."""

    values: tuple[str | None, ...]
    what: str
    code: str = "CHOICE"

    def text(self) -> str:
        """``a, b or c``."""
        names = ["null" if v is None else str(v) for v in self.values]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


@dataclass(frozen=True)
class Text:
    """Free text whose form another rule checks (named in ``what``)."""

    what: str


Domain = Range | Choices | Text


def _num(v: float) -> str:
    if isinstance(v, int) or (math.isfinite(v) and v == int(v) and abs(v) < 1e6):
        n = int(v)
        if n >= 2**20 and n & (n - 1) == 0:
            return f"2**{n.bit_length() - 1}"
        if n >= 2**20 and (n + 1) & n == 0:
            return f"2**{n.bit_length()} - 1"
        return str(n)
    return f"{v:g}"


def count(low: int, high: int, what: str, code: str = "OUT_OF_RANGE") -> Range:
    """Whole numbers ``low .. high``."""
    return Range(low, high, what, code=code)


def positive(high: float | None, what: str, code: str = "OUT_OF_RANGE") -> Range:
    """A real number > 0 (and <= ``high``)."""
    return Range(0, high, what, low_open=True, code=code)


def nonneg(high: float | None, what: str, code: str = "OUT_OF_RANGE") -> Range:
    """A real number >= 0 (and <= ``high``)."""
    return Range(0, high, what, code=code)


def probability(what: str, code: str = "OUT_OF_RANGE") -> Range:
    """A probability in [0, 1)."""
    return Range(0, 1, what, high_open=True, code=code)


DTYPES = ("float32", "bfloat16", "float16")
"""Parameter and optimizer-state dtypes by name (``torch.float32`` ...)."""

MODEL: dict[str, Domain] = {
    "model.name": Text("a label (recipe tables, run names)"),
    "model.num_layers": count(1, LAYERS, "transformer layers", "MODEL_SHAPE"),
    "model.hidden_size": count(1, WIDTH, "the hidden size", "MODEL_SHAPE"),
    "model.ffn_hidden_size": count(1, 4 * WIDTH, "the MLP hidden size", "MODEL_SHAPE"),
    "model.num_attention_heads": count(1, 2**16, "attention heads", "MODEL_SHAPE"),
    "model.num_query_groups": count(1, 2**16, "key/value head groups", "MODEL_SHAPE"),
    "model.kv_channels": count(1, 2**16, "the projection size per head", "MODEL_SHAPE"),
    "model.seq_length": count(1, 2**24, "the sequence length in tokens", "SEQ_NOT_POSITIVE"),
    "model.max_position_embeddings": count(1, 2**24, "the largest position"),
    "model.vocab_size": count(1, 2**24, "the vocabulary size (the largest published: 256k)", "MODEL_SHAPE"),
    "model.make_vocab_size_divisible_by": count(1, 2**16, "the vocabulary padding multiple", "MODEL_SHAPE"),
    "model.normalization": Choices(("LayerNorm", "RMSNorm"), "Megatron-Core's norms", "MODEL_CHOICE"),
    "model.layernorm_epsilon": positive(1.0, "the norm's epsilon (it divides by sqrt(var + eps))", "LAYERNORM_EPSILON"),
    "model.activation": Choices(("gelu", "swiglu", "squared_relu", "quick_gelu"), "MLP activations", "MODEL_CHOICE"),
    "model.glu_linear_offset": Range(-1e3, 1e3, "the gated MLP's linear offset", code="GLU"),
    "model.activation_func_clamp_value": positive(1e6, "the gated MLP's clamp", "GLU"),
    "model.window_size": count(-1, 2**24, "sliding-window sizes (left, right; -1: unbounded)", "WINDOW"),
    "model.window_attn_skip_freq": count(0, LAYERS, "every k-th layer full (or one 0/1 per layer)", "WINDOW"),
    "model.softmax_type": Choices(("vanilla", "off-by-one", "learnable"), "attention softmaxes", "MODEL_CHOICE"),
    "model.position_embedding_type": Choices(
        ("learned_absolute", "rope", "yarn", "none"), "GPTModel's", "MODEL_CHOICE"
    ),
    "model.rotary_base": count(1, 10**10, "the RoPE base period", "ROPE"),
    "model.rotary_percent": Range(0, 1, "the fraction of the head RoPE rotates", low_open=True, code="ROPE"),
    "model.rope_scaling_factor": positive(1024.0, "the RoPE scaling factor", "ROPE"),
    "model.hidden_dropout": probability("a dropout probability"),
    "model.attention_dropout": probability("a dropout probability"),
    "model.attention_backend": Choices(("auto", "flash", "fused", "unfused", "local"), "AttnBackend names"),
    "model.cuda_graph_impl": Choices(("none", "local", "transformer_engine"), "TransformerConfig.cuda_graph_impl"),
    "model.cuda_graph_scope": Choices(
        ("full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess"), "CUDA graph scopes"
    ),
    "model.cross_entropy_fusion_impl": Choices(("native", "te"), "fused cross-entropies", "CROSS_ENTROPY_FUSION_IMPL"),
    "model.init_method_std": positive(10.0, "the init standard deviation (0: no unit learns apart)", "INIT_METHOD_STD"),
    "model.num_moe_experts": count(1, 2**16, "routed experts per MoE layer", "EXPERTS_NOT_POSITIVE"),
    "model.moe_router_topk": count(1, 1024, "experts per token", "MODEL_SHAPE"),
    "model.moe_ffn_hidden_size": count(1, 4 * WIDTH, "the expert MLP hidden size", "MODEL_SHAPE"),
    "model.moe_shared_expert_intermediate_size": count(1, 4 * WIDTH, "the shared experts' size", "MODEL_SHAPE"),
    "model.moe_layer_freq": count(0, LAYERS, "every k-th layer is MoE (or one 0/1 per layer)", "MOE_LAYER_FREQ"),
    "model.moe_token_dispatcher_type": Choices(("alltoall", "allgather", "flex"), "MoE dispatchers", "MODEL_CHOICE"),
    "model.moe_router_load_balancing_type": Choices(
        ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"), "router balancing", "MODEL_CHOICE"
    ),
    "model.moe_aux_loss_coeff": nonneg(1e3, "the load-balancing loss weight", "MOE_AUX_LOSS_COEFF"),
    "model.moe_router_score_function": Choices(("softmax", "sigmoid"), "router scoring", "MODEL_CHOICE"),
    "model.moe_router_topk_scaling_factor": positive(1e3, "the routing weights' scale", "MOE_ROUTER_SCORE"),
    "model.moe_router_num_groups": count(1, 2**16, "expert groups of group-limited routing", "MOE_ROUTER_GROUPS"),
    "model.moe_router_group_topk": count(1, 2**16, "groups per token", "MOE_ROUTER_GROUPS"),
    "model.moe_router_bias_update_rate": nonneg(1.0, "the expert bias's step per batch", "MOE_ROUTER_SCORE"),
    "model.moe_router_dtype": Choices((None, "fp32", "fp64"), "router dtypes", "MODEL_CHOICE"),
    "model.q_lora_rank": count(1, WIDTH, "MLA's query rank"),
    "model.kv_lora_rank": count(1, WIDTH, "MLA's key/value rank"),
    "model.qk_head_dim": count(1, 2**16, "MLA's query/key head dimension"),
    "model.qk_pos_emb_head_dim": count(1, 2**16, "MLA's rotary head dimension"),
    "model.v_head_dim": count(1, 2**16, "MLA's value head dimension"),
    "model.rope_type": Choices(("rope", "yarn"), "MLA's rotary embeddings", "MODEL_CHOICE"),
    "model.rotary_scaling_factor": positive(1e6, "YaRN's context-extension factor", "MLA_ROPE"),
    "model.original_max_position_embeddings": count(1, 2**24, "YaRN's original context", "MLA_ROPE"),
    "model.beta_fast": positive(1e6, "YaRN's high-frequency boundary", "MLA_ROPE"),
    "model.beta_slow": positive(1e6, "YaRN's low-frequency boundary", "MLA_ROPE"),
    "model.mscale": nonneg(1e3, "YaRN's attention temperature", "MLA_ROPE"),
    "model.mscale_all_dim": nonneg(1e3, "YaRN's temperature over all dimensions", "MLA_ROPE"),
    "model.mtp_num_layers": count(1, 64, "multi-token-prediction layers", "MTP"),
    "model.mtp_loss_scaling_factor": nonneg(1e3, "the multi-token-prediction loss weight", "MTP"),
}

PARALLEL: dict[str, Domain] = {
    "parallel.tensor_model_parallel_size": count(1, RANKS, "the TP degree", "PARALLEL_SIZE"),
    "parallel.pipeline_model_parallel_size": count(1, RANKS, "the PP degree", "PARALLEL_SIZE"),
    "parallel.virtual_pipeline_model_parallel_size": count(1, LAYERS, "virtual stages per pipeline rank"),
    "parallel.context_parallel_size": count(1, RANKS, "the CP degree", "PARALLEL_SIZE"),
    "parallel.expert_model_parallel_size": count(1, RANKS, "the EP degree", "PARALLEL_SIZE"),
    "parallel.expert_tensor_parallel_size": count(1, RANKS, "the ETP degree", "PARALLEL_SIZE"),
    "parallel.num_layers_in_first_pipeline_stage": count(0, LAYERS, "layers on the first stage"),
    "parallel.num_layers_in_last_pipeline_stage": count(0, LAYERS, "layers on the last stage"),
    "parallel.pipeline_model_parallel_layout": Text("a pipeline layout (its grammar: PIPELINE_LAYOUT)"),
    "parallel.cp_comm_type": Choices(("p2p", "all_gather", "a2a", "a2a+p2p"), "context-parallel exchanges"),
    "parallel.recompute_granularity": Choices((None, "selective", "full"), "recompute", "RECOMPUTE_GRANULARITY"),
    "parallel.recompute_method": Choices((None, "uniform", "block"), "full-recompute methods", "RECOMPUTE_METHOD"),
    "parallel.recompute_num_layers": count(1, LAYERS, "layers per recompute unit", "RECOMPUTE_NUM_LAYERS"),
    "parallel.cpu_offloading_num_layers": count(0, LAYERS, "offloaded layers", "CPU_OFFLOAD_LAYERS"),
    "parallel.data_parallel_sharding_strategy": Choices(
        ("no_shard", "optim", "optim_grads", "optim_grads_params"), "Megatron-FSDP sharding", "FSDP_SHARDING_STRATEGY"
    ),
}

PRECISION: dict[str, Domain] = {
    "precision.fp8": Choices((None, "e4m3", "hybrid"), "FP8 formats", "FP8_FORMAT"),
    "precision.fp8_recipe": Choices(("delayed", "tensorwise", "mxfp8", "blockwise"), "FP8 recipes", "FP8_RECIPE"),
    "precision.fp8_margin": count(0, 64, "the FP8 scaling margin (a power of two)"),
    "precision.fp8_amax_history_len": count(1, 2**20, "steps of amax history"),
    "precision.fp8_amax_compute_algo": Choices(("max", "most_recent"), "amax algorithms"),
    "precision.fp4": Choices((None, "nvfp4"), "FP4 formats", "FP4_FORMAT"),
    "precision.params_dtype": Choices(DTYPES, "parameter dtypes", "PARAMS_DTYPE"),
}

OPTIM: dict[str, Domain] = {
    "optim.optimizer": Choices(("adam", "sgd"), "Megatron-Core's optimizers", "OPTIMIZER"),
    "optim.lr": nonneg(10.0, "the peak learning rate"),
    "optim.min_lr": nonneg(10.0, "the learning rate at the end of the decay"),
    "optim.weight_decay": nonneg(10.0, "the decoupled weight decay"),
    "optim.adam_beta1": Range(0, 1, "Adam's beta1 (torch refuses 1 and above)", high_open=True, code="ADAM_BETA"),
    "optim.adam_beta2": Range(0, 1, "Adam's beta2 (torch refuses 1 and above)", high_open=True, code="ADAM_BETA"),
    "optim.adam_eps": positive(1.0, "Adam's epsilon (0 gives 0/0 for a zero gradient)", "ADAM_EPS"),
    "optim.clip_grad": nonneg(None, "the gradient-norm clip (0 = off; negative points uphill)", "CLIP_GRAD"),
    "optim.lr_warmup_iters": count(0, STEPS, "warm-up steps", "LR_WARMUP_ITERS"),
    "optim.lr_decay_iters": count(1, STEPS, "decay steps (Megatron-Core asserts > 0)", "LR_DECAY_ITERS"),
    "optim.lr_decay_style": Choices(
        ("constant", "linear", "cosine", "inverse-square-root", "WSD"), "OptimizerParamScheduler's", "LR_DECAY_STYLE"
    ),
    "optim.main_params_dtype": Choices(("float32", "float16"), "master-parameter dtypes", "OPTIM_STATE_DTYPE"),
    "optim.exp_avg_dtype": Choices(DTYPES, "first-moment dtypes", "OPTIM_STATE_DTYPE"),
    "optim.exp_avg_sq_dtype": Choices(DTYPES, "second-moment dtypes", "OPTIM_STATE_DTYPE"),
}

DATA: dict[str, Domain] = {
    "data.type": Choices(("mock", "indexed"), "dataset kinds", "DATA_TYPE"),
    "data.data_path": Text("dataset prefixes and weights (DATA_PATH, checked against their files)"),
    "data.split": Text("train,valid,test weights (DATA_SPLIT)"),
    "data.tokenizer": Text("kilocard-bytes or a tokenizer path (TOKENIZER)"),
    "data.random_seed": count(0, SEED_MAX, "the dataset shuffle seed (numpy's 32-bit seed)"),
    "data.path_to_cache": Text("a directory (one line)"),
    "data.num_workers": count(0, 256, "DataLoader workers per rank"),
}

PEFT: dict[str, Domain] = {
    "peft.type": Choices((None, "lora"), "adapter kinds", "PEFT_TYPE"),
    "peft.target_modules": Choices(LORA_TARGETS, "Megatron-Core's linear layers", "LORA_TARGET"),
    "peft.dim": count(1, 2**16, "the LoRA rank", "LORA_DIM"),
    "peft.alpha": count(1, 2**20, "LoRA alpha (the scale is alpha / dim)", "LORA_SETTING"),
    "peft.dropout": probability("the adapter's dropout", "LORA_SETTING"),
    "peft.dropout_position": Choices(("pre", "post"), "dropout positions", "LORA_SETTING"),
    "peft.lora_A_init_method": Choices(LORA_INIT_METHODS, "adapter inits", "LORA_SETTING"),
    "peft.lora_B_init_method": Choices(LORA_INIT_METHODS, "adapter inits", "LORA_SETTING"),
}

CHECKPOINT: dict[str, Domain] = {
    "checkpoint.save": Text("a directory (one line; a mount list)"),
    "checkpoint.load": Text("a directory with committed steps (CHECKPOINT_LOAD_*)"),
    "checkpoint.save_interval": count(0, STEPS, "steps between saves (0 = only at the end and on a stop)"),
    "checkpoint.keep_last": count(1, 2**31 - 1, "committed steps kept"),
    "checkpoint.ckpt_format": Choices(("torch_dist",), "on-disk formats"),
    "checkpoint.ckpt_step": count(0, STEPS, "the step of checkpoint.load to start from"),
    "checkpoint.expected_save_time_s": nonneg(None, "a measured save time in seconds"),
    "checkpoint.non_persistent_save_interval": count(1, STEPS, "steps between local saves (null = off)"),
    "checkpoint.non_persistent_ckpt_type": Choices(("local",), "local-tier kinds", "NON_PERSISTENT_TYPE"),
    "checkpoint.non_persistent_local_ckpt_dir": Text("an absolute node-local directory (LOCAL_CKPT_DIR)"),
}

TRAINER: dict[str, Domain] = {
    "trainer.micro_batch_size": count(1, 2**20, "sequences per micro-batch", "BATCH_NOT_POSITIVE"),
    "trainer.global_batch_size": count(1, 2**31 - 1, "sequences per step", "BATCH_NOT_POSITIVE"),
    "trainer.train_iters": count(1, STEPS, "optimizer steps to train"),
    "trainer.eval_interval": count(1, STEPS, "steps between evaluations (null = no evaluation)"),
    "trainer.eval_iters": count(
        1, 10**6, "global batches per evaluation (Megatron-LM's default: 100; the product: EVAL_SAMPLES)"
    ),
    "trainer.log_interval": count(1, STEPS, "steps between log lines"),
    "trainer.seed": count(0, SEED_MAX, "the seed (numpy's 32-bit seed; each pipeline stage adds 100)"),
    "trainer.hang_timeout_s": nonneg(None, "seconds without progress before a rank is hung (0 = off)"),
    "trainer.rank_time_interval": count(0, STEPS, "steps between per-rank step-time gathers (0 = off)"),
    "trainer.wandb_project": Text("a W&B project name"),
    "trainer.wandb_entity": Text("a W&B entity"),
    "trainer.wandb_exp_name": Text("a W&B run name"),
    "trainer.wandb_tags": Text("W&B tags"),
    "trainer.wandb_mode": Choices(WANDB_MODES, "W&B modes", "WANDB_MODE"),
    "trainer.mlflow_tracking_uri": Text("an MLflow URI"),
    "trainer.mlflow_experiment": Text("an MLflow experiment"),
    "trainer.profile_steps": count(1, STEPS, "a profiled step (the window: PROFILE_STEPS)", "PROFILE_STEPS"),
}

CLUSTER: dict[str, Domain] = {
    "cluster.name": Text("a profile name"),
    "cluster.gpu": Text("a key of the GPU table (GPU_UNKNOWN)"),
    "cluster.nodes": count(1, 2**20, "nodes", "CLUSTER_SIZE"),
    "cluster.gpus_per_node": count(1, 1024, "accelerators (ranks) per node", "CLUSTER_SIZE"),
    "cluster.nvlink_domain_size": count(1, RANKS, "GPUs of one NVLink domain", "CLUSTER_SIZE"),
    "cluster.intra_node_bandwidth_gbs": positive(1e6, "NVLink GB/s per GPU"),
    "cluster.inter_node_bandwidth_gbs": positive(1e6, "network GB/s per GPU"),
    "cluster.pod_gpus": count(1, RANKS, "GPUs of one pod"),
    "cluster.pod_oversubscription": Range(1, 1e3, "the pod's uplink oversubscription (1 = none)"),
    "cluster.hbm_bytes": count(1, 2**50, "bytes of memory per accelerator"),
    "cluster.cpus_per_node": count(1, 2**16, "CPU cores per node"),
    "cluster.mem_per_node": Text("Slurm --mem (SCRIPT_VALUE)"),
    "cluster.partition": Text("a Slurm partition (SCRIPT_VALUE)"),
    "cluster.account": Text("a Slurm account (SCRIPT_VALUE)"),
    "cluster.qos": Text("a Slurm QOS (SCRIPT_VALUE)"),
    "cluster.container_image": Text("an image (one line)"),
    "cluster.container_mounts": Text("src:dst mounts (SCRIPT_VALUE)"),
    "cluster.venv": Text("a directory (one line)"),
    "cluster.shared_fs": Text("a directory (one line)"),
    "cluster.fs_write_bandwidth_gbs": positive(1e6, "the shared filesystem's write GB/s"),
    "cluster.env": Text("environment names and values (SCRIPT_VALUE)"),
}

LAUNCHER: dict[str, Domain] = {
    "launcher.kind": Choices(("local", "slurm"), "launchers", "LAUNCHER_KIND"),
    "launcher.nproc": count(1, 1024, "local ranks (this machine's cores: LOCAL_CPUS)"),
    "launcher.job_name": Text("a Slurm job name (SCRIPT_VALUE)"),
    "launcher.run_name": Text("a directory name (RUN_NAME)"),
    "launcher.time": Text("a Slurm time limit (LAUNCHER_TIME)"),
    "launcher.signal_lead_s": count(0, 366 * 86400, "seconds between USR1 and the time limit"),
    "launcher.dependency": Text("a Slurm dependency (SCRIPT_VALUE)"),
    "launcher.max_restarts": count(0, 10_000, "in-job restarts after a rank fault"),
    "launcher.master_port": count(1, 65535, "a TCP port"),
    "launcher.extra_sbatch": Text("#SBATCH lines (SCRIPT_VALUE)"),
    "launcher.env": Text("environment names and values (SCRIPT_VALUE)"),
    "launcher.secret_env": Text("variable names (SECRET_VALUE)"),
    "launcher.max_requeues": count(0, 10_000, "times a job may requeue itself"),
    "launcher.max_excluded_nodes": count(0, 2**20, "nodes a run may exclude"),
    "launcher.packaging": Choices(PACKAGING_MODES, "packaging modes", "PACKAGING"),
}

RECIPE: dict[str, Domain] = {
    "recipe.name": Text("the recipe's name"),
    "recipe.family": Text("a recipes/ folder"),
    "recipe.description": Text("one line"),
    "recipe.baseline_id": Text("a published row's id"),
    "recipe.baseline_source": Text("a citation"),
    "recipe.baseline_tflops_per_gpu": positive(1e5, "published TFLOP/s per GPU"),
    "recipe.baseline_mfu": Range(0, 1, "published MFU", low_open=True),
    "recipe.baseline_flops_convention": Text("a FLOPs convention name (perf.flops)"),
    "perf.site_baselines": Text("a site baselines file (SITE_BASELINES)"),
}

#: Every exposed field's domain (``tests/config/test_config_domains.py`` keeps it complete).
DOMAINS: dict[str, Domain] = {
    **MODEL,
    **PARALLEL,
    **PRECISION,
    **OPTIM,
    **DATA,
    **PEFT,
    **CHECKPOINT,
    **TRAINER,
    **CLUSTER,
    **LAUNCHER,
    **RECIPE,
}

#: ``kilocard budget``'s own inputs: ``flops`` bounds the compute a GPUs x days budget gives too (the
#: scaling laws are fitted between about 1e18 and 4e25 FLOPs; Llama 3.1 405B used 3.8e25).
BUDGET_DOMAINS: dict[str, Range] = {
    "gpus": count(1, RANKS, "GPUs"),
    "days": Range(0.04, 3650, "days of training (about an hour to ten years)"),
    "flops": Range(1e17, 1e30, "training FLOPs the scaling laws can speak for"),
}


def choices(field: str) -> tuple[str, ...]:
    """The values of a ``Choices`` field, null left out (``choices("data.type")``)."""
    domain = DOMAINS[field]
    assert isinstance(domain, Choices), field
    return tuple(v for v in domain.values if v is not None)


def exposed_fields(cfg: RunConfig | None = None) -> Iterator[tuple[str, Any]]:
    """``(dotted name, value)`` of every non-bool field of the config's sections (``RunConfig()`` by default)."""
    root = cfg if cfg is not None else RunConfig()
    for section in dataclasses.fields(root):
        node = getattr(root, section.name)
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if not isinstance(v, bool) and f.type not in ("bool",):
                yield f"{section.name}.{f.name}", v


def problem(domain: Domain, value: Any) -> str | None:
    """Why ``value`` is outside ``domain`` (``None`` when inside, null, not finite, or free text).

    A list is checked element by element; a non-finite number is left to NOT_FINITE."""
    if value is None or isinstance(domain, Text):
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            p = problem(domain, v)
            if p is not None:
                return f"[{i}]={v!r}: {p}"
        return None
    if isinstance(domain, Choices):
        names = ", ".join("null" if v is None else str(v) for v in domain.values)
        return None if value in domain.values else f"is not one of its choices: expected one of {names}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"is not a number ({domain.what} in {domain.text()})"
    if not math.isfinite(value) or domain.contains(value):
        return None
    return f"is out of range: {domain.what} must be in {domain.text()}"


def outside(cfg: RunConfig) -> list[tuple[str, Any, str]]:
    """``(field, value, why)`` of every exposed field of ``cfg`` outside its domain, in schema order."""
    found = []
    for name, value in exposed_fields(cfg):
        domain = DOMAINS.get(name)
        why = problem(domain, value) if domain is not None else None
        if why is not None:
            found.append((name, value, why))
    return found
