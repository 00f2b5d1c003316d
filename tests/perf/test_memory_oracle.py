"""kilocard's memory estimate equals Megatron-LM's formulas (megatron-core 0.19.2's
``megatron/training/theoretical_memory_usage.py``, the real file) on the same inputs."""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace

import pytest

from kilocard.layout import compute_layout
from kilocard.perf.memory import activation_bytes, estimate_memory, megatron_memory_args, weight_and_optimizer_bytes
from memory_cases import random_run_config
from oracle import load_megatron_training_module

N_CASES = 400


@pytest.fixture(scope="module")
def tmu():
    return load_megatron_training_module("theoretical_memory_usage")


def _oracle_activations(tmu, args, mb):
    """Megatron's SP formula with sequence parallel, its no-SP formula without (see perf/memory.py)."""
    if args.sequence_parallel:
        return tmu.compute_activation_memory(copy.copy(args), num_microbatches=mb)
    return tmu.compute_activation_memory_without_sp(copy.copy(args), num_microbatches=mb)


def test_weights_and_optimizer_equal_megatron_on_random_configs(tmu):
    rng = random.Random(20261130)
    kinds = {"moe": 0, "mla": 0, "distopt": 0, "cp": 0}
    for i in range(N_CASES):
        cfg = random_run_config(rng)
        lay = compute_layout(cfg)
        assert lay.dp is not None and lay.expert_dp is not None, i
        ours = weight_and_optimizer_bytes(cfg, lay)
        theirs = tmu.compute_weight_and_optimizer_memory(copy.copy(megatron_memory_args(cfg, lay)))
        assert math.isclose(ours, theirs, rel_tol=1e-12), (i, ours, theirs, cfg.model, cfg.parallel)
        kinds["moe"] += bool(cfg.model.num_moe_experts)
        kinds["mla"] += cfg.model.multi_latent_attention
        kinds["distopt"] += cfg.parallel.use_distributed_optimizer
        kinds["cp"] += lay.cp > 1
    print(f"{N_CASES} random configs equal Megatron's weight+optimizer formula; covered {kinds}")
    assert min(kinds.values()) > 20


def test_activations_equal_megatron_on_random_dense_configs(tmu):
    rng = random.Random(7)
    branches = {"sp_selective": 0, "without_sp": 0, "interleaved": 0}
    for i in range(N_CASES):
        cfg = random_run_config(rng, moe=False)
        lay = compute_layout(cfg)
        args = megatron_memory_args(cfg, lay)
        ours = activation_bytes(cfg, args, lay.num_microbatches)
        theirs = _oracle_activations(tmu, args, lay.num_microbatches)
        assert math.isclose(ours, theirs, rel_tol=1e-12), (i, ours, theirs, cfg.parallel)
        assert estimate_memory(cfg, lay).activations == math.ceil(ours)
        key = "sp_selective" if cfg.parallel.sequence_parallel else "without_sp"
        branches[key] += 1
        branches["interleaved"] += lay.vp is not None
    print(f"{N_CASES} random dense configs equal Megatron's activation formulas; branches {branches}")
    assert min(branches.values()) > 20


def _llama_like_megatron_args(**over):
    """Megatron-LM's args for a Llama-3-8B-shaped run, written out by hand as Megatron-LM sets them."""
    a = dict(
        hidden_size=4096,
        num_attention_heads=32,
        kv_channels=128,
        group_query_attention=True,
        num_query_groups=8,
        num_experts=None,
        swiglu=True,
        moe_shared_expert_intermediate_size=None,
        moe_layer_freq=1,
        num_layers=32,
        moe_ffn_hidden_size=None,
        mtp_num_layers=None,
        normalization="RMSNorm",
        multi_latent_attention=False,
        padded_vocab_size=128256,
        untie_embeddings_and_output_weights=True,
        ffn_hidden_size=14336,
        moe_latent_size=None,
        moe_router_topk=2,
        add_bias_linear=False,
        expert_tensor_parallel_size=2,
        expert_model_parallel_size=1,
        pipeline_model_parallel_size=2,
        tensor_model_parallel_size=2,
        world_size=16,
        data_parallel_size=4,
        use_distributed_optimizer=True,
        virtual_pipeline_model_parallel_size=None,
        sequence_parallel=True,
        recompute_granularity="selective",
        micro_batch_size=1,
        seq_length=8192,
    )
    a.update(over)
    return SimpleNamespace(**a)


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"use_distributed_optimizer": False, "sequence_parallel": False, "recompute_granularity": None},
        {"pipeline_model_parallel_size": 1, "data_parallel_size": 8},
    ],
)
def test_hand_written_megatron_args_match_the_estimate(tmu, over):
    """The same run described to Megatron-LM by hand and to kilocard as a config gives the same bytes."""
    import dataclasses

    from kilocard.config.schema import (
        ClusterConfig,
        ModelConfig,
        ParallelConfig,
        PrecisionConfig,
        RunConfig,
        TrainerConfig,
    )

    a = _llama_like_megatron_args(**over)
    cfg = dataclasses.replace(
        RunConfig(),
        model=ModelConfig(
            num_layers=32,
            hidden_size=4096,
            ffn_hidden_size=14336,
            num_attention_heads=32,
            num_query_groups=8,
            seq_length=8192,
            max_position_embeddings=8192,
            vocab_size=128256,
            make_vocab_size_divisible_by=128,
            normalization="RMSNorm",
            gated_linear_unit=True,
            activation="swiglu",
            add_bias_linear=False,
            position_embedding_type="rope",
            share_embeddings_and_output_weights=False,
        ),
        parallel=ParallelConfig(
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=a.pipeline_model_parallel_size,
            sequence_parallel=a.sequence_parallel,
            recompute_granularity=a.recompute_granularity,
            use_distributed_optimizer=a.use_distributed_optimizer,
        ),
        precision=PrecisionConfig(bf16=True, params_dtype="bfloat16", grad_reduce_in_fp32=True),
        cluster=ClusterConfig(gpu="h100-sxm5-80gb", nodes=2, gpus_per_node=8, nvlink_domain_size=8),
        trainer=TrainerConfig(micro_batch_size=1, global_batch_size=64),
    )
    lay = compute_layout(cfg)
    est = estimate_memory(cfg, lay)
    w = tmu.compute_weight_and_optimizer_memory(copy.copy(a))
    act = _oracle_activations(tmu, a, lay.num_microbatches)
    assert math.isclose(est.weights + est.gradients + est.optimizer, w, rel_tol=1e-9)
    assert est.activations == math.ceil(act)
