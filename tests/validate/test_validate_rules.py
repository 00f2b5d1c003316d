"""Each rule on its own: a config that breaks it gets its code (and the fixed config does not)."""

from __future__ import annotations

import pytest

from kilocard.layout import compute_layout
from kilocard.validate import (
    batch,
    dataset,
    domains,
    evaluation,
    launcher,
    model,
    optimizer,
    parallel,
    precision,
    recompute,
    resilience,
    topology,
    validate,
)
from kilocard.validate.memory import rule_memory_fits
from run_configs import cfg_of

H100 = {
    "cluster.gpu": "h100-sxm5-80gb",
    "cluster.nodes": 2,
    "cluster.gpus_per_node": 8,
    "cluster.nvlink_domain_size": 8,
    "launcher.kind": "slurm",
    "cluster.fs_write_bandwidth_gbs": 50.0,
    "cluster.env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
}
W4 = {"cluster.gpus_per_node": 4, "launcher.nproc": 4}
MOE = {"model.num_moe_experts": 4, "model.moe_router_topk": 2}
EP2 = {"parallel.expert_model_parallel_size": 2}
RACK = {"cluster.nodes": 4, "cluster.gpus_per_node": 4, "cluster.nvlink_domain_size": 8}
"""Nodes of 4 GPUs in NVLink domains of 8 (GB200 NVL72: 18 nodes of 4 in one domain of 72)."""


def codes(rule, values):
    cfg = cfg_of(values)
    return [i.code for i in rule(cfg, compute_layout(cfg))]


