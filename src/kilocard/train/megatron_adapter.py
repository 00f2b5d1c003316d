"""The only place that builds Megatron-Core objects: parallel state, GPTModel chunks, DDP,
optimizer, LR scheduler and the forward step. The config classes get every ``RunConfig`` field
they take under its own name from ``kilocard.config.megatron.megatron_kwargs``; nothing here owns
a loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kilocard.backends import Backend
from kilocard.config.dtypes import main_grads_fp32, mixed_precision, param_dtype
from kilocard.config.megatron import megatron_kwargs
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.layout import Layout, megatron_sizes
from kilocard.perf.params import padded_vocab_size

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class UnsupportedConfig(Exception):
    """The config asks for something this backend cannot build (message names the field and the fix)."""


@dataclass
class Built:
    """The Megatron-Core objects of one rank."""

    model: list[Any]
    """Model chunks (one per virtual pipeline stage), each wrapped in Megatron-Core DDP."""
    optimizer: Any
    """MegatronOptimizer (possibly a ChainedOptimizer for MoE)."""
    scheduler: Any
    """OptimizerParamScheduler stepping once per optimizer step."""
    config: Any
    """The TransformerConfig the chunks share."""
    forward_backward: Callable
    """Megatron-Core schedule from ``get_forward_backward_func``."""


def parallel_state_kwargs(lay: Layout, timeout_minutes: int) -> dict[str, Any]:
    """The keywords of ``parallel_state.initialize_model_parallel`` for ``lay``: its degrees under Megatron-Core's
    names (``kilocard.layout.megatron_sizes``), its rank order and the collective timeout."""
    return {**megatron_sizes(lay), "order": lay.order, "distributed_timeout_minutes": timeout_minutes}


def init_parallel_state(lay: Layout, timeout_minutes: int) -> None:
    """``parallel_state.initialize_model_parallel`` for the run's layout (``kilocard.layout.compute_layout``)."""
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(**parallel_state_kwargs(lay, timeout_minutes))


def seed_all(seed: int) -> None:
    """Seed python, numpy, torch and Megatron's tensor-parallel RNG tracker (Megatron-LM's recipe)."""
    import random

    import numpy as np
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    seed = seed + 100 * ps.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)


def _activation(name: str) -> tuple[Callable, bool]:
    """(activation_func, forces gated_linear_unit) for ``model.activation``."""
    if name == "swiglu":
        return F.silu, True
    if name == "gelu":
        return F.gelu, False
    if name == "quick_gelu":
        from megatron.core.activations import quick_gelu

        return quick_gelu, False
    if name == "squared_relu":
        from megatron.core.activations import squared_relu

        return squared_relu, False
    raise UnsupportedConfig(f"model.activation: {name!r} is not one of gelu, swiglu, squared_relu, quick_gelu")


def _attention_backend(name: str) -> Any:
    """``AttnBackend`` member for ``model.attention_backend``."""
    from megatron.core.transformer.enums import AttnBackend

    if name not in AttnBackend.__members__:
        raise UnsupportedConfig(
            f"model.attention_backend: {name!r} is not one of {', '.join(AttnBackend.__members__)}; "
            "set model.attention_backend=auto"
        )
    return AttnBackend[name]


def check_query_projection(run_cfg: RunConfig) -> None:
    """``UnsupportedConfig`` for multi-latent attention without a query latent (``q_lora_rank`` null, DeepSeek-V2-Lite's
    layout) where Megatron-Core builds it differently: from 0.19 (its ``mla_qk_norm_config``) ``qk_layernorm`` then
    fuses a norm into ``linear_q_proj``, normalising the query projection's input a second time, which 0.16 and
    Hugging Face's DeepSeek models do not (0.16.1 builds no query norm there)."""
    import importlib.util

    m = run_cfg.model
    if not (m.multi_latent_attention and m.q_lora_rank is None and m.qk_layernorm):
        return
    if importlib.util.find_spec("megatron.core.transformer.mla_qk_norm_config") is not None:
        from megatron.core import __version__

        raise UnsupportedConfig(
            f"model.q_lora_rank: null with model.qk_layernorm=true: megatron-core {__version__} puts a second norm "
            f"before linear_q_proj (DeepSeek-V2-Lite and megatron-core 0.16 have none); set model.q_lora_rank, or "
            f"use megatron-core 0.16"
        )


