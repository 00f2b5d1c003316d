"""Memory per GPU of the most loaded pipeline stage: weights, gradients, optimizer, activations.

Where Megatron-LM has a formula (``megatron/training/theoretical_memory_usage.py`` in the
megatron-core 0.19.2 wheel) this module gives the same number on the same inputs, and
``tests/perf/test_memory_oracle.py`` proves it on many random configs against that very file:

* weights + gradients + optimizer == ``compute_weight_and_optimizer_memory(args)`` for bf16/fp16
  params with fp32 gradients (``precision.grad_reduce_in_fp32``) and Adam: 2 + 4 + 12 bytes per
  parameter, the 12 sharded over DP with the distributed optimizer (expert parameters over
  expert-DP), counted on the most loaded shard (first stage: 1/PP of the layers plus the
  embedding; dense, MoE, MLA, GQA, MTP, shared experts and the router as Megatron counts them);
* activations == ``compute_activation_memory(args, M)`` with sequence parallel (Korthikanti et
  al. 2022, Table 2, SP + selective) and ``compute_activation_memory_without_sp(args, M)`` without,
  with the interleaved-schedule penalty and the ``min(1, M/PP)`` discount. Megatron-LM's
  ``report_theoretical_memory`` picks the SP formula only with selective recompute; the only term
  selective recompute removes is the s x s attention scores, which fused/flash attention never
  stores, so kilocard picks it whenever SP is on, and adds the scores (``5 a s^2 b / t`` per layer)
  only for ``unfused``/``local`` attention without recompute.

Where kilocard goes further (each term is zero, or the identity, on Megatron's own inputs):

* context parallel: the per-rank sequence ``seq_length / CP`` goes into the activation formula,
  and the distributed optimizer shards over DP*CP (Megatron-Core's ``dp_cp`` group);
* other dtypes: fp32 params (4 + 4 + 8 bytes, no master copy), bf16 gradients when
  ``grad_reduce_in_fp32`` is false (2 bytes), FP8 parameters (``fp8_param``: 1 byte), SGD
  (momentum, plus a master copy under mixed precision); fp32 activations count 4 bytes, not 2;
* biases (``add_bias_linear``/``add_qkv_bias``) and learned absolute position embeddings, which
  the formula leaves out;
* a gated MLP with another gate than SiLU (GPT-OSS's quick-GeGLU) has its three matrices: Megatron's
  formula counts the third only under ``args.swiglu``;
* uneven pipeline stages: the first stage's own layer count replaces ``num_layers / PP`` and the
  last stage (output layer when untied) is checked too; the larger one counts;
* MoE activations: an MoE layer's MLP term uses the tokens each rank computes, ``topk *
  moe_ffn_hidden_size`` (+ shared experts) in place of ``ffn_hidden_size``;
* full recompute (not modelled by Megatron): a recomputed layer keeps only its input
  (``2 s b h`` bytes, / TP with SP), plus one recompute unit's full activations as working set.

* FP8/FP4 GEMMs: Transformer Engine keeps the inputs of the four linear layers (QKV, attention
  projection, fc1, fc2) for the backward pass in 1 byte instead of 2; those terms are halved.
* Megatron-FSDP (``use_megatron_fsdp``): ``optim_grads`` shards the gradients and ``optim_grads_params``
  the weights too over DP*CP (expert ones over expert-DP), each GPU holding its shard plus the layers
  held whole at once (``FSDP_GATHERED_LAYERS``: two layers' weights, the running and the prefetched one,
  one layer's gradients);
* activation offloading (``cpu_offloading``): the offloaded layers' activations leave the count;
* optimizer-state dtypes (``use_precision_aware_optimizer``): the master copy and the two moments in
  their own dtypes, the fp32 master of bf16 parameters as 2-byte remainders (``store_param_remainders``).

* LoRA (``peft=lora``): the frozen base keeps its weights only (no gradient buffer, no optimizer state:
  Megatron-Core's DDP and optimizer skip parameters without ``requires_grad``); the adapters
  (``dim * (in + out)`` per target module and layer, split over TP like their base) add weights,
  gradients and optimizer state. Activations are counted as for full training: Megatron-Core's linear
  layers keep their inputs either way, and the adapters' own ``dim``-wide activations are left out.

Not modelled: allocator fragmentation and workspaces (the validator keeps a reserve for those),
FP8 weight transpose caches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

from kilocard.config.dtypes import main_grads_fp32, mixed_precision, param_bytes, param_dtype
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.layout import Layout, compute_layout, megatron_sizes
from kilocard.perf.megatron_lm import megatron_lm_args
from kilocard.perf.params import count_parameters, is_gated, lora_params_per_layer, moe_count, moe_layer_pattern


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU on the most loaded pipeline stage."""

    weights: int
    """Model parameters in their storage dtype."""
    gradients: int
    """Gradient buffers (main grads)."""
    optimizer: int
    """Optimizer state (master params + moments), sharded over DP with the distributed optimizer."""
    activations: int
    """Activations kept for the backward pass, micro-batches in flight included."""
    params_on_stage: int
    """Parameters held by one GPU of the most loaded stage."""

    @property
    def total(self) -> int:
        """weights + gradients + optimizer + activations."""
        return self.weights + self.gradients + self.optimizer + self.activations

    def to_json(self) -> dict:
        """``{weights, gradients, optimizer, activations, total}`` in bytes."""
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "total": self.total,
        }