P = "parallel."
CASES = [
    # rule, bad config, code, the same config fixed
    (parallel.rule_sizes_positive, {P + "context_parallel_size": 0}, "PARALLEL_SIZE", {}),
    (
        parallel.rule_world_divisible,
        {**W4, P + "tensor_model_parallel_size": 3},
        "WORLD_NOT_DIVISIBLE",
        {**W4, P + "tensor_model_parallel_size": 2},
    ),
    (
        parallel.rule_expert_world_divisible,
        {**W4, **MOE, P + "expert_model_parallel_size": 8},
        "EXPERT_WORLD_NOT_DIVISIBLE",
        {**W4, **MOE, P + "expert_model_parallel_size": 4},
    ),
    (
        parallel.rule_tp_pp_dp_mapping,
        {
            **W4,
            **MOE,
            P + "use_tp_pp_dp_mapping": True,
            P + "pipeline_model_parallel_size": 2,
            P + "expert_model_parallel_size": 2,
        },
        "TP_PP_DP_EXPERT_DP",
        {**W4, **MOE, P + "use_tp_pp_dp_mapping": True, P + "pipeline_model_parallel_size": 2},
    ),
    (
        parallel.rule_heads_tp,
        {**W4, "model.num_attention_heads": 2, "model.hidden_size": 64, P + "tensor_model_parallel_size": 4},
        "TP_HEADS",
        {**W4, P + "tensor_model_parallel_size": 4},
    ),
    (
        parallel.rule_heads_tp,
        {
            **W4,
            "model.num_attention_heads": 12,
            "model.hidden_size": 96,
            "model.num_query_groups": 3,
            P + "tensor_model_parallel_size": 4,
        },
        "TP_QUERY_GROUPS",
        {
            **W4,
            "model.num_attention_heads": 12,
            "model.hidden_size": 96,
            "model.num_query_groups": 6,
            P + "tensor_model_parallel_size": 2,
        },
    ),
    (
        parallel.rule_heads_tp,
        {"model.hidden_size": 66},
        "HIDDEN_HEADS",
        {"model.hidden_size": 66, "model.kv_channels": 16},
    ),
    (parallel.rule_sequence_parallel, {P + "sequence_parallel": True}, "SP_WITHOUT_TP", {}),
    (
        parallel.rule_sequence_parallel,
        {**W4, **MOE, P + "tensor_model_parallel_size": 2},
        "MOE_TP_WITHOUT_SP",
        {**W4, **MOE, P + "tensor_model_parallel_size": 2, P + "sequence_parallel": True},
    ),
    (
        parallel.rule_experts_ep,
        {**W4, P + "expert_model_parallel_size": 2},
        "EP_WITHOUT_EXPERTS",
        {**W4, **MOE, P + "expert_model_parallel_size": 2},
    ),
    (
        parallel.rule_experts_ep,
        {**W4, **MOE, "model.num_moe_experts": 6, P + "expert_model_parallel_size": 4},
        "EXPERTS_EP",
        {**W4, **MOE, P + "expert_model_parallel_size": 4},
    ),
    (parallel.rule_virtual_pipeline, {P + "virtual_pipeline_model_parallel_size": 2}, "VP_WITHOUT_PP", {}),
    (
        parallel.rule_virtual_pipeline,
        {**W4, P + "pipeline_model_parallel_size": 2, P + "virtual_pipeline_model_parallel_size": 2},
        "VP_PP2_NO_OVERLAP",
        {
            **W4,
            P + "pipeline_model_parallel_size": 2,
            P + "virtual_pipeline_model_parallel_size": 2,
            P + "overlap_p2p_comm": True,
        },
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 6,
            P + "pipeline_model_parallel_size": 4,
            P + "pipeline_model_parallel_layout": "Ett|tt|tt|tL",
        },
        "PIPELINE_LAYOUT",
        {
            **W4,
            "model.num_layers": 6,
            P + "pipeline_model_parallel_size": 4,
            P + "pipeline_model_parallel_layout": "Ett|tt|tt|L",
        },
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 7,
            P + "pipeline_model_parallel_size": 4,
            P + "pipeline_model_parallel_layout": "Ett|tt|tt|L",
            P + "account_for_loss_in_pipeline_split": True,
        },
        "PIPELINE_LAYOUT_CONFLICT",
        {
            **W4,
            "model.num_layers": 7,
            P + "pipeline_model_parallel_size": 4,
            P + "account_for_loss_in_pipeline_split": True,
        },
    ),
    (
        parallel.rule_megatron_fsdp,
        {P + "data_parallel_sharding_strategy": "optim_grads"},
        "FSDP_STRATEGY_WITHOUT_FSDP",
        {P + "data_parallel_sharding_strategy": "optim_grads", P + "use_megatron_fsdp": True},
    ),
    (
        parallel.rule_megatron_fsdp,
        {P + "data_parallel_sharding_strategy": "zero3", P + "use_megatron_fsdp": True},
        "FSDP_SHARDING_STRATEGY",
        {P + "data_parallel_sharding_strategy": "optim_grads_params", P + "use_megatron_fsdp": True},
    ),
    (
        parallel.rule_cpu_offloading,
        {"model.num_layers": 4, P + "cpu_offloading": True, P + "cpu_offloading_num_layers": 4},
        "CPU_OFFLOAD_LAYERS",
        {"model.num_layers": 4, P + "cpu_offloading": True, P + "cpu_offloading_num_layers": 3},
    ),
    (
        parallel.rule_cpu_offloading,
        {**W4, "model.num_layers": 4, P + "cpu_offloading": True, P + "pipeline_model_parallel_size": 2},
        "CPU_OFFLOAD_PP",
        {**W4, "model.num_layers": 4, P + "cpu_offloading": True},
    ),
    (
        parallel.rule_cpu_offloading,
        {P + "cpu_offloading": True, P + "recompute_granularity": "selective"},
        "CPU_OFFLOAD_RECOMPUTE",
        {P + "cpu_offloading": True},
    ),
    (
        optimizer.rule_precision_aware_optimizer,
        {"optim.exp_avg_dtype": "bfloat16", P + "use_distributed_optimizer": True},
        "OPTIM_STATE_DTYPE",
        {
            "optim.exp_avg_dtype": "bfloat16",
            "optim.use_precision_aware_optimizer": True,
            P + "use_distributed_optimizer": True,
        },
    ),
    (
        optimizer.rule_precision_aware_optimizer,
        {"optim.use_precision_aware_optimizer": True},
        "PRECISION_AWARE_OPTIMIZER",
        {"optim.use_precision_aware_optimizer": True, P + "use_distributed_optimizer": True},
    ),
    (
        parallel.rule_layers_per_stage,
        {**W4, "model.num_layers": 6, P + "pipeline_model_parallel_size": 4},
        "LAYERS_PP",
        {**W4, "model.num_layers": 8, P + "pipeline_model_parallel_size": 4},
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 8,
            P + "pipeline_model_parallel_size": 4,
            P + "virtual_pipeline_model_parallel_size": 3,
        },
        "LAYERS_VP",
        {
            **W4,
            "model.num_layers": 8,
            P + "pipeline_model_parallel_size": 4,
            P + "virtual_pipeline_model_parallel_size": 2,
        },
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 6,
            P + "pipeline_model_parallel_size": 4,
            P + "num_layers_in_first_pipeline_stage": 1,
        },
        "UNEVEN_PP_MIDDLE",
        {
            **W4,
            "model.num_layers": 7,
            P + "pipeline_model_parallel_size": 4,
            P + "num_layers_in_first_pipeline_stage": 1,
        },
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 2,
            P + "pipeline_model_parallel_size": 2,
            P + "num_layers_in_first_pipeline_stage": 5,
        },
        "UNEVEN_PP_MISMATCH",
        {
            **W4,
            "model.num_layers": 6,
            P + "pipeline_model_parallel_size": 2,
            P + "num_layers_in_first_pipeline_stage": 5,
        },
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 4,
            P + "pipeline_model_parallel_size": 2,
            P + "num_layers_in_last_pipeline_stage": 0,
        },
        "UNEVEN_PP_STAGE",
        {
            **W4,
            "model.num_layers": 4,
            P + "pipeline_model_parallel_size": 2,
            P + "num_layers_in_last_pipeline_stage": 1,
        },
    ),
    (
        parallel.rule_layers_per_stage,
        {
            **W4,
            "model.num_layers": 4,
            P + "pipeline_model_parallel_size": 2,
            P + "num_layers_in_last_pipeline_stage": 1,
            P + "account_for_loss_in_pipeline_split": True,
        },
        "UNEVEN_PP_WITH_ACCOUNTING",
        {
            **W4,
            "model.num_layers": 4,
            P + "pipeline_model_parallel_size": 2,
            P + "num_layers_in_last_pipeline_stage": 1,
        },
    ),
    (domains.rule_field_domains, {"trainer.global_batch_size": 0}, "BATCH_NOT_POSITIVE", {}),
    (
        batch.rule_global_batch,
        {**W4, "trainer.global_batch_size": 6, "trainer.micro_batch_size": 1},
        "GLOBAL_BATCH",
        {**W4, "trainer.global_batch_size": 8, "trainer.micro_batch_size": 1},
    ),
    (
        batch.rule_interleaved_microbatches,
        {
            **W4,
            "model.num_layers": 8,
            P + "pipeline_model_parallel_size": 4,
            P + "virtual_pipeline_model_parallel_size": 2,
            "trainer.global_batch_size": 6,
            "trainer.micro_batch_size": 1,
        },
        "INTERLEAVED_MICROBATCHES",
        {
            **W4,
            "model.num_layers": 8,
            P + "pipeline_model_parallel_size": 4,
            P + "virtual_pipeline_model_parallel_size": 2,
            "trainer.global_batch_size": 8,
            "trainer.micro_batch_size": 1,
        },
    ),
    (
        batch.rule_pipeline_bubble,
        {**W4, P + "pipeline_model_parallel_size": 2, "trainer.global_batch_size": 2, "trainer.micro_batch_size": 1},
        "PIPELINE_BUBBLE",
        {**W4, P + "pipeline_model_parallel_size": 2, "trainer.global_batch_size": 4, "trainer.micro_batch_size": 1},
    ),
    (
        batch.rule_sequence_split,
        {**W4, P + "context_parallel_size": 4, "model.seq_length": 36},
        "SEQ_CP",
        {**W4, P + "context_parallel_size": 4, "model.seq_length": 32},
    ),
    (
        batch.rule_sequence_split,
        {**W4, P + "tensor_model_parallel_size": 4, P + "sequence_parallel": True, "model.seq_length": 30},
        "SEQ_TP_SP",
        {**W4, P + "tensor_model_parallel_size": 4, P + "sequence_parallel": True, "model.seq_length": 32},
    ),
    (batch.rule_max_positions, {"model.max_position_embeddings": 8}, "MAX_POSITIONS", {}),
    (
        precision.rule_half_precision,
        {"precision.bf16": True, "precision.fp16": True},
        "FP16_AND_BF16",
        {"precision.bf16": True},
    ),
    (
        precision.rule_half_precision,
        {"precision.bf16": True, "precision.params_dtype": "float16"},
        "PARAMS_DTYPE",
        {"precision.bf16": True, "precision.params_dtype": "bfloat16"},
    ),
    (
        precision.rule_fp8,
        {"cluster.gpu": "a100-sxm4-80gb", "precision.fp8": "hybrid"},
        "FP8_UNSUPPORTED_GPU",
        {"cluster.gpu": "h100-sxm5-80gb", "precision.fp8": "hybrid"},
    ),
    (
        precision.rule_fp8,
        {"cluster.gpu": "b200-sxm-180gb", "precision.fp8": "hybrid", "precision.fp4": "nvfp4"},
        "FP8_AND_FP4",
        {"cluster.gpu": "b200-sxm-180gb", "precision.fp4": "nvfp4"},
    ),
    (
        precision.rule_fp8,
        {"cluster.gpu": "h100-sxm5-80gb", "precision.fp8": "hybrid", "precision.fp8_recipe": "mxfp8"},
        "FP8_RECIPE_GPU",
        {"cluster.gpu": "b200-sxm-180gb", "precision.fp8": "hybrid", "precision.fp8_recipe": "mxfp8"},
    ),
    (
        precision.rule_fp4,
        {"cluster.gpu": "h200-sxm-141gb", "precision.fp4": "nvfp4"},
        "FP4_UNSUPPORTED_GPU",
        {"cluster.gpu": "gb200-nvl72", "precision.fp4": "nvfp4"},
    ),
    (
        precision.rule_fp8_param,
        {"precision.fp8_param": True, "precision.fp8": "hybrid"},
        "FP8_PARAM_NEEDS_DISTOPT",
        {"precision.fp8_param": True, "precision.fp8": "hybrid", P + "use_distributed_optimizer": True},
    ),
    (
        precision.rule_fp8_param,
        {"precision.fp8_param": True, P + "use_distributed_optimizer": True},
        "FP8_PARAM_WITHOUT_FP8",
        {P + "use_distributed_optimizer": True},
    ),
    (domains.rule_field_domains, {"optim.optimizer": "lion"}, "OPTIMIZER", {"optim.optimizer": "sgd"}),
    (optimizer.rule_lr_order, {"optim.lr": 1e-4, "optim.min_lr": 1e-3}, "LR_ORDER", {"optim.min_lr": 1e-5}),
    (
        optimizer.rule_overlap_param_gather,
        {P + "overlap_param_gather": True, P + "overlap_grad_reduce": True},
        "OVERLAP_PARAM_GATHER_NEEDS_DISTOPT",
        {P + "overlap_param_gather": True, P + "overlap_grad_reduce": True, P + "use_distributed_optimizer": True},
    ),
    (
        optimizer.rule_overlap_param_gather,
        {P + "overlap_param_gather": True, P + "use_distributed_optimizer": True},
        "OVERLAP_PARAM_GATHER_NEEDS_GRAD_REDUCE",
        {P + "overlap_param_gather": True, P + "overlap_grad_reduce": True, P + "use_distributed_optimizer": True},
    ),
    (optimizer.rule_overlap_p2p, {P + "overlap_p2p_comm": True}, "OVERLAP_P2P_IGNORED", {}),
    (
        optimizer.rule_tp_comm_overlap,
        {P + "tp_comm_overlap": True},
        "TP_COMM_OVERLAP_NEEDS_SP",
        {P + "tp_comm_overlap": True, P + "sequence_parallel": True},
    ),
    (
        recompute.rule_recompute,
        {P + "recompute_granularity": "partial"},
        "RECOMPUTE_GRANULARITY",
        {P + "recompute_granularity": "selective"},
    ),
    (
        recompute.rule_recompute,
        {P + "recompute_granularity": "full", P + "recompute_num_layers": 1},
        "RECOMPUTE_METHOD",
        {P + "recompute_granularity": "full", P + "recompute_method": "block", P + "recompute_num_layers": 1},
    ),
    (
        recompute.rule_recompute,
        {P + "recompute_granularity": "full", P + "recompute_method": "uniform"},
        "RECOMPUTE_NUM_LAYERS",
        {P + "recompute_granularity": "full", P + "recompute_method": "uniform", P + "recompute_num_layers": 2},
    ),
    (
        recompute.rule_recompute,
        {P + "recompute_granularity": "full", P + "recompute_method": "uniform", P + "recompute_num_layers": 3},
        "RECOMPUTE_NUM_LAYERS_RANGE",
        {P + "recompute_granularity": "full", P + "recompute_method": "uniform", P + "recompute_num_layers": 2},
    ),
    (
        recompute.rule_recompute,
        {P + "recompute_granularity": "selective", P + "recompute_method": "block"},
        "RECOMPUTE_SELECTIVE_METHOD",
        {P + "recompute_granularity": "selective"},
    ),
    (recompute.rule_recompute, {P + "recompute_method": "block"}, "RECOMPUTE_IGNORED", {}),
    (domains.rule_field_domains, {"model.num_layers": 0}, "MODEL_SHAPE", {}),
    (model.rule_model_shape, {"model.num_query_groups": 3}, "QUERY_GROUPS_HEADS", {"model.num_query_groups": 2}),
    (model.rule_model_shape, {**MOE, "model.moe_router_topk": 8}, "MOE_TOPK", {**MOE}),
    (
        domains.rule_field_domains,
        {"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "liger"},
        "CROSS_ENTROPY_FUSION_IMPL",
        {"model.cross_entropy_loss_fusion": True, "model.cross_entropy_fusion_impl": "te"},
    ),
    (
        model.rule_model_shape,
        {**MOE, "model.moe_layer_freq": [1, 0, 1]},
        "MOE_LAYER_FREQ",
        {**MOE, "model.moe_layer_freq": [1, 0]},
    ),
    (topology.rule_cluster_shape, {"cluster.gpu": "v100"}, "UNKNOWN_GPU", {"cluster.gpu": "mi300x"}),
    (domains.rule_field_domains, {"cluster.gpus_per_node": 0}, "CLUSTER_SIZE", {}),
    (
        topology.rule_cluster_shape,
        {"cluster.gpus_per_node": 8, "cluster.nvlink_domain_size": 3},
        "NVLINK_DOMAIN_SHAPE",
        {"cluster.gpus_per_node": 8, "cluster.nvlink_domain_size": 8},
    ),
    (
        topology.rule_tp_nvlink,
        {**H100, "model.num_attention_heads": 16, "model.hidden_size": 256, P + "tensor_model_parallel_size": 16},
        "TP_CROSSES_NVLINK",
        {
            **H100,
            "model.num_attention_heads": 16,
            "model.hidden_size": 256,
            P + "tensor_model_parallel_size": 16,
            P + "tp_within_node": False,
        },
    ),
    (
        topology.rule_tp_nvlink,
        {**H100, P + "tensor_model_parallel_size": 4, P + "context_parallel_size": 4, P + "cp_within_nvlink": True},
        "TP_CP_CROSSES_NVLINK",
        {**H100, P + "tensor_model_parallel_size": 4, P + "context_parallel_size": 2, P + "cp_within_nvlink": True},
    ),
    (
        topology.rule_tp_nvlink,
        {
            **H100,
            "cluster.gpus_per_node": 6,
            "cluster.nvlink_domain_size": 6,
            "model.num_attention_heads": 4,
            P + "tensor_model_parallel_size": 4,
            P + "tp_within_node": False,
        },
        "GPUS_PER_NODE_TP",
        {**H100, P + "tensor_model_parallel_size": 4},
    ),
    (
        topology.rule_stage_split,
        {**H100, P + "tensor_model_parallel_size": 4, P + "context_parallel_size": 4},
        "STAGE_CROSSES_NODES",
        {**H100, P + "tensor_model_parallel_size": 4, P + "context_parallel_size": 2},
    ),
    (
        topology.rule_ep_network,
        {**H100, **MOE, "model.num_moe_experts": 16, P + "expert_model_parallel_size": 16},
        "EP_CROSSES_NODES",
        {**H100, **MOE, "model.num_moe_experts": 16, P + "expert_model_parallel_size": 8},
    ),
    (  # an NVLink domain of several nodes (GB200 NVL72's shape, scaled down): EP across its nodes stays on NVLink
        topology.rule_ep_network,
        {**H100, **RACK, **MOE, "model.num_moe_experts": 16, P + "expert_model_parallel_size": 16},
        "EP_CROSSES_NODES",
        {**H100, **RACK, **MOE, "model.num_moe_experts": 16, P + "expert_model_parallel_size": 8},
    ),
    (
        topology.rule_gpu_only_features,
        {P + "tp_comm_overlap": True},
        "GPU_ONLY_ON_CPU",
        {**H100, P + "tp_comm_overlap": True},
    ),
    (
        topology.rule_gpu_only_features,
        {"model.cuda_graph_impl": "local"},
        "GPU_ONLY_ON_CPU",
        {**H100, "model.cuda_graph_impl": "local"},
    ),
    (domains.rule_field_domains, {"launcher.kind": "k8s"}, "LAUNCHER_KIND", {"launcher.kind": "slurm"}),
    (launcher.rule_cpu_ranks, {"cluster.gpus_per_node": 1000}, "CPU_RANKS", {"cluster.gpus_per_node": 4}),
    (
        launcher.rule_cpu_ranks,
        {"cluster.gpus_per_node": 1000},
        "CPU_RANKS",
        {"cluster.gpus_per_node": 1000, "cluster.cpus_per_node": 500},
    ),
    (launcher.rule_launcher_kind, {"launcher.nproc": 4}, "LOCAL_NPROC", {**W4}),
    (
        launcher.rule_launcher_kind,
        {"cluster.nodes": 2},
        "LOCAL_MULTI_NODE",
        {"cluster.nodes": 2, "launcher.kind": "slurm"},
    ),
    (
        launcher.rule_cuda_device_max_connections,
        {**H100, "cluster.env": {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}, P + "tensor_model_parallel_size": 2},
        "CUDA_DEVICE_MAX_CONNECTIONS",
        {**H100, "cluster.env": {}, P + "tensor_model_parallel_size": 2},  # unset: the launch plan sets it
    ),
    (
        launcher.rule_cuda_device_max_connections,
        {**H100, "launcher.env": {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}, P + "context_parallel_size": 2},
        "CUDA_DEVICE_MAX_CONNECTIONS",
        {
            **H100,
            "cluster.gpu": "b200-sxm-180gb",
            "launcher.env": {"CUDA_DEVICE_MAX_CONNECTIONS": "32"},
            P + "context_parallel_size": 2,
        },
    ),
    # what Megatron-Core and torch reject at start-up, or what would train silently wrong (issue 24)
    (domains.rule_field_domains, {"optim.adam_beta2": 1.5}, "ADAM_BETA", {"optim.adam_beta2": 0.999}),
    (domains.rule_field_domains, {"optim.adam_beta1": -0.1}, "ADAM_BETA", {"optim.adam_beta1": 0.0}),
    (
        domains.rule_field_domains,
        {"optim.adam_beta1": 1.0},
        "ADAM_BETA",
        {"optim.adam_beta1": 0.99},
    ),
    (domains.rule_field_domains, {"optim.adam_eps": 0.0}, "ADAM_EPS", {"optim.adam_eps": 1e-8}),
    (domains.rule_field_domains, {"optim.clip_grad": -1.0}, "CLIP_GRAD", {"optim.clip_grad": 0.0}),
    (domains.rule_field_domains, {"optim.lr_decay_style": "foo"}, "LR_DECAY_STYLE", {"optim.lr_decay_style": "WSD"}),
    (domains.rule_field_domains, {"optim.lr_warmup_iters": -1}, "LR_WARMUP_ITERS", {"optim.lr_warmup_iters": 0}),
    (domains.rule_field_domains, {"optim.lr_decay_iters": -3}, "LR_DECAY_ITERS", {"optim.lr_decay_iters": None}),
    (
        optimizer.rule_lr_schedule,
        {"optim.lr_decay_iters": 20, "optim.lr_warmup_iters": 20},
        "LR_WARMUP_CLAMPED",
        {"optim.lr_decay_iters": 20, "optim.lr_warmup_iters": 19},
    ),
    (domains.rule_field_domains, {"model.normalization": "Foo"}, "MODEL_CHOICE", {"model.normalization": "RMSNorm"}),
    (domains.rule_field_domains, {"model.activation": "relu"}, "MODEL_CHOICE", {"model.activation": "squared_relu"}),
    (
        domains.rule_field_domains,
        {"model.position_embedding_type": "alibi"},
        "MODEL_CHOICE",
        {"model.position_embedding_type": "none"},
    ),
    (
        domains.rule_field_domains,
        {**MOE, "model.moe_router_score_function": "tanh"},
        "MODEL_CHOICE",
        {**MOE, "model.moe_router_score_function": "sigmoid"},
    ),
    (
        domains.rule_field_domains,
        {"model.layernorm_epsilon": -1.0},
        "LAYERNORM_EPSILON",
        {"model.layernorm_epsilon": 1e-6},
    ),
    (
        domains.rule_field_domains,
        {"model.layernorm_epsilon": 0.0},
        "LAYERNORM_EPSILON",
        {"model.layernorm_epsilon": 1e-5},
    ),
    (domains.rule_field_domains, {"model.init_method_std": 0.0}, "INIT_METHOD_STD", {"model.init_method_std": 0.006}),
    (
        domains.rule_field_domains,
        {"model.position_embedding_type": "rope", "model.rotary_percent": 0.0},
        "ROPE",
        {"model.position_embedding_type": "rope", "model.rotary_percent": 0.5},
    ),
    (
        domains.rule_field_domains,
        {"model.position_embedding_type": "rope", "model.rope_scaling": True, "model.rope_scaling_factor": -8.0},
        "ROPE",
        {"model.position_embedding_type": "rope", "model.rope_scaling": True, "model.rope_scaling_factor": 8.0},
    ),
    (
        domains.rule_field_domains,
        {**MOE, "model.moe_aux_loss_coeff": -0.01},
        "MOE_AUX_LOSS_COEFF",
        {**MOE, "model.moe_aux_loss_coeff": 0.01},
    ),
    (
        model.rule_moe_topk1_softmax,
        {**MOE, "model.moe_router_topk": 1},
        "MOE_TOPK1_SOFTMAX",
        {**MOE, "model.moe_router_topk": 1, "model.moe_router_score_function": "sigmoid"},
    ),
    (
        domains.rule_field_domains,
        {**MOE, "model.moe_shared_expert_intermediate_size": 0},
        "MODEL_SHAPE",
        {**MOE, "model.moe_shared_expert_intermediate_size": 64},
    ),
    (
        parallel.rule_moe_bias_etp,
        {
            **W4,
            **MOE,
            "model.add_bias_linear": True,
            P + "tensor_model_parallel_size": 2,
            P + "sequence_parallel": True,
        },
        "MOE_BIAS_ETP",
        {
            **W4,
            **MOE,
            "model.add_bias_linear": False,
            P + "tensor_model_parallel_size": 2,
            P + "sequence_parallel": True,
        },
    ),
    (domains.rule_field_domains, {"data.type": "parquet"}, "DATA_TYPE", {"data.type": "mock"}),
    (dataset.rule_packing, {"data.packing": False}, "DATA_PACKING", {"data.packing": False, "data.sft": True}),
    (
        dataset.rule_packing,
        {"data.reset_attention_mask": True},
        "PACKING_RESET",
        {"data.reset_attention_mask": True, "data.reset_position_ids": True},
    ),
    (
        dataset.rule_sft_packed_attention,
        {"data.sft": True},
        "SFT_PACKED_ATTENTION",
        {"data.sft": True, "data.reset_attention_mask": True, "data.reset_position_ids": True},
    ),
    (
        dataset.rule_sft_packed_attention,
        {"data.sft": True},
        "SFT_PACKED_ATTENTION",
        {"data.sft": True, "data.packing": False},
    ),
    (
        dataset.rule_packing_thd,
        {**H100, "data.reset_attention_mask": True, "trainer.micro_batch_size": 2},
        "PACKING_THD",
        {**H100, "data.reset_attention_mask": True, "trainer.micro_batch_size": 1},
    ),
    (
        dataset.rule_packing_thd,
        {**H100, "data.reset_attention_mask": True, "trainer.micro_batch_size": 1, P + "context_parallel_size": 2},
        "PACKING_THD",
        {"cluster.gpu": "cpu", "data.reset_attention_mask": True, "trainer.micro_batch_size": 2},
    ),
    (evaluation.rule_split_form, {"data.type": "indexed", "data.split": "a,b"}, "DATA_SPLIT", {"data.type": "indexed"}),
    (evaluation.rule_split_form, {"data.type": "indexed", "data.split": "0,1,1"}, "DATA_SPLIT", {"data.split": "1"}),
    (
        evaluation.rule_split_form,
        {"data.type": "indexed", "data.split": "1,-1"},
        "DATA_SPLIT",
        {"data.type": "indexed", "data.split": "1, 0"},
    ),
    (
        evaluation.rule_split_form,
        {"data.type": "indexed", "data.split": "9,1,0,0"},
        "DATA_SPLIT",
        {"data.type": "indexed", "data.split": "100"},
    ),
    (resilience.rule_hang_timeout, {"trainer.hang_timeout_s": 0.001}, "HANG_TIMEOUT", {"trainer.hang_timeout_s": 0}),
    (
        resilience.rule_hang_timeout,
        {"trainer.hang_timeout_s": 20.0, "checkpoint.expected_save_time_s": 60.0},
        "HANG_TIMEOUT_SAVE",
        {"trainer.hang_timeout_s": 300.0, "checkpoint.expected_save_time_s": 60.0},
    ),
]