def transformer_config(run_cfg: RunConfig, backend: Backend) -> Any:
    """The TransformerConfig (MLATransformerConfig for multi-latent attention) of the run.

    Every schema field the class takes comes through ``megatron_kwargs`` under its own name; what
    follows only converts names to objects (dtype, activation, attention backend) and switches off
    what the backend cannot run.
    """
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    m, p, pr = run_cfg.model, run_cfg.parallel, run_cfg.precision
    check_query_projection(run_cfg)
    cls = MLATransformerConfig if m.multi_latent_attention else TransformerConfig
    act, gated = _activation(m.activation)
    dtype = _DTYPES[param_dtype(pr)]
    if p.cpu_offloading and not backend.is_cuda:
        raise UnsupportedConfig(
            "parallel.cpu_offloading: activation offloading needs GPUs; set parallel.cpu_offloading=false"
        )
    if pr.fp8 and not (backend.is_cuda and not backend.local_spec):
        raise UnsupportedConfig(f"precision.fp8: {pr.fp8!r} needs Transformer Engine on GPUs; set precision.fp8=null")
    interleaved_overlap = p.overlap_p2p_comm and p.virtual_pipeline_model_parallel_size is not None
    kw: dict[str, Any] = megatron_kwargs(run_cfg, cls)
    kw.update(
        gated_linear_unit=m.gated_linear_unit or gated,
        activation_func=act,
        attention_backend=_attention_backend(m.attention_backend),
        overlap_p2p_comm=interleaved_overlap,
        batch_p2p_comm=not interleaved_overlap,
        tp_comm_overlap=p.tp_comm_overlap and backend.is_cuda,
        moe_grouped_gemm=m.moe_grouped_gemm and backend.is_cuda and not backend.local_spec,
        cuda_graph_impl=m.cuda_graph_impl if backend.is_cuda else "none",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        deterministic_mode=run_cfg.trainer.deterministic,
        use_cpu_initialization=not backend.is_cuda,
    )
    if not backend.is_cuda:
        # No fused kernels, no CUDA-side p2p synchronisation on CPU ranks.
        kw.update(
            gradient_accumulation_fusion=False,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            masked_softmax_fusion=False,
            persist_layer_norm=False,
            apply_rope_fusion=False,
            cross_entropy_loss_fusion=False,
            batch_p2p_sync=False,
        )
    if m.window_size is not None:
        kw["window_size"] = tuple(m.window_size)  # Megatron-Core (and TE) take a (left, right) tuple
        # The fused masked-softmax kernel of the local attention applies a full causal mask, not the window.
        kw["masked_softmax_fusion"] = False
    if m.multi_latent_attention:
        kw["rotary_base"] = m.rotary_base  # a GPTModel argument that MLA's config also takes
    config = cls(**kw)
    if m.position_embedding_type == "yarn" and not m.multi_latent_attention:
        for name, value in yarn_attributes(m).items():
            setattr(config, name, value)
    return config


def yarn_attributes(m: ModelConfig) -> dict[str, Any]:
    """The attributes ``GPTModel``'s YaRN rotary embedding (``position_embedding_type: yarn``) and its attention
    read from the config: no ``TransformerConfig`` field holds them (Megatron-Bridge's GPT-OSS provider declares
    them); their presence also makes the attention scale queries and keys by YaRN's temperature."""
    return {
        "yarn_rotary_scaling_factor": m.rotary_scaling_factor,
        "yarn_original_max_position_embeddings": m.original_max_position_embeddings,
        "yarn_beta_fast": m.beta_fast,
        "yarn_beta_slow": m.beta_slow,
        "yarn_mscale": m.mscale,
        "yarn_mscale_all_dim": m.mscale_all_dim,
        "yarn_correction_range_round_to_int": m.yarn_correction_range_round_to_int,
    }


def dataset_attention_mask(run_cfg: RunConfig, backend: Backend) -> bool:
    """Whether the dataset builds the attention mask (``GPTDatasetConfig.create_attention_mask``): only for
    ``data.reset_attention_mask`` on Megatron-Core's local attention, which takes the block-diagonal mask;
    otherwise attention is causal (Megatron builds the mask) or THD (``packed_thd``)."""
    return run_cfg.data.reset_attention_mask and backend.local_spec


def packed_thd(run_cfg: RunConfig, backend: Backend) -> bool:
    """Whether packed sequences reach attention in the THD layout (``packed_seq_params``): ``data.reset_attention_mask``
    with Transformer Engine, whose attention takes ``cu_seqlens`` (Megatron-Core's local attention does not)."""
    return run_cfg.data.reset_attention_mask and not backend.local_spec