# --- the inputs of Megatron-LM's formula ----------------------------------------------------------


def _effective_ffn(m: ModelConfig) -> float:
    """Average per-layer MLP width seen by a token (the dense ffn for a dense model)."""
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    pattern = moe_layer_pattern(m)
    n_moe = moe_count(pattern)
    if not n_moe:
        return ffn
    moe = m.moe_router_topk * (m.moe_ffn_hidden_size or ffn) + (m.moe_shared_expert_intermediate_size or 0)
    return (ffn * (len(pattern) - n_moe) + moe * n_moe) / len(pattern)


def megatron_memory_args(cfg: RunConfig, layout: Layout | None = None) -> SimpleNamespace:
    """The ``args`` Megatron-LM's memory formulas read, from ``cfg`` (kilocard's extensions noted).

    On a dense model with CP = 1 and an even pipeline split these are exactly Megatron-LM's
    arguments for the same run. Extensions: ``seq_length`` is the per-rank sequence (/ CP),
    ``data_parallel_size`` is the optimizer-sharding group (DP * CP), ``num_layers`` is the first
    stage's layers * PP, ``ffn_hidden_size`` is the token-averaged MLP width of an MoE model, and
    ``swiglu`` is true for every gated MLP (three matrices), not only a SiLU-gated one.
    """
    m = cfg.model
    lay = layout or compute_layout(cfg)
    first = lay.stage_layers[0] if lay.stage_layers else None
    args = megatron_lm_args(cfg, lay.tp)
    vars(args).update(
        **megatron_sizes(lay),
        world_size=lay.world_size,
        data_parallel_size=lay.dp_cp,
        seq_length=m.seq_length // max(1, lay.cp),
        activation_num_layers=(_inflight_layers(lay) if first is not None else m.num_layers) - _offloaded_layers(cfg),
        activation_ffn_hidden_size=_effective_ffn(m),
        fp8_linear_inputs=cfg.precision.fp8 is not None or cfg.precision.fp4 is not None,
        # Three matrices in every gated MLP: Megatron-LM's formula reads args.swiglu, False for GPT-OSS's
        # quick-GeGLU, whose third matrix is there all the same.
        swiglu=is_gated(m),
    )
    return args


def _offloaded_layers(cfg: RunConfig) -> int:
    """Layers whose activations Megatron-Core's ``cpu_offloading`` keeps in host memory (PP 1 only)."""
    p = cfg.parallel
    return min(max(0, p.cpu_offloading_num_layers), cfg.model.num_layers) if p.cpu_offloading else 0


def _inflight_layers(lay: Layout) -> int:
    """Most layer-activations any stage holds under 1F1B, expressed as ``layers * PP``.

    Stage i keeps ``PP - i`` micro-batches in flight, each with its own layers; on an even split
    the first stage is the maximum (``layers/PP * PP``, Megatron's formula), on an uneven one a
    heavier middle stage can be.
    """
    st = lay.stage_layers or []
    return max(n * (lay.pp - i) for i, n in enumerate(st))