@pytest.mark.parametrize("rule,bad,code,good", CASES, ids=[f"{c[0].__name__}-{c[2]}" for c in CASES])
def test_rule_flags_the_bad_config_and_passes_the_fixed_one(rule, bad, code, good):
    assert code in codes(rule, bad)
    assert code not in codes(rule, good)


def test_every_rule_of_these_modules_is_covered():
    from kilocard.validate import RULES

    mods = {
        m.__name__ for m in (batch, launcher, model, optimizer, parallel, precision, recompute, resilience, topology)
    }
    mine = {r for r in RULES if r.__module__ in mods}
    covered = {c[0] for c in CASES}
    assert len(mine) >= 36 and mine - covered == set(), [r.__name__ for r in mine - covered]


def test_messages_print_every_factor():
    cfg = cfg_of(
        {
            "cluster.gpu": "h100-sxm5-80gb",
            "cluster.nodes": 2048,
            "cluster.gpus_per_node": 8,
            "launcher.kind": "slurm",
            "model.num_attention_heads": 16,
            "model.hidden_size": 256,
            "model.num_layers": 16,
            P + "tensor_model_parallel_size": 8,
            P + "pipeline_model_parallel_size": 16,
            P + "context_parallel_size": 3,
        }
    )
    issue = next(i for i in validate(cfg).issues if i.code == "WORLD_NOT_DIVISIBLE")
    assert "tp(8) * pp(16) * cp(3) = 384 does not divide world size 2048 nodes * 8 GPUs = 16384" in issue.message
    assert issue.field == "parallel.tensor_model_parallel_size" and issue.value == 8 and issue.hint