def check_packed_thd(run_cfg: RunConfig, backend: Backend) -> None:
    """``UnsupportedConfig`` for what the THD layout cannot take here: several sequences per micro-batch
    (Transformer Engine's THD attention reads one packed row) and context parallelism (Megatron-Core's
    ``get_batch_on_this_cp_rank`` splits BSHD sequences only)."""
    if not packed_thd(run_cfg, backend):
        return
    t, p = run_cfg.trainer, run_cfg.parallel
    if t.micro_batch_size != 1:
        raise UnsupportedConfig(
            f"trainer.micro_batch_size: {t.micro_batch_size} with data.reset_attention_mask packs in the THD "
            f"layout on Transformer Engine, one sequence per micro-batch; set trainer.micro_batch_size=1"
        )
    if p.context_parallel_size > 1:
        raise UnsupportedConfig(
            f"parallel.context_parallel_size: {p.context_parallel_size} with data.reset_attention_mask (THD "
            f"packing) is not built by kilocard; set parallel.context_parallel_size=1, "
            f"or data.reset_attention_mask=false"
        )


def cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """The cumulative sequence lengths of a packed row (int32): every index where the position ids restart at 0
    (``data.reset_position_ids``), then the row's length; a micro-batch of several rows is read as one row."""
    flat = position_ids.reshape(-1)
    starts = (flat == 0).nonzero().reshape(-1)
    end = torch.tensor([flat.numel()], dtype=starts.dtype, device=starts.device)
    return torch.cat([starts, end]).to(torch.int32)