# --- weights, gradients and optimizer state -------------------------------------------------------


@dataclass(frozen=True)
class StageParams:
    """Parameters on one GPU of the most loaded stage, split by how they are sharded."""

    dense: float
    """TP-sharded and replicated parameters (sharded over DP*CP by the distributed optimizer)."""
    expert: float
    """Routed-expert parameters (sharded over expert-DP by the distributed optimizer)."""


def _layer_terms(a: SimpleNamespace) -> dict:
    """Megatron's per-layer parameter terms (attention, MLPs, norms, router)."""
    norm = 1 if a.normalization == "RMSNorm" else 2
    glu = 3 / 2 if a.swiglu else 1
    h = a.hidden_size
    if a.multi_latent_attention:
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        q = (
            h * a.num_attention_heads * qk
            if a.q_lora_rank is None
            else a.q_lora_rank * (h + a.num_attention_heads * qk + norm)
        )
        attn = (
            q
            + a.kv_lora_rank * (h + a.num_attention_heads * (a.qk_head_dim + a.v_head_dim) + norm)
            + h * a.qk_pos_emb_head_dim
            + (a.num_attention_heads * a.v_head_dim) * h
        )
    else:
        ratio = a.kv_channels * a.num_attention_heads / h
        attn = 2 * h * h * ((1 + (a.num_query_groups / a.num_attention_heads)) * ratio)
    experts = 1 if a.num_experts is None else a.num_experts
    moe_ffn = a.moe_ffn_hidden_size if a.num_experts is not None else 0
    return {
        "attn": attn,
        "dense_mlp": 2 * h * a.ffn_hidden_size * glu,
        "shared": 2 * h * (a.moe_shared_expert_intermediate_size or 0) * glu,
        "routed": 2 * h * moe_ffn * experts * glu,
        "norms": 2 * h * norm,
        "router": (h * experts + (experts if a.add_bias_linear else 0)) if a.num_experts is not None else 0,
        "final_norm": norm * h,
        "embedding": h * a.padded_vocab_size,
    }


def _bias_params_per_layer(m: ModelConfig) -> int:
    """Biases the formula leaves out (TP-sharded with their weights)."""
    n, g = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    d = m.kv_channels or m.hidden_size // n
    ffn = m.ffn_hidden_size or 4 * m.hidden_size
    out = (n + 2 * g) * d if (m.add_bias_linear or m.add_qkv_bias) else 0
    if m.add_bias_linear:
        out += m.hidden_size + ffn * (2 if is_gated(m) else 1) + m.hidden_size
    return out


def stage_params(cfg: RunConfig, layout: Layout, a: SimpleNamespace | None = None) -> StageParams:
    """Parameters per GPU on the most loaded stage (Megatron's accounting, plus the extensions)."""
    a = a or megatron_memory_args(cfg, layout)
    t = _layer_terms(a)
    pattern = moe_layer_pattern(cfg.model)
    n_moe = moe_count(pattern)
    n_dense = a.num_layers - n_moe
    mtp = a.mtp_num_layers or 0
    mtp_moe = pattern[-1] * mtp if pattern else 0
    mtp_dense = mtp - mtp_moe
    tp_block = (t["attn"] + t["dense_mlp"]) * n_dense + (t["attn"] + t["shared"]) * n_moe
    rep_block = t["norms"] * n_dense + (t["norms"] + t["router"]) * n_moe + t["final_norm"]
    exp_block = t["routed"] * n_moe
    tp_mtp = (t["attn"] + t["dense_mlp"]) * mtp_dense + (t["attn"] + t["shared"]) * mtp_moe
    rep_mtp = t["norms"] * mtp_dense + (t["norms"] + t["router"]) * mtp_moe
    exp_mtp = t["routed"] * mtp_moe
    pp, tp, etp_ep = (
        a.pipeline_model_parallel_size,
        a.tensor_model_parallel_size,
        a.expert_tensor_parallel_size * a.expert_model_parallel_size,
    )
    frac = _first_stage_fraction(cfg, layout)
    tp_on = ((tp_block * frac) + tp_mtp + t["embedding"]) / tp
    rep_on = (rep_block * frac) + rep_mtp
    exp_on = ((exp_block * frac) + exp_mtp) / etp_ep
    if a.untie_embeddings_and_output_weights and pp == 1:
        tp_on += t["embedding"] / tp
    extra = _extra_params(cfg, layout, frac)
    dense = tp_on + rep_on + extra
    candidates = [(dense, exp_on)] + _middle_stages(cfg, layout, t, etp_ep)
    last = _last_stage_dense(cfg, layout, t, tp_block, rep_block, exp_block, etp_ep)
    if last is not None:
        candidates.append(last)
    best = max(candidates, key=lambda c: c[0] + c[1])
    return StageParams(dense=best[0], expert=best[1])


