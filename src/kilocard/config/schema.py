"""Typed schema of a kilocard run: one dataclass per Hydra config group.

Field names are Megatron-Core's own (``TransformerConfig``, ``ModelParallelConfig``,
``OptimizerConfig``, ``DistributedDataParallelConfig``, ``GPTModel``) wherever Megatron-Core has
the knob; ``tests/config/test_config_megatron_names.py`` proves it against the pinned wheel, and
``KILOCARD_OWN_FIELDS`` lists the fields that are kilocard's own, each with its reason.

Every field carries a docstring (the string literal under it); a test keeps it that way.
The tree is composed by Hydra in struct mode and then converted to these dataclasses with
``OmegaConf.to_object``; treat the result as read-only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PACKAGING_MODES = ("snapshot", "image", "none")
WANDB_MODES = ("online", "offline")
"""``trainer.wandb_mode`` values (``wandb.init(mode=...)``)."""
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
"""Megatron-Core's linear layers of a transformer layer a LoRA adapter can wrap (``peft.target_modules``):
the first and third column-parallel, the others row-parallel."""
LORA_INIT_METHODS = ("xavier", "kaiming", "normal", "zero")
"""``peft.lora_A_init_method`` / ``lora_B_init_method`` values (Megatron-Bridge's ``ParallelLinearAdapter``)."""
BYTES_TOKENIZER = "kilocard-bytes"
"""``data.tokenizer`` naming kilocard's built-in UTF-8 byte tokenizer (``kilocard.data.byte_tokenizer``)."""
"""How a Slurm job gets kilocard's code (``launcher.packaging``): a wheel in the run directory, the
container image, or the environment already holds it."""


@dataclass(kw_only=True)
class ModelConfig:
    """Architecture of the GPT-style model (Megatron-Core ``TransformerConfig`` + ``GPTModel``)."""

    name: str = "tiny_gpt"
    """Human-readable model name, e.g. ``llama3_70b``."""
    num_layers: int = 2
    """Number of transformer layers."""
    hidden_size: int = 64
    """Transformer hidden size (model width)."""
    ffn_hidden_size: int | None = None
    """Hidden size of the dense MLP; ``None`` means 4 * hidden_size (Megatron-Core's default)."""
    num_attention_heads: int = 4
    """Number of attention (query) heads."""
    num_query_groups: int | None = None
    """Key/value head groups for grouped-query attention; ``None`` means multi-head attention."""
    kv_channels: int | None = None
    """Projection size per attention head; ``None`` means hidden_size / num_attention_heads."""
    seq_length: int = 32
    """Training sequence length in tokens."""
    max_position_embeddings: int = 32
    """Largest position the model supports (``GPTModel.max_sequence_length``); must be >= seq_length."""
    vocab_size: int = 258
    """Vocabulary size, before padding to a multiple of TP * 128 as Megatron-LM does."""
    make_vocab_size_divisible_by: int = 128
    """Pad the vocabulary to a multiple of this times TP (Megatron-LM's ``--make-vocab-size-divisible-by``)."""
    normalization: str = "LayerNorm"
    """``LayerNorm`` or ``RMSNorm``."""
    layernorm_epsilon: float = 1e-5
    """Epsilon of the normalisation layers."""
    gated_linear_unit: bool = False
    """Use a gated MLP (SwiGLU when paired with ``activation: swiglu``)."""
    activation: str = "gelu"
    """MLP activation: ``gelu``, ``swiglu`` (silu + gated_linear_unit), ``squared_relu`` or ``quick_gelu``
    (``x * sigmoid(1.702 x)``; with ``gated_linear_unit``, ``glu_linear_offset`` and
    ``activation_func_clamp_value``: GPT-OSS's clamped SwiGLU)."""
    glu_linear_offset: float = 0.0
    """Gated MLPs: added to the linear half before the product, ``act(gate) * (up + offset)`` (GPT-OSS: 1.0)."""
    activation_func_clamp_value: float | None = None
    """Gated MLPs: clamp the gate half to at most this and the linear half to +-this before the product
    (GPT-OSS: 7.0); ``None``: no clamp."""
    add_bias_linear: bool = True
    """Bias terms in the linear layers (GPT-3: true; Llama: false)."""
    add_qkv_bias: bool = False
    """Bias only on the QKV projection (Qwen-style)."""
    position_embedding_type: str = "learned_absolute"
    """``learned_absolute``, ``rope``, ``yarn`` (YaRN-scaled RoPE, GPT-OSS's: ``rotary_scaling_factor``,
    ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``,
    ``yarn_correction_range_round_to_int``) or ``none`` (``GPTModel`` argument)."""
    rotary_base: int = 10000
    """RoPE base period (``GPTModel`` argument)."""
    rotary_percent: float = 1.0
    """Fraction of the head dimension that RoPE rotates (``GPTModel`` argument)."""
    rope_scaling: bool = False
    """Llama 3.1 RoPE frequency scaling (``GPTModel`` argument; Megatron-Core fixes low/high frequency
    factors 1 and 4 and an original context of 8192)."""
    rope_scaling_factor: float = 8.0
    """RoPE scaling factor when ``rope_scaling`` is on (``GPTModel`` argument)."""
    share_embeddings_and_output_weights: bool = True
    """Tie the input embedding and the output layer (``GPTModel`` argument)."""
    hidden_dropout: float = 0.0
    """Dropout after attention and MLP."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities."""
    attention_backend: str = "auto"
    """Attention kernels (``TransformerConfig.attention_backend``): ``auto``, ``flash``, ``fused``,
    ``unfused`` or ``local``; ``local``/``unfused`` materialise the s x s scores (the step-time model
    charges their memory traffic)."""
    window_size: list[int] | None = None
    """Sliding-window attention: ``[left, right]`` tokens each query sees besides itself (GPT-OSS: ``[127, 0]``,
    causal: its 128-token window counts the query); ``None``: full attention."""
    window_attn_skip_freq: Any = None
    """Which layers keep full attention under ``window_size``: an int ``k`` (every k-th layer full, GPT-OSS: 2)
    or one 0/1 per layer (1 = windowed); ``None``: every layer windowed."""
    softmax_type: str = "vanilla"
    """Attention softmax: ``vanilla``, ``off-by-one`` (a zero logit added to every row) or ``learnable`` (a
    learned per-head sink logit, GPT-OSS's attention sinks)."""
    cuda_graph_impl: str = "none"
    """CUDA graph capture (``TransformerConfig.cuda_graph_impl``): ``none``, ``local`` (Megatron-Core's
    own: each layer, or the whole iteration) or ``transformer_engine`` (the modules in
    ``cuda_graph_scope``); a captured module launches as one graph (GPU only; the performance model
    charges no launch overhead for what is captured)."""
    cuda_graph_scope: list[str] = field(default_factory=list)
    """What ``cuda_graph_impl`` captures (``TransformerConfig.cuda_graph_scope``): empty means the whole
    layer, ``full_iteration`` (``local``) the whole step; with ``transformer_engine`` a list of ``attn``,
    ``mlp``, ``moe``, ``moe_router``, ``moe_preprocess``."""
    cross_entropy_loss_fusion: bool = False
    """Fused vocab-parallel cross-entropy (``TransformerConfig.cross_entropy_loss_fusion``; Megatron-Core's
    default off: the eager ``tensor_parallel/cross_entropy.py`` path). The step-time model charges each
    path's HBM traffic per logit (``perf.steptime.CROSS_ENTROPY_BYTES``)."""
    cross_entropy_fusion_impl: str = "native"
    """Which fused cross-entropy runs when ``cross_entropy_loss_fusion`` is on: ``native`` (Megatron-Core's
    ``fusions/fused_cross_entropy.py``, ``torch.compile``-fused) or ``te`` (Transformer Engine's Triton
    ``parallel_cross_entropy``)."""
    init_method_std: float = 0.02
    """Standard deviation of the weight initialisation."""
    num_moe_experts: int | None = None
    """Routed experts per MoE layer; ``None`` means a dense model."""
    moe_router_topk: int = 2
    """Experts each token is routed to."""
    moe_ffn_hidden_size: int | None = None
    """Hidden size of each routed expert's MLP; ``None`` means ffn_hidden_size."""
    moe_shared_expert_intermediate_size: int | None = None
    """Total hidden size of the shared experts (DeepSeek style); ``None`` means no shared expert."""
    moe_layer_freq: Any = 1
    """MoE layer pattern: an int (every k-th layer is MoE) or a list of 0/1 per layer."""
    moe_token_dispatcher_type: str = "alltoall"
    """Token dispatcher: ``alltoall``, ``allgather`` or ``flex``."""
    moe_router_load_balancing_type: str = "aux_loss"
    """Router balancing: ``aux_loss``, ``seq_aux_loss``, ``sinkhorn`` or ``none``."""
    moe_aux_loss_coeff: float = 0.0
    """Weight of the load-balancing auxiliary loss."""
    moe_router_score_function: str = "softmax"
    """Router scoring: ``softmax`` or ``sigmoid`` (DeepSeek-V3)."""
    moe_router_pre_softmax: bool = False
    """Softmax over all experts before the top-k selection (``softmax`` scores only: sigmoid scores are
    always taken before it); the default takes the softmax over the k selected logits."""
    moe_router_topk_scaling_factor: float | None = None
    """Multiply the selected experts' routing weights by this (DeepSeek-V3: 2.5, Kimi-K2: 2.827);
    ``None``: no scaling."""
    moe_router_num_groups: int | None = None
    """Group-limited routing: the experts are split into this many equal groups (DeepSeek-V3: 8, one
    per node of its EP group); needs ``moe_router_group_topk``. ``None``: no groups."""
    moe_router_group_topk: int | None = None
    """Group-limited routing: groups each token may use, ranked by the sum of their best
    ``moe_router_topk / moe_router_group_topk`` scores (DeepSeek-V3: 4). ``None``: no groups."""
    moe_router_enable_expert_bias: bool = False
    """Auxiliary-loss-free balancing (DeepSeek-V3): a per-expert bias, added to the sigmoid scores for
    the choice only, is raised for under-loaded experts and lowered for over-loaded ones after every
    step (a buffer of the router, saved with the model). Sigmoid scores only."""
    moe_router_bias_update_rate: float = 1.0e-3
    """With ``moe_router_enable_expert_bias``: the step by which each expert's bias moves per global batch
    (DeepSeek-V3: 1e-3, then 0 for its last 500B tokens)."""
    moe_router_dtype: str | None = None
    """Dtype of the router's scores and of the weighted sum of the experts' outputs: ``fp32`` or ``fp64``;
    ``None``: the model's dtype (Megatron-Core recommends fp32 for many fine-grained experts)."""
    moe_grouped_gemm: bool = False
    """Grouped GEMM for the experts (GPU only; needs Transformer Engine or grouped_gemm)."""
    multi_latent_attention: bool = False
    """Multi-latent attention (DeepSeek-V2/V3); enables the ``q_lora_rank``.. fields below."""
    q_lora_rank: int | None = None
    """MLA: rank of the query down-projection; ``None`` means no query compression."""
    kv_lora_rank: int = 512
    """MLA: rank of the key/value down-projection."""
    qk_head_dim: int = 128
    """MLA: per-head dimension of the non-rotary part of queries and keys."""
    qk_pos_emb_head_dim: int = 64
    """MLA: per-head dimension of the rotary part of queries and keys."""
    v_head_dim: int = 128
    """MLA: per-head dimension of the values."""
    qk_layernorm: bool = False
    """Normalise queries and keys before attention (Qwen3, OLMo 2); with multi-latent attention the
    norms of the compressed query and key/value latents (DeepSeek-V3's ``q_a_layernorm``/``kv_a_layernorm``)."""
    rope_type: str = "yarn"
    """MLA: ``rope`` (plain rotary embedding) or ``yarn`` (YaRN-scaled, DeepSeek-V3's); Megatron-Core's
    ``MLATransformerConfig`` default. Other attention takes ``position_embedding_type`` and ``rope_scaling``."""
    rotary_scaling_factor: float = 40.0
    """YaRN (MLA's ``rope_type: yarn``, or ``position_embedding_type: yarn``): the context-extension factor
    (DeepSeek-V3: 40, GPT-OSS: 32)."""
    original_max_position_embeddings: int = 4096
    """YaRN: the context the rotary frequencies were trained for (DeepSeek-V3, GPT-OSS: 4096)."""
    beta_fast: float = 32.0
    """YaRN: the high-frequency boundary (rotations per original context)."""
    beta_slow: float = 1.0
    """YaRN: the low-frequency boundary."""
    mscale: float = 1.0
    """YaRN: attention temperature factor applied to the rotary cos/sin (with ``position_embedding_type: yarn``
    the factor is ``(0.1 * mscale * ln(rotary_scaling_factor) + 1) / (0.1 * mscale_all_dim * ln(...) + 1)``)."""
    mscale_all_dim: float = 0.0
    """MLA: YaRN's temperature over all dimensions; it also scales the softmax (``0.1 * mscale_all_dim *
    ln(rotary_scaling_factor) + 1``, squared) whenever ``rotary_scaling_factor`` > 1 (DeepSeek-V3: 1.0); with
    ``position_embedding_type: yarn`` it divides ``mscale``'s factor only."""
    yarn_correction_range_round_to_int: bool = True
    """``position_embedding_type: yarn``: round YaRN's correction range to whole dimensions (transformers'
    ``truncate``; GPT-OSS: false). Megatron-Core's ``GPTModel`` reads the config attribute of this name; MLA's
    YaRN always rounds."""
    mtp_num_layers: int | None = None
    """Multi-token-prediction layers (DeepSeek-V3); ``None`` means none."""
    mtp_loss_scaling_factor: float = 0.1
    """Weight of the multi-token-prediction loss (the mean over its layers) added to the main loss
    (DeepSeek-V3: 0.3 for its first 10T tokens, then 0.1)."""


@dataclass(kw_only=True)
class ParallelConfig:
    """How the model is split over GPUs (Megatron-Core ``ModelParallelConfig`` + DDP config)."""

    tensor_model_parallel_size: int = 1
    """Tensor-parallel (TP) degree: GPUs that split each layer's GEMMs."""
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel (PP) degree: stages of consecutive layers."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Virtual stages per pipeline rank (interleaved 1F1B); ``None`` means not interleaved."""
    context_parallel_size: int = 1
    """Context-parallel (CP) degree: GPUs that split the sequence inside attention."""
    expert_model_parallel_size: int = 1
    """Expert-parallel (EP) degree: GPUs that split the experts of an MoE layer."""
    expert_tensor_parallel_size: int | None = None
    """Tensor-parallel degree inside experts (ETP); ``None`` means equal to TP."""
    sequence_parallel: bool = False
    """Shard layer-norm/dropout activations along the sequence over TP ranks (needs TP > 1)."""
    use_distributed_optimizer: bool = False
    """Shard optimizer state (and main params) over data-parallel ranks (ZeRO-1)."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduce with the backward pass."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the forward pass."""
    tp_comm_overlap: bool = False
    """Overlap TP communication with GEMMs (Transformer Engine userbuffers; GPU only)."""
    overlap_p2p_comm: bool = False
    """Overlap pipeline point-to-point sends with compute (interleaved schedule)."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Layers on the first pipeline stage when the split is uneven; ``None`` means even."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Layers on the last pipeline stage when the split is uneven; ``None`` means even."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as a layer when splitting layers over pipeline stages."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the loss/output layer as a layer when splitting layers over pipeline stages."""
    pipeline_model_parallel_layout: str | None = None
    """Megatron-Core's layer-by-layer pipeline layout (``E`` embedding, ``t`` transformer layer, ``m`` MTP
    layer, ``L`` loss; ``|`` ends a virtual stage, ``(..)*n`` and ``x*n`` repeat), e.g. ``Et*4|(t*4|)*14tL``
    for 61 layers over 16 stages; stage ``k`` runs on pipeline rank ``k mod PP``. ``None``: the split the
    fields above give. Excludes ``num_layers_in_first/last_pipeline_stage`` and the ``account_for_*`` fields."""
    cp_comm_type: str = "p2p"
    """Context-parallel exchange: ``p2p`` (ring), ``all_gather``, ``a2a`` or ``a2a+p2p``."""
    recompute_granularity: str | None = None
    """Activation recompute: ``None``, ``selective`` (attention core) or ``full``."""
    recompute_method: str | None = None
    """With full recompute: ``uniform`` or ``block``."""
    recompute_num_layers: int | None = None
    """With full recompute: layers per recompute unit (uniform) or recomputed layers (block)."""
    cpu_offloading: bool = False
    """Offload the activations of the first ``cpu_offloading_num_layers`` layers to host memory in the
    forward pass and reload them for the backward (Megatron-Core; PP 1, no recompute; CUDA only)."""
    cpu_offloading_num_layers: int = 0
    """With ``cpu_offloading``: layers whose activations are offloaded (0 to ``num_layers - 1``)."""
    use_megatron_fsdp: bool = False
    """Wrap the model in Megatron-FSDP instead of DistributedDataParallel (Megatron-Core's
    ``DistributedDataParallelConfig.use_megatron_fsdp``); what it shards is ``data_parallel_sharding_strategy``."""
    data_parallel_sharding_strategy: str = "no_shard"
    """With ``use_megatron_fsdp``: what is sharded over the data-parallel ranks, ``no_shard``, ``optim``
    (ZeRO-1), ``optim_grads`` (ZeRO-2) or ``optim_grads_params`` (ZeRO-3: weights gathered layer by layer)."""
    use_tp_pp_dp_mapping: bool = False
    """Rank order ``tp-cp-ep-pp-dp`` (pipeline stages inside, data-parallel replicas outermost) instead of
    Megatron-Core's default ``tp-cp-ep-dp-pp``: Megatron-LM's ``--use-tp-pp-dp-mapping``, the order the
    Llama 3 paper uses ([TP, CP, PP, DP], arXiv 2407.21783, Section 3.3.2)."""
    tp_within_node: bool = True
    """kilocard: require TP (and TP*CP when ``cp_within_nvlink``) inside one NVLink domain."""
    cp_within_nvlink: bool = False
    """kilocard: require the TP*CP group to stay inside one NVLink domain."""


@dataclass(kw_only=True)
class PrecisionConfig:
    """Numeric formats (Megatron-Core ``ModelParallelConfig`` / ``TransformerConfig`` / DDP config)."""

    bf16: bool = False
    """Train in bfloat16 mixed precision."""
    fp16: bool = False
    """Train in float16 mixed precision with loss scaling."""
    fp8: str | None = None
    """FP8 GEMMs through Transformer Engine: ``e4m3`` or ``hybrid``; ``None`` means off."""
    fp8_recipe: str = "delayed"
    """FP8 scaling recipe: ``delayed``, ``tensorwise``, ``mxfp8`` or ``blockwise``."""
    fp8_margin: int = 0
    """Margin for the FP8 scaling factor."""
    fp8_amax_history_len: int = 1024
    """Amax history length for delayed scaling."""
    fp8_amax_compute_algo: str = "max"
    """Amax from the history: ``max`` or ``most_recent``."""
    fp8_param: bool = False
    """Keep parameters in FP8 and gather them in FP8 (needs the distributed optimizer)."""
    fp4: str | None = None
    """FP4 GEMMs (Blackwell): ``nvfp4``; ``None`` means off. Incompatible with fp8."""
    grad_reduce_in_fp32: bool = False
    """Reduce gradients across data-parallel ranks in fp32."""
    params_dtype: str = "float32"
    """kilocard: dtype the parameters are created in (``float32``, ``bfloat16`` or ``float16``)."""


@dataclass(kw_only=True)
class OptimConfig:
    """Optimizer and learning-rate schedule (Megatron-Core ``OptimizerConfig`` + scheduler)."""

    optimizer: str = "adam"
    """``adam`` (AdamW-style decoupled weight decay) or ``sgd``."""
    lr: float = 3.0e-3
    """Peak learning rate."""
    min_lr: float = 3.0e-4
    """Final learning rate after decay."""
    weight_decay: float = 0.01
    """Decoupled weight decay."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.95
    """Adam beta2."""
    adam_eps: float = 1.0e-8
    """Adam epsilon."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    lr_warmup_iters: int = 2
    """Linear warm-up steps (``OptimizerParamScheduler``)."""
    lr_decay_iters: int | None = None
    """Steps over which the LR decays; ``None`` means trainer.train_iters."""
    lr_decay_style: str = "cosine"
    """``constant``, ``linear``, ``cosine`` or ``WSD``."""
    use_precision_aware_optimizer: bool = False
    """Keep the optimizer state in the dtypes below (Megatron-Core with Transformer Engine's FusedAdam;
    needs the distributed optimizer, Adam and GPUs)."""
    main_params_dtype: str = "float32"
    """With ``use_precision_aware_optimizer``: the master copy of the parameters, ``float32`` or ``float16``."""
    exp_avg_dtype: str = "float32"
    """With ``use_precision_aware_optimizer``: Adam's first moment, ``float32``, ``float16`` or ``bfloat16``."""
    exp_avg_sq_dtype: str = "float32"
    """With ``use_precision_aware_optimizer``: Adam's second moment, ``float32``, ``float16`` or ``bfloat16``."""
    store_param_remainders: bool = True
    """With ``use_precision_aware_optimizer``, bf16 parameters and an fp32 master copy: keep only the 16 bits
    of each fp32 master value that its bf16 parameter does not hold (2 bytes instead of 4)."""


@dataclass(kw_only=True)
class DataConfig:
    """Where the tokens come from (Megatron-Core ``GPTDatasetConfig``)."""

    type: str = "mock"
    """``mock`` (Megatron-Core's MockGPTDataset) or ``indexed`` (``.bin/.idx`` via GPTDataset)."""
    data_path: list[str] = field(default_factory=list)
    """Indexed dataset prefixes (without .bin/.idx), optionally weighted: ``[0.3, a, 0.7, b]``."""
    split: str = "969,30,1"
    """Train/valid/test split weights."""
    tokenizer: str = BYTES_TOKENIZER
    """Tokenizer: ``kilocard-bytes`` (offline byte-level) or a local tokenizer path."""
    random_seed: int = 1234
    """Seed for dataset shuffling."""
    path_to_cache: str | None = None
    """Where dataset index caches go; ``None`` means ``<run_dir>/data_cache``."""
    num_workers: int = 0
    """DataLoader worker processes per rank."""
    sft: bool = False
    """Supervised fine-tuning (Megatron-LM ``--sft``): every prefix has the assistant-only loss mask
    ``PREFIX_loss_mask`` of ``kilocard preprocess --chat`` beside it, and only assistant tokens carry loss."""
    packing: bool = True
    """Several documents per sequence, one after the other (Megatron-Core ``GPTDataset``'s samples); ``false``:
    one conversation per sequence, cut at ``model.seq_length`` and padded, the padding without loss (``data.sft``
    only)."""
    reset_position_ids: bool = False
    """Position ids restart at 0 after every end-of-document token (Megatron-LM ``--reset-position-ids``)."""
    reset_attention_mask: bool = False
    """Attention stays inside each document of a packed sequence (Megatron-LM ``--reset-attention-mask``): a
    block-diagonal causal mask on Megatron-Core's local attention, the THD layout (``PackedSeqParams`` with
    ``cu_seqlens``) with Transformer Engine; needs ``data.reset_position_ids``."""


@dataclass(kw_only=True)
class PeftConfig:
    """Parameter-efficient fine-tuning: LoRA adapters on Megatron-Core's linear layers, the base frozen
    (Megatron-Bridge's ``peft`` config, its ``LoRA`` field names; ``kilocard.train.lora``)."""

    type: str | None = None
    """``lora`` (``peft=lora``) or ``None`` (every weight trained)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """Megatron-Core linear layers that get an adapter, among ``linear_qkv``, ``linear_proj``, ``linear_fc1``
    and ``linear_fc2`` (Megatron-Bridge's default: all four)."""
    dim: int = 32
    """LoRA rank: the inner dimension of the low-rank update ``B @ A``."""
    alpha: int = 32
    """LoRA alpha: the update is scaled by ``alpha / dim``."""
    dropout: float = 0.0
    """Dropout probability on the adapter's path."""
    dropout_position: str = "pre"
    """Where that dropout acts: ``pre`` (on the adapter's input) or ``post`` (on its output)."""
    lora_A_init_method: str = "xavier"
    """Initialisation of A (``linear_in``): ``xavier`` (normal), ``kaiming`` (uniform, a=sqrt(5)), ``normal``
    (std 0.2) or ``zero``."""
    lora_B_init_method: str = "zero"
    """Initialisation of B (``linear_out``), as for A; ``zero`` makes the adapted model start as the base."""


@dataclass(kw_only=True)
class CheckpointConfig:
    """Distributed checkpoints (``megatron.core.dist_checkpointing``)."""

    save: str | None = None
    """Checkpoint directory; ``None`` means ``<run_dir>/checkpoints``."""
    load: str | None = None
    """Directory to resume from; ``None`` means the save directory."""
    save_interval: int = 0
    """Save every N steps; 0 saves only at the end and on a signal."""
    keep_last: int = 2
    """Keep this many committed steps; older ones are pruned after a commit."""
    ckpt_format: str = "torch_dist"
    """On-disk format (``torch_dist``)."""
    async_save: bool = False
    """Write checkpoints in the background (GPU runs)."""
    fully_parallel_save: bool = True
    """Spread the writing of replicated tensors over data-parallel ranks."""
    fallback_to_previous: bool = False
    """When the newest committed step fails its integrity check, resume from the one before."""
    ckpt_step: int | None = None
    """Start from this committed step of ``checkpoint.load`` instead of its newest (Megatron-LM ``--ckpt-step``);
    ignored once the run has committed steps of its own."""
    expected_save_time_s: float | None = None
    """Expected save time; ``None`` means estimated from checkpoint size and filesystem bandwidth."""
    non_persistent_save_interval: int | None = None
    """Save to the non-persistent (node-local) tier every N steps besides the persistent saves (Megatron-LM
    ``--non-persistent-save-interval``); a step that is also a persistent save is saved only there.
    ``None``: no local tier."""
    non_persistent_ckpt_type: str = "local"
    """Kind of non-persistent checkpoint (Megatron-LM ``--non-persistent-ckpt-type``); kilocard has ``local``:
    every rank writes its own shard to ``non_persistent_local_ckpt_dir`` with NVRx's ``LocalCheckpointManager``."""
    non_persistent_local_ckpt_dir: str | None = None
    """Node-local root of the local tier (Megatron-LM ``--non-persistent-local-ckpt-dir``); each run gets
    ``<root>/<run name>-<hash of the run dir>/<rank>/``. ``None``: node memory, ``/dev/shm``, else
    ``$TMPDIR``, else ``/tmp``, resolved on each node. Never on the shared filesystem."""


@dataclass(kw_only=True)
class TrainerConfig:
    """The step loop: batch sizes, length, logging and determinism."""

    micro_batch_size: int = 2
    """Sequences per micro-batch per data-parallel rank."""
    global_batch_size: int = 8
    """Sequences per optimizer step across all data-parallel ranks."""
    train_iters: int = 20
    """Optimizer steps to train."""
    eval_interval: int | None = None
    """Evaluate on the validation split every N steps, and once more at the end of training (Megatron-LM
    ``--eval-interval``); the test split is evaluated once at the end when ``data.split`` gives it documents.
    ``None``: no evaluation."""
    eval_iters: int = 10
    """Rounds of ``global_batch_size`` validation samples per evaluation (Megatron-LM ``--eval-iters``): forward
    only, through the same pipeline schedule as training."""
    skip_train: bool = False
    """Evaluate the loaded checkpoint on the validation and test splits and stop, without training or saving
    (Megatron-LM ``--skip-train``); needs ``trainer.eval_interval``."""
    log_interval: int = 1
    """Rank 0 prints its step line every N steps and at the last step (Megatron-LM ``--log-interval``; the
    line is in the job log, ``train.log`` and ``kilocard logs``); metrics.jsonl gets every step."""
    seed: int = 1234
    """Seed for model init, dropout and data order."""
    deterministic: bool = True
    """Deterministic algorithms (bit-exact resume on CPU ranks)."""
    hang_timeout_s: float = 300.0
    """A rank that makes no progress for this long fails the run with a clear message."""
    tensorboard: bool = False
    """Also write TensorBoard scalars under ``<run_dir>/tensorboard`` (needs the ``tensorboard`` extra). Off by
    default, as in torchtitan (``metrics.enable_tensorboard``) and Megatron-LM (only with ``--tensorboard-dir``):
    a lean install's first run needs no extra; the benchmark trainer (``conf/trainer/benchmark.yaml``) turns
    it on."""
    rank_time_interval: int = 10
    """Every N steps the ranks all-gather their own step times (one small collective): metrics get the
    slowest rank and the median, and a persistently slower rank is named in a warning (0 = off)."""
    wandb: bool = False
    """Also log the TensorBoard scalars to Weights & Biases, and the frozen config as the W&B run's config
    (needs the ``wandb`` extra)."""
    wandb_project: str = "kilocard"
    """W&B project (Megatron-LM ``--wandb-project``)."""
    wandb_entity: str | None = None
    """W&B entity, the team or user owning the project (Megatron-LM ``--wandb-entity``); ``None``: the
    account's default."""
    wandb_exp_name: str | None = None
    """W&B run name (Megatron-LM ``--wandb-exp-name``); ``None``: the run directory's name."""
    wandb_tags: list[str] = field(default_factory=list)
    """W&B run tags (``[llama3, ablation-lr]``)."""
    wandb_mode: str = "offline"
    """``offline``: written under ``<run_dir>/wandb``, ``wandb sync`` later; ``online``: streamed to the W&B
    server (the API key from the submitting shell: ``launcher.secret_env=[WANDB_API_KEY]``)."""
    mlflow: bool = False
    """Also log the TensorBoard scalars to MLflow (needs the ``mlflow`` extra)."""
    mlflow_tracking_uri: str | None = None
    """MLflow tracking URI (``http://mlflow.example:5000``); ``None``: a file store ``<run_dir>/mlruns``."""
    mlflow_experiment: str | None = None
    """MLflow experiment name; ``None``: the recipe's name (``recipe.name``)."""
    profile_steps: list[int] = field(default_factory=list)
    """``[a, b]``: trace steps a..b with torch's profiler into ``<run_dir>/profile/`` (one file per rank);
    empty: no tracing."""
    nsys: bool = False
    """On GPUs, the batch script runs each Slurm task under Nsight Systems (``nsys profile``, CUDA/NVTX/OS
    traces), capturing only ``trainer.profile_steps`` (the ranks open and close the cudaProfilerApi range),
    into ``<run_dir>/profile/nsys_node<N>_task<T>.nsys-rep``; ignored on CPU ranks."""


@dataclass(kw_only=True)
class ClusterConfig:
    """Topology and site facts of the machine the run goes to."""

    name: str = "local_cpu"
    """Profile name."""
    gpu: str = "cpu"
    """Accelerator model, a key of kilocard's GPU table (``a100-sxm4-80gb``, ``h100-sxm5-80gb``, ...)."""
    nodes: int = 1
    """Nodes the job uses."""
    gpus_per_node: int = 1
    """Accelerators (ranks) per node."""
    nvlink_domain_size: int = 1
    """GPUs that share one NVLink/NVSwitch domain (8 on DGX, 72 on GB200 NVL72)."""
    intra_node_bandwidth_gbs: float = 10.0
    """NVLink bandwidth per GPU, one direction, GB/s."""
    inter_node_bandwidth_gbs: float = 1.0
    """Network bandwidth per GPU, one direction, GB/s."""
    pod_gpus: int | None = None
    """GPUs in one pod of the network: the part of the fabric with full bisection bandwidth (Llama 3's
    RoCE cluster: 3,072). ``None`` means the whole cluster has full bisection bandwidth."""
    pod_oversubscription: float = 1.0
    """How many times a pod's GPU-facing bandwidth exceeds its uplinks to the layer joining the pods
    (Llama 3's aggregation layer, "1:7": 7.0); 1.0 means none. Only with ``pod_gpus``."""
    hbm_bytes: int | None = None
    """Memory per accelerator; ``None`` means the GPU table's value."""
    cpus_per_node: int = 2
    """CPU cores per node (sets ``--cpus-per-task``)."""
    mem_per_node: str = "0"
    """Slurm ``--mem`` per node (``0`` means all of it)."""
    partition: str | None = None
    """Slurm partition."""
    account: str | None = None
    """Slurm account."""
    qos: str | None = None
    """Slurm QOS."""
    container_image: str | None = None
    """Container image for pyxis/enroot; ``None`` means bare metal (``venv``)."""
    container_mounts: list[str] = field(default_factory=list)
    """pyxis mounts, ``src:dst`` each."""
    venv: str | None = None
    """Bare metal: virtual environment to activate on every node."""
    shared_fs: str = "runs"
    """Root for run directories on a filesystem every node sees."""
    fs_write_bandwidth_gbs: float = 1.0
    """Aggregate checkpoint write bandwidth of the shared filesystem, GB/s."""
    check_paths: bool = True
    """Check before submit that input paths (``checkpoint.load``) exist on this machine; ``false`` for paths
    that only exist on the cluster (the same as ``--skip-path-checks``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every rank (NCCL and site settings)."""


@dataclass(kw_only=True)
class LauncherConfig:
    """How the job starts: local torchrun or a Slurm batch script."""

    kind: str = "local"
    """``local`` (torchrun on this machine) or ``slurm``."""
    nproc: int = 1
    """Local ranks for ``kilocard run`` (torchrun ``--nproc-per-node``)."""
    job_name: str | None = None
    """Slurm job name and run-directory prefix; ``None`` means the recipe's name (``recipe.name``)."""
    run_name: str | None = None
    """Run directory name; ``None`` means ``<job_name>-<timestamp>`` (``llama3_8b-20260101-120000``)."""
    time: str = "04:00:00"
    """Slurm wall-clock limit."""
    signal_lead_s: int = 300
    """Seconds before the limit at which Slurm sends USR1 (save, then requeue)."""
    requeue: bool = True
    """Requeue the job after a USR1 save or a node failure."""
    exclusive: bool = True
    """Allocate whole nodes."""
    dependency: str | None = None
    """Slurm dependency expression (``afterany:123``)."""
    max_restarts: int = 0
    """In-job restarts: after a rank dies or hangs, every rank is restarted inside the same allocation (NVRx
    ``ft_launcher``, locally and on Slurm) at most this many times before the job falls back to requeue."""
    master_port: int | None = None
    """Rendezvous port; ``None`` means derived from the Slurm job id (or a free local port)."""
    extra_sbatch: list[str] = field(default_factory=list)
    """Additional ``#SBATCH`` lines, each validated (``--constraint=h100``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the job; values are quoted, never executed."""
    secret_env: list[str] = field(default_factory=list)
    """Names of variables (``WANDB_API_KEY``) passed from the submitting shell with ``--export``; never written."""
    max_requeues: int = 20
    """Self-requeues of one Slurm job after RETRY/FAULT exits before it gives up (``SLURM_RESTART_COUNT``)."""
    max_excluded_nodes: int = 4
    """Nodes one run may keep out of its Slurm job after they failed the node health check or hosted the
    failed rank of two in-job restarts (``kilocard.train.health``; the run directory's blocklist). A node
    found bad beyond this many ends the run CRASH: that many bad nodes is a site problem a person must see."""
    packaging: str = "snapshot"
    """How the job gets kilocard's code (``kilocard.launch.package``): ``snapshot`` (a wheel of this
    checkout built at sbatch time and unpacked into ``<run_dir>/code/site``, first on the job's
    ``PYTHONPATH``), ``image`` (the profile's ``container_image`` was built by ``kilocard image`` and
    holds kilocard) or ``none`` (the job's environment already provides kilocard)."""


@dataclass(kw_only=True)
class RecipeInfo:
    """What the recipe is and which published figure it reproduces (kilocard's own)."""

    name: str = "tiny_gpt"
    """Recipe name."""
    family: str = "tiny"
    """Recipe family (the folder under ``recipes/``)."""
    description: str = ""
    """One line on what the recipe is."""
    baseline_id: str | None = None
    """Row id in the published baselines this recipe reproduces."""
    baseline_source: str | None = None
    """Where that figure was published."""
    baseline_tflops_per_gpu: float | None = None
    """Published TFLOP/s per GPU."""
    baseline_mfu: float | None = None
    """Published model FLOPs utilisation."""
    baseline_flops_convention: str | None = None
    """FLOPs convention of the published figure (``megatron_sc21``, ``megatron_current``, ...)."""


@dataclass(kw_only=True)
class PerfConfig:
    """The performance model's calibration (kilocard's own: Megatron-Core has no performance model)."""

    site_baselines: str | None = None
    """A site baselines file (``kilocard baselines --site FILE --add RUN_DIR`` writes it): ``plan`` and
    ``validate`` then predict with parameters refitted on the published rows plus these rows, and quote
    the site rows' own leave-one-out error; ``null``: the shipped fit."""


@dataclass(kw_only=True)
class RunConfig:
    """The whole run: one field per Hydra config group."""

    recipe: RecipeInfo = field(default_factory=RecipeInfo)
    """The recipe's identity and its published baseline."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Architecture."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel layout."""
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    """Numeric formats."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    data: DataConfig = field(default_factory=DataConfig)
    """Data source."""
    peft: PeftConfig = field(default_factory=PeftConfig)
    """Parameter-efficient fine-tuning (LoRA)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Step loop."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Target machine."""
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    """Launch method."""
    perf: PerfConfig = field(default_factory=PerfConfig)
    """Performance-model calibration."""


#: Config groups, in composition order; frozen by tests/commands/test_cli_surface.py.
CONFIG_GROUPS = (
    "model",
    "parallel",
    "precision",
    "optim",
    "data",
    "peft",
    "checkpoint",
    "trainer",
    "cluster",
    "launcher",
    "perf",
)

#: Fields of model/parallel/precision that are not Megatron-Core config fields, with the reason.
KILOCARD_OWN_FIELDS: dict[str, str] = {
    "trainer.rank_time_interval": "kilocard's straggler report (kilocard.train.straggler); Megatron-LM has none",
    "trainer.wandb": "kilocard's optional tracker (offline W&B); Megatron-LM's --wandb-project takes a project name",
    "trainer.mlflow": "kilocard's optional tracker (MLflow); Megatron-LM has none",
    "trainer.wandb_tags": "W&B run tags (wandb.init(tags=...)); Megatron-LM has none",
    "trainer.wandb_mode": "W&B online/offline (wandb.init(mode=...)); Megatron-LM always logs online",
    "trainer.mlflow_tracking_uri": "mlflow.set_tracking_uri(...); Megatron-LM has no MLflow",
    "trainer.mlflow_experiment": "mlflow.set_experiment(...); Megatron-LM has no MLflow",
    "trainer.profile_steps": "torch profiler window; Megatron-LM's --profile-step-start/--profile-step-end as one list",
    "trainer.nsys": "kilocard's switch for the sbatch nsys wrapper (Megatron-LM leaves nsys to the user's command)",
    "model.name": "a label for tables and run names",
    "model.seq_length": "Megatron-LM --seq-length; reaches Megatron-Core as the dataset sequence_length",
    "model.vocab_size": "GPTModel(vocab_size=...) after padding by make_vocab_size_divisible_by",
    "model.make_vocab_size_divisible_by": "Megatron-LM argument; kilocard pads the vocab the same way",
    "model.max_position_embeddings": "GPTModel(max_sequence_length=...)",
    "model.activation": "a name for TransformerConfig.activation_func (a callable, not serialisable)",
    "model.position_embedding_type": "GPTModel argument",
    "model.yarn_correction_range_round_to_int": "GPTModel reads it from the config (getattr); no TransformerConfig "
    "field",
    "model.rotary_base": "GPTModel argument",
    "model.rotary_percent": "GPTModel argument",
    "model.rope_scaling": "GPTModel argument",
    "model.rope_scaling_factor": "GPTModel argument",
    "model.share_embeddings_and_output_weights": "GPTModel argument",
    "parallel.use_tp_pp_dp_mapping": "Megatron-LM --use-tp-pp-dp-mapping; reaches initialize_model_parallel's order",
    "parallel.tp_within_node": "topology rule switch of kilocard's validator",
    "parallel.cp_within_nvlink": "topology rule switch of kilocard's validator",
    "launcher.packaging": "how the Slurm job gets kilocard's code; Megatron-Core has no launcher",
    "precision.params_dtype": "a dtype name for ModelParallelConfig.params_dtype (a torch.dtype)",
    "optim.lr_warmup_iters": "Megatron-LM --lr-warmup-iters; reaches OptimizerParamScheduler as lr_warmup_steps",
    "optim.lr_decay_iters": "Megatron-LM --lr-decay-iters; reaches OptimizerParamScheduler as lr_decay_steps",
    "optim.lr_decay_style": "OptimizerParamScheduler(lr_decay_style=...), not an OptimizerConfig field",
}