def packed_seq_params(position_ids: torch.Tensor) -> Any:
    """Megatron-Core's ``PackedSeqParams`` (THD) for a packed micro-batch: one sequence per conversation."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = cu_seqlens(position_ids)
    longest = int((cu[1:] - cu[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest, max_seqlen_kv=longest
    )


def layer_spec(run_cfg: RunConfig, config: Any, backend: Backend, vp_stage: int | None = None) -> Any:
    """The decoder's spec on Transformer Engine modules on GPUs that have it, Megatron-Core's local ones
    otherwise: one layer spec for a dense model; for an MoE model Megatron-Core's block spec, whose dense
    and MoE layers follow ``moe_layer_freq`` (this pipeline stage's slice of them)."""
    m = run_cfg.model
    from megatron.core.models.gpt import gpt_layer_specs as specs

    from kilocard.train.mla_attention import use_local_mla_attention

    if m.num_moe_experts:
        block = specs.get_gpt_decoder_block_spec(
            config, use_transformer_engine=not backend.local_spec, normalization=m.normalization, vp_stage=vp_stage
        )
        return use_local_mla_attention(block) if backend.local_spec else block
    if backend.local_spec:
        return use_local_mla_attention(
            specs.get_gpt_layer_local_spec(
                num_experts=None,
                moe_grouped_gemm=False,
                qk_layernorm=m.qk_layernorm,
                multi_latent_attention=m.multi_latent_attention,
                normalization=m.normalization,
            )
        )
    return specs.get_gpt_layer_with_transformer_engine_spec(
        num_experts=None,
        moe_grouped_gemm=False,
        qk_layernorm=m.qk_layernorm,
        multi_latent_attention=m.multi_latent_attention,
        fp8=run_cfg.precision.fp8,
    )


def mtp_spec(run_cfg: RunConfig, config: Any, backend: Backend, vp_stage: int | None = None) -> Any:
    """The multi-token-prediction block of this stage (``None`` without MTP, or on a stage that holds none):
    Megatron-Core's MTP layers around the model's last decoder layer, as Megatron-LM builds them."""
    if not run_cfg.model.mtp_num_layers:
        return None
    from megatron.core.models.gpt import gpt_layer_specs as specs

    from kilocard.train.mla_attention import use_local_mla_attention

    use_te = not backend.local_spec
    last = specs.get_gpt_decoder_layer_specs(config, use_te, normalization=run_cfg.model.normalization)[-1]
    last = last if use_te else use_local_mla_attention(last)
    return specs.get_gpt_mtp_block_spec(config, last, use_transformer_engine=use_te, vp_stage=vp_stage)


def build_model_chunks(run_cfg: RunConfig, config: Any, backend: Backend) -> list[Any]:
    """GPTModel chunks of this pipeline rank (one per virtual stage), on the backend's device."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel

    m = run_cfg.model
    vocab = padded_vocab_size(m, run_cfg.parallel.tensor_model_parallel_size)
    vp = run_cfg.parallel.virtual_pipeline_model_parallel_size
    chunks = []
    for stage in range(vp or 1):
        vp_stage = stage if vp else None
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(run_cfg, config, backend, vp_stage),
            vocab_size=vocab,
            max_sequence_length=m.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
            position_embedding_type=m.position_embedding_type,
            rotary_base=m.rotary_base,
            rotary_percent=m.rotary_percent,
            rope_scaling=m.rope_scaling,
            rope_scaling_factor=m.rope_scaling_factor,
            mtp_block_spec=mtp_spec(run_cfg, config, backend, vp_stage),
            vp_stage=vp_stage,
        )
        if backend.is_cuda:
            model.cuda(torch.cuda.current_device())
        chunks.append(in_mixed_precision(model, run_cfg))
    return chunks


def in_mixed_precision(model: Any, run_cfg: RunConfig) -> Any:
    """``model`` with every floating parameter in bf16/fp16 under mixed precision, as Megatron-LM's
    ``Float16Module`` casts it: the local layer spec makes its norms in fp32 whatever ``params_dtype``
    says, and Megatron-Core's fp16/bf16 optimizer keeps such a parameter outside the groups its
    checkpoint maps (a save with optimizer state would stop on ``Param id .. does not match``)."""
    if not mixed_precision(run_cfg.precision):
        return model
    dtype = _DTYPES[param_dtype(run_cfg.precision)]
    return model.to(dtype=dtype)


def apply_peft(run_cfg: RunConfig, config: Any, chunks: list[Any]) -> None:
    """``peft=lora``: freeze the chunks' weights and attach LoRA adapters (``kilocard.train.lora``) before DDP
    wraps them, so only the adapters get gradient buffers and optimizer state."""
    if run_cfg.peft.type != "lora":
        return
    from kilocard.perf.params import lora_shapes
    from kilocard.train import lora

    try:
        for c in chunks:
            lora.apply(c, run_cfg.peft, config, lora_shapes(run_cfg.model))
    except lora.LoraError as e:
        raise UnsupportedConfig(str(e)) from None


def wrap_ddp(run_cfg: RunConfig, config: Any, chunks: list[Any]) -> list[Any]:
    """Megatron-Core DistributedDataParallel around each chunk, with the overlap options."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    if run_cfg.parallel.use_megatron_fsdp:
        raise UnsupportedConfig(
            "parallel.use_megatron_fsdp: kilocard's trainer does not build Megatron-FSDP; "
            "set parallel.use_megatron_fsdp=false and parallel.use_distributed_optimizer=true"
        )
    kw = megatron_kwargs(run_cfg, DistributedDataParallelConfig)
    kw.update(grad_reduce_in_fp32=main_grads_fp32(run_cfg.precision), check_for_nan_in_grad=False)
    ddp_cfg = DistributedDataParallelConfig(**kw)
    return [
        DistributedDataParallel(config=config, ddp_config=ddp_cfg, module=c, disable_bucketing=i > 0)
        for i, c in enumerate(chunks)
    ]


def build_optimizer(run_cfg: RunConfig, chunks: list[Any]) -> Any:
    """``get_megatron_optimizer`` with the run's ``optimizer_config``."""
    from megatron.core.optimizer import get_megatron_optimizer

    return get_megatron_optimizer(optimizer_config(run_cfg), chunks)


def optimizer_config(run_cfg: RunConfig) -> Any:
    """The OptimizerConfig of ``config.optim`` (optimizer-state dtype names as torch dtypes)."""
    from megatron.core.optimizer import OptimizerConfig

    kw = megatron_kwargs(run_cfg, OptimizerConfig)
    if run_cfg.optim.use_precision_aware_optimizer and not torch.cuda.is_available():
        raise UnsupportedConfig(
            "optim.use_precision_aware_optimizer: needs Transformer Engine's FusedAdam on GPUs; "
            "set optim.use_precision_aware_optimizer=false"
        )
    for name in ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if name in kw:  # a dtype name -> the torch dtype OptimizerConfig takes
            kw[name] = _DTYPES[kw[name]]
    return OptimizerConfig(
        **kw,
        params_dtype=_DTYPES[param_dtype(run_cfg.precision)],
        overlap_param_gather_with_optimizer_step=False,
    )


def build_scheduler(run_cfg: RunConfig, optimizer: Any) -> Any:
    """OptimizerParamScheduler in optimizer steps: linear warm-up, then ``optim.lr_decay_style``."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    o, t = run_cfg.optim, run_cfg.trainer
    decay = o.lr_decay_iters or t.train_iters
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=min(o.lr_warmup_iters, max(decay - 1, 0)),
        lr_decay_steps=decay,
        lr_decay_style=o.lr_decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=decay,
        wd_incr_style="constant",
        wsd_decay_steps=max(1, decay // 10) if o.lr_decay_style == "WSD" else None,
        lr_wsd_decay_style="linear" if o.lr_decay_style == "WSD" else None,
    )


def wire_config(config: Any, model: list[Any], optimizer: Any) -> None:
    """Hooks the schedules call: no_sync, grad finalisation, loss scaling, param gather."""
    from megatron.core.distributed import finalize_model_grads

    config.no_sync_func = [m.no_sync for m in model] if len(model) > 1 else model[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    if model[0].ddp_config.overlap_param_gather:
        config.param_sync_func = [m.start_param_sync for m in model] if len(model) > 1 else model[0].start_param_sync


def build(run_cfg: RunConfig, backend: Backend) -> Built:
    """Model chunks, DDP, optimizer, scheduler and schedule for this rank (parallel state must exist)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    check_packed_thd(run_cfg, backend)
    config = transformer_config(run_cfg, backend)
    try:
        chunks = build_model_chunks(run_cfg, config, backend)
    except (AssertionError, NotImplementedError, ImportError) as e:
        if run_cfg.parallel.context_parallel_size > 1 and backend.local_spec:
            raise UnsupportedConfig(
                f"parallel.context_parallel_size: {run_cfg.parallel.context_parallel_size} needs Transformer "
                f"Engine's attention, which Megatron-Core's local layer spec lacks ({type(e).__name__}: {e}); "
                f"set parallel.context_parallel_size=1 here, or run it on GPUs with Transformer Engine"
            ) from None
        raise
    apply_peft(run_cfg, config, chunks)
    model = wrap_ddp(run_cfg, config, chunks)
    optimizer = build_optimizer(run_cfg, model)
    scheduler = build_scheduler(run_cfg, optimizer)
    wire_config(config, model, optimizer)
    return Built(
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        config=config,
        forward_backward=get_forward_backward_func(),
    )


def masked_lm_loss(per_token: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the per-token losses (GPTModel's output given labels) over the tokens ``loss_mask`` marks: a
    target with mask 0 (padding; under ``data.sft`` every non-assistant token) has no effect on the loss."""
    m = loss_mask.reshape(-1).float()
    return torch.sum(per_token.float().reshape(-1) * m) / m.sum().clamp(min=1.0)


def cp_shard(batch: dict[str, Any]) -> dict[str, Any]:
    """This context-parallel rank's share of ``batch`` (Megatron-Core's ``get_batch_on_this_cp_rank``); the
    batch itself without context parallelism. Megatron-Core 0.19 added a required ``is_hybrid_cp``
    argument (hierarchical CP, which kilocard does not configure), so it is passed where the call takes it."""
    from megatron.core import parallel_state as ps

    if ps.get_context_parallel_world_size() == 1:
        return batch
    import inspect

    from megatron.core.utils import get_batch_on_this_cp_rank

    if "is_hybrid_cp" in inspect.signature(get_batch_on_this_cp_rank).parameters:
        return get_batch_on_this_cp_rank(batch, is_hybrid_cp=False)
    return get_batch_on_this_cp_rank(batch)


def forward_step(data_iterator: Any, model: Any, thd: bool = False) -> tuple[torch.Tensor, Callable]:
    """Megatron-Core forward step: one micro-batch through the chunk, masked mean LM loss.

    Under context parallelism each rank keeps its two sequence chunks (Megatron-LM's
    ``get_batch_on_this_cp_rank``: GPTModel takes the rank's shard, not the whole sequence); the loss
    is then its shard's, and the mean over all last-stage ranks (the trainer's) is the whole sequence's.
    ``thd`` (``packed_thd``): the packed conversations go to attention as ``PackedSeqParams``.
    """
    raw = next(data_iterator)
    dev = next(model.parameters()).device

    def on_device(t: torch.Tensor) -> torch.Tensor:
        return t if t.device == dev else t.to(dev, non_blocking=True)

    keys = ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")
    on_rank = {k: on_device(raw[k]) for k in keys if raw.get(k) is not None}
    batch = cp_shard({**dict.fromkeys(keys), **on_rank})
    tokens, labels, loss_mask, position_ids = (batch[k] for k in keys[:4])
    mask = batch["attention_mask"]
    packed = packed_seq_params(position_ids) if thd else None
    output = model(tokens, position_ids, mask, labels=labels, loss_mask=loss_mask, packed_seq_params=packed)

    def loss_func(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        loss = masked_lm_loss(output_tensor, loss_mask)
        return loss, {"lm loss": loss.detach().clone()}  # the schedule divides `loss` in place

    return output, loss_func