def _middle_stages(cfg: RunConfig, layout: Layout, t: dict, etp_ep: int) -> list:
    """(dense, expert) params of each middle stage of an uneven split, from its own layers.

    An uneven split (``num_layers_in_first/last_pipeline_stage``) usually puts *more* layers on
    the middle stages, so they, not the first stage, can be the most loaded.
    """
    st, m = layout.stage_layers, cfg.model
    if st is None or len(set(st)) == 1 or layout.pp < 3:
        return []
    pattern, out, start = moe_layer_pattern(m), [], st[0]
    for n in st[1:-1]:
        moe = moe_count(pattern[start : start + n])
        start += n
        dense_layers = n - moe
        tp_part = (t["attn"] + t["dense_mlp"]) * dense_layers + (t["attn"] + t["shared"]) * moe
        rep = t["norms"] * dense_layers + (t["norms"] + t["router"]) * moe
        dense = tp_part / layout.tp + rep + _bias_params_per_layer(m) * n / layout.tp
        out.append((dense, t["routed"] * moe / etp_ep))
    return out


def _first_stage_fraction(cfg: RunConfig, layout: Layout) -> float:
    """Share of the transformer block on the first stage: 1/PP when even (Megatron's formula)."""
    st = layout.stage_layers
    if st is None or len(set(st)) == 1 or cfg.model.num_layers == 0:
        return 1 / layout.pp
    return st[0] / cfg.model.num_layers


def _extra_params(cfg: RunConfig, layout: Layout, frac: float) -> float:
    """Biases and learned position embeddings on the first stage (zero on Megatron's inputs)."""
    m = cfg.model
    out = _bias_params_per_layer(m) * m.num_layers * frac / layout.tp
    if m.position_embedding_type == "learned_absolute":
        out += m.max_position_embeddings * m.hidden_size
    return out


def _last_stage_dense(
    cfg: RunConfig,
    layout: Layout,
    t: dict[str, float],
    tp_block: float,
    rep_block: float,
    exp_block: float,
    etp_ep: int,
) -> tuple[float, float] | None:
    """(dense, expert) params on the last stage of an uneven split; ``None`` when even."""
    st = layout.stage_layers
    if st is None or len(set(st)) == 1 or layout.pp == 1 or cfg.model.num_layers == 0:
        return None
    frac = st[-1] / cfg.model.num_layers
    m = cfg.model
    dense = tp_block * frac / layout.tp + rep_block * frac + _bias_params_per_layer(m) * m.num_layers * frac / layout.tp
    if not m.share_embeddings_and_output_weights:
        dense += t["embedding"] / layout.tp
    return dense, exp_block * frac / etp_ep


@dataclass(frozen=True)
class BytesPerParam:
    """Bytes each parameter costs, by component."""

    weight: float
    """Stored parameter."""
    grad: float
    """Main gradient."""
    optim: float
    """Optimizer state before sharding (master copy + moments)."""