def test_out_of_memory_names_layouts_that_fit():
    cfg = cfg_of(
        {
            **H100,
            "cluster.nodes": 1,
            "model.num_layers": 32,
            "model.hidden_size": 8192,
            "model.num_attention_heads": 64,
            "model.seq_length": 4096,
            "model.max_position_embeddings": 4096,
            "model.vocab_size": 128000,
            "precision.bf16": True,
            "precision.params_dtype": "bfloat16",
            "trainer.global_batch_size": 64,
        }
    )
    lay = compute_layout(cfg)
    (issue,) = [i for i in rule_memory_fits(cfg, lay) if i.code == "OUT_OF_MEMORY"]
    assert "GiB" in issue.message and "layouts that fit:" in issue.hint
    first = issue.hint.split("layouts that fit: ")[1].split(" | ")[0].split()
    fixed = cfg_of(
        {
            **{k: v for k, v in H100.items()},
            "cluster.nodes": 1,
            "model.num_layers": 32,
            "model.hidden_size": 8192,
            "model.num_attention_heads": 64,
            "model.seq_length": 4096,
            "model.max_position_embeddings": 4096,
            "model.vocab_size": 128000,
            "precision.bf16": True,
            "precision.params_dtype": "bfloat16",
            "trainer.global_batch_size": 64,
            **{k: _parse(v) for k, v in (line.split("=") for line in first)},
        }
    )
    assert validate(fixed).valid, [(i.code, i.message) for i in validate(fixed).errors]


def _parse(v: str):
    return True if v == "true" else False if v == "false" else int(v) if v.isdigit() else v