def bytes_per_param(cfg: RunConfig) -> BytesPerParam:
    """Per-parameter bytes for this precision and optimizer (Megatron: 2 + 4 + 12 for bf16 Adam)."""
    pr, o = cfg.precision, cfg.optim
    weight = 1.0 if pr.fp8_param else float(param_bytes(pr))
    grad = 4.0 if main_grads_fp32(pr) else 2.0
    master = 4.0 if mixed_precision(pr) else 0.0
    moments = 4.0 if o.optimizer == "sgd" else 8.0
    if o.use_precision_aware_optimizer and o.optimizer == "adam":
        moments = float(STATE_BYTES.get(o.exp_avg_dtype, 4) + STATE_BYTES.get(o.exp_avg_sq_dtype, 4))
        if master:
            master = float(STATE_BYTES.get(o.main_params_dtype, 4))
            if master == 4 and o.store_param_remainders and param_dtype(pr) == "bfloat16" and not pr.fp8_param:
                master = 2.0  # the fp32 master's low 16 bits; the bf16 parameter holds the rest
    return BytesPerParam(weight=weight, grad=grad, optim=master + moments)


STATE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of an optimizer-state dtype (``optim.*_dtype``)."""


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Bytes of one checkpoint: every trained parameter's stored weight and optimizer state (master copy and
    moments), ``bytes_per_param``'s weight + optim; gradients are not saved. With LoRA the adapters only (the
    frozen base stays in ``checkpoint.load``)."""
    bpp = bytes_per_param(cfg)
    trained = lora_params(cfg) if cfg.peft.type == "lora" else count_parameters(cfg.model).total
    return int(trained * (bpp.weight + bpp.optim))


def lora_params(cfg: RunConfig, layers: float | None = None) -> float:
    """LoRA adapter parameters of ``layers`` transformer layers (default: all of them); 0 without ``peft=lora``."""
    if cfg.peft.type != "lora":
        return 0.0
    n = cfg.model.num_layers if layers is None else layers
    return float(lora_params_per_layer(cfg.model, cfg.peft.dim, cfg.peft.target_modules)) * n


def lora_params_on_stage(cfg: RunConfig, lay: Layout) -> float:
    """Adapter parameters on one GPU of the stage with the most layers (split over TP like their base)."""
    layers = max(lay.stage_layers) if lay.stage_layers else cfg.model.num_layers / max(1, lay.pp)
    return lora_params(cfg, layers) / max(1, lay.tp)


# --- activations ----------------------------------------------------------------------------------


def _pipeline_factor(a: SimpleNamespace, num_microbatches: int | None) -> float:
    pp, vp = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size
    if vp is not None:
        return 1 + ((pp - 1) / (pp * vp))
    if pp > 1 and num_microbatches is not None:
        return min(1, num_microbatches / pp)
    return 1.0


def activations_sp_selective(a: SimpleNamespace, num_microbatches: int | None) -> float:
    """Megatron's ``compute_activation_memory`` (SP + selective recompute), bytes per GPU."""
    s, b, h, pp = a.seq_length, a.micro_batch_size, a.hidden_size, a.pipeline_model_parallel_size
    act = (s * b * h) * (18 + (4 * (a.activation_ffn_hidden_size / h)))
    if getattr(a, "fp8_linear_inputs", False):  # QKV, proj, fc1, fc2 inputs kept in 1 byte, not 2
        act -= (s * b * h) * (3 + a.activation_ffn_hidden_size / h)
    act *= a.activation_num_layers
    act += 8 * s * b * pp
    act += s * b * h * pp
    if a.virtual_pipeline_model_parallel_size is not None or pp > 1:
        act *= _pipeline_factor(a, num_microbatches)
    if pp == 1:
        act += s * b * h * 4 * (1 + (a.padded_vocab_size / h))
    return act / a.tensor_model_parallel_size


def activations_no_sp(a: SimpleNamespace, num_microbatches: int | None) -> float:
    """Megatron's ``compute_activation_memory_without_sp``, bytes per GPU (5% overhead included)."""
    s, b, h, pp, tp = (
        a.seq_length,
        a.micro_batch_size,
        a.hidden_size,
        a.pipeline_model_parallel_size,
        a.tensor_model_parallel_size,
    )
    ffn_scale = a.activation_ffn_hidden_size / a.ffn_hidden_size if a.ffn_hidden_size else 1.0
    per_layer = s * b * h * (10 + (24 / tp) * _mlp_share(ffn_scale, h, a.ffn_hidden_size))
    if getattr(a, "fp8_linear_inputs", False):  # QKV and fc1 inputs (2 of 10), proj and fc2 (5 of 24 / t)
        per_layer -= s * b * h * (2 + (5 / tp) * _mlp_share(ffn_scale, h, a.ffn_hidden_size))
    act = per_layer * a.activation_num_layers
    act += 8 * s * b * pp
    act += s * b * h * pp
    if a.virtual_pipeline_model_parallel_size is not None or pp > 1:
        act *= _pipeline_factor(a, num_microbatches)
    if pp == 1:
        logits = s * b * a.padded_vocab_size
        logits /= tp
        act += (logits + s * b * h) * 2
    return act * 1.05


def _mlp_share(ffn_scale: float, h: int, ffn: int) -> float:
    """Scale of the TP-sharded term for MoE (identity 1.0 for a dense model)."""
    if ffn_scale == 1.0:
        return 1.0
    # 24 sbh/t = (8 + 16 * ffn/(4h)) sbh/t: attention's share stays, the MLP's scales with width.
    return (8 + 16 * ffn_scale * ffn / (4 * h)) / 24


def activations_full_recompute(cfg: RunConfig, a: SimpleNamespace, num_microbatches: int | None) -> float:
    """Full recompute: stored layer inputs for every in-flight micro-batch + one unit's working set."""
    p = cfg.parallel
    s, b, h, tp = a.seq_length, a.micro_batch_size, a.hidden_size, a.tensor_model_parallel_size
    sp = tp if p.sequence_parallel else 1
    k = max(1, p.recompute_num_layers or 1)
    layers = a.activation_num_layers  # layers of the first stage * PP micro-batches in flight
    per_layer_full = s * b * h * (10 + 24 / tp) * 1.05
    if p.recompute_method == "block":
        stage_layers = max(1, layers // max(1, a.pipeline_model_parallel_size))
        chunks = a.virtual_pipeline_model_parallel_size or 1
        frac = min(1.0, k * chunks / stage_layers)
        stored = layers * (frac * 2 * s * b * h / sp + (1 - frac) * per_layer_full)
    else:
        stored = (layers / k) * 2 * s * b * h / sp
    stored += 8 * s * b * a.pipeline_model_parallel_size + s * b * h * a.pipeline_model_parallel_size
    stored *= _pipeline_factor(a, num_microbatches)
    working = k * per_layer_full
    if a.pipeline_model_parallel_size == 1:
        stored += (s * b * a.padded_vocab_size / tp + s * b * h) * 2
    return stored + working


def attention_scores_bytes(cfg: RunConfig, a: SimpleNamespace) -> float:
    """The s x s attention scores (5 a s^2 b / t bytes per layer, Table 2) when they are stored.

    Fused/flash attention (``attention_backend`` auto/flash/fused) never stores them, and selective
    recompute drops them; only ``unfused``/``local`` attention without selective recompute keeps them.
    """
    backend = getattr(cfg.model, "attention_backend", "auto")
    if backend not in ("unfused", "local") or cfg.parallel.recompute_granularity is not None:
        return 0.0
    s, b = a.seq_length, a.micro_batch_size
    per_layer = 5 * a.num_attention_heads * s * s * b / a.tensor_model_parallel_size
    return per_layer * a.activation_num_layers * _pipeline_factor(a, None)


def activation_bytes(cfg: RunConfig, a: SimpleNamespace, num_microbatches: int | None) -> float:
    """Activation bytes per GPU: Megatron's SP formula with sequence parallel, its no-SP one without.

    ``report_theoretical_memory`` uses the SP formula only with selective recompute; selective
    recompute removes exactly the s x s attention scores, which fused/flash attention never stores,
    so kilocard uses it whenever SP is on and adds the scores only for unfused attention.
    """
    p = cfg.parallel
    if p.recompute_granularity == "full":
        act = activations_full_recompute(cfg, a, num_microbatches)
    elif p.sequence_parallel:
        act = activations_sp_selective(a, num_microbatches) + attention_scores_bytes(cfg, a)
    else:
        act = activations_no_sp(a, num_microbatches) + attention_scores_bytes(cfg, a)
    return act * param_bytes(cfg.precision) / 2  # the formulas count 2-byte activations


# --- the estimate ---------------------------------------------------------------------------------


def optimizer_shards(cfg: RunConfig, lay: Layout) -> tuple[int, int]:
    """Ranks the optimizer state is sharded over: (dense params: DP*CP, experts: expert-DP); 1 without
    the distributed optimizer."""
    if not cfg.parallel.use_distributed_optimizer:
        return 1, 1
    return lay.dp_cp, lay.expert_dp or 1


FSDP_SHARDS = {"optim_grads": ("grads",), "optim_grads_params": ("grads", "params")}
"""What Megatron-FSDP shards over the data-parallel ranks besides the optimizer state, per strategy."""

FSDP_GATHERED_LAYERS = {"params": 2, "grads": 1}
"""Layers held unsharded at once under Megatron-FSDP: the weights of the layer running and of the one
prefetched (``fsdp_double_buffer``, which Megatron-Bridge's Megatron-FSDP recipes set), the gradients of
the layer whose reduce-scatter is pending."""


def fsdp_sharded(cfg: RunConfig, what: str) -> bool:
    """Whether Megatron-FSDP shards ``what`` (``params`` or ``grads``) over the data-parallel ranks."""
    p = cfg.parallel
    return p.use_megatron_fsdp and what in FSDP_SHARDS.get(p.data_parallel_sharding_strategy, ())


def _fsdp_held(params: float, ranks: int | None, gathered: float) -> float:
    """Parameters (or gradients) one GPU holds of ``params`` sharded over ``ranks``: its shard plus the
    ``gathered`` share held whole at once; all of them when nothing shards them."""
    if not ranks or ranks <= 1:
        return params
    return min(params, params / ranks + params * gathered)


def _state_bytes(cfg: RunConfig, lay: Layout, a: SimpleNamespace) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, parameters) on one GPU of the most loaded stage, unrounded."""
    sp = stage_params(cfg, lay, a)
    bpp = bytes_per_param(cfg)
    dense_shard, expert_shard = optimizer_shards(cfg, lay)
    if cfg.peft.type == "lora":  # the base frozen: weights only; the adapters trained
        adapters = lora_params_on_stage(cfg, lay)
        base = sp.dense + sp.expert
        return (base + adapters) * bpp.weight, adapters * bpp.grad, adapters * bpp.optim / dense_shard, base + adapters
    params = sp.dense + sp.expert
    optim = sp.dense * bpp.optim / dense_shard + sp.expert * bpp.optim / expert_shard
    state = []
    for what, per in (("params", bpp.weight), ("grads", bpp.grad)):
        if not fsdp_sharded(cfg, what):
            state.append(params * per)
            continue
        layers = max(1, max(lay.stage_layers or [cfg.model.num_layers // max(1, lay.pp)]))
        gathered = min(1.0, FSDP_GATHERED_LAYERS[what] / layers)
        held = sum(_fsdp_held(n, ranks, gathered) for n, ranks in ((sp.dense, lay.dp_cp), (sp.expert, lay.expert_dp)))
        state.append(held * per)
    return state[0], state[1], optim, params


def estimate_memory(cfg: RunConfig, layout: Layout | None = None) -> MemoryEstimate:
    """Bytes per GPU on the most loaded pipeline stage of ``cfg`` (see the module docstring)."""
    lay = layout or compute_layout(cfg)
    a = megatron_memory_args(cfg, lay)
    weights, grads, optim, params = _state_bytes(cfg, lay, a)
    act = activation_bytes(cfg, a, lay.num_microbatches)
    return MemoryEstimate(
        weights=_round(weights),
        gradients=_round(grads),
        optimizer=_round(optim),
        activations=_round(act),
        params_on_stage=_round(params),
    )


def weight_and_optimizer_bytes(cfg: RunConfig, layout: Layout | None = None) -> float:
    """Unrounded weights + gradients + optimizer bytes (what Megatron's formula returns)."""
    lay = layout or compute_layout(cfg)
    weights, grads, optim, _ = _state_bytes(cfg, lay, megatron_memory_args(cfg, lay))
    return weights + grads + optim


def _round(x: float) -> int:
    return int(math.ceil(x)) if math.isfinite(x) else 0
