"""What the memory estimate does beyond Megatron-LM's formula, and the invariants a user relies on."""

from __future__ import annotations

import dataclasses

import pytest

from kilocard.config.schema import RunConfig
from kilocard.layout import compute_layout
from kilocard.perf.memory import bytes_per_param, estimate_memory
from run_configs import cfg_of

BASE = {
    "cluster.gpu": "h100-sxm5-80gb",
    "cluster.nodes": 4,
    "cluster.gpus_per_node": 8,
    "cluster.nvlink_domain_size": 8,
    "launcher.kind": "slurm",
    "model.num_layers": 16,
    "model.hidden_size": 4096,
    "model.num_attention_heads": 32,
    "model.seq_length": 4096,
    "model.max_position_embeddings": 4096,
    "model.vocab_size": 32000,
    "model.position_embedding_type": "rope",
    "model.add_bias_linear": False,
    "precision.bf16": True,
    "precision.params_dtype": "bfloat16",
    "precision.grad_reduce_in_fp32": True,
    "trainer.global_batch_size": 256,
    "trainer.micro_batch_size": 1,
    "parallel.tensor_model_parallel_size": 4,
    "parallel.sequence_parallel": True,
}


def est(**over):
    cfg = cfg_of({**BASE, **{k.replace("__", "."): v for k, v in over.items()}})
    return estimate_memory(cfg, compute_layout(cfg))


def test_bf16_adam_costs_2_4_12_bytes_per_parameter_and_fp32_4_4_8():
    assert bytes_per_param(cfg_of(BASE)) == dataclasses.replace(
        bytes_per_param(cfg_of(BASE)), weight=2, grad=4, optim=12
    )
    fp32 = bytes_per_param(RunConfig())
    assert (fp32.weight, fp32.grad, fp32.optim) == (4, 4, 8)


def test_distributed_optimizer_shards_optimizer_state_over_dp():
    plain, dist = est(), est(parallel__use_distributed_optimizer=True)
    assert dist.weights == plain.weights and dist.gradients == plain.gradients
    assert abs(dist.optimizer * 8 - plain.optimizer) <= 8  # dp = 32 / tp 4 = 8


def test_expert_optimizer_state_is_sharded_over_expert_dp():
    moe = dict(model__num_moe_experts=8, model__moe_ffn_hidden_size=4096)
    ep1, ep8 = est(**moe, parallel__expert_model_parallel_size=1), est(**moe, parallel__expert_model_parallel_size=8)
    assert ep8.params_on_stage < ep1.params_on_stage and ep8.optimizer < ep1.optimizer  # experts split over EP
    d1 = est(**moe, parallel__expert_model_parallel_size=1, parallel__use_distributed_optimizer=True)
    d8 = est(**moe, parallel__expert_model_parallel_size=8, parallel__use_distributed_optimizer=True)
    # distributed optimizer: expert state / (etp * ep * expert_dp) = / world either way
    assert d1.optimizer == d8.optimizer < ep8.optimizer


def test_recompute_and_context_parallel_cut_activations():
    base = est(parallel__recompute_granularity="selective")
    full = est(
        parallel__recompute_granularity="full", parallel__recompute_method="uniform", parallel__recompute_num_layers=1
    )
    cp2 = est(parallel__recompute_granularity="selective", parallel__context_parallel_size=2)
    assert full.activations < base.activations / 3
    assert cp2.activations < 0.6 * base.activations


def test_pipeline_parallel_splits_weights_and_interleaving_costs_activations():
    pp1, pp4 = est(), est(parallel__pipeline_model_parallel_size=4)
    vp = est(parallel__pipeline_model_parallel_size=4, parallel__virtual_pipeline_model_parallel_size=2)
    assert pp4.weights < pp1.weights / 2.5
    assert vp.activations > pp4.activations


def test_unfused_attention_stores_the_score_matrix():
    assert est(model__attention_backend="unfused").activations > 2 * est(model__attention_backend="flash").activations


def test_totals_add_up():
    e = est()
    assert e.total == e.weights + e.gradients + e.optimizer + e.activations
    assert set(e.to_json()) == {"weights", "gradients", "optimizer", "activations", "total"}


def test_fp8_keeps_linear_inputs_in_one_byte():
    bf16 = est(parallel__recompute_granularity="selective")
    fp8 = est(parallel__recompute_granularity="selective", precision__fp8="hybrid")
    assert 0.7 * bf16.activations < fp8.activations < 0.9 * bf16.activations
    assert fp8.weights == bf16.weights


# --- what published runs used beyond the formula's inputs: Megatron-FSDP, offloading, optimizer-state dtypes ---
FSDP = dict(parallel__use_megatron_fsdp=True, parallel__use_distributed_optimizer=True)


def test_zero3_shards_weights_and_gradients_over_dp_plus_the_layers_held_whole():
    plain = est(parallel__use_distributed_optimizer=True)
    zero3 = est(**FSDP, parallel__data_parallel_sharding_strategy="optim_grads_params")
    # dp = 8: each GPU keeps its 1/8 shard plus the running and the prefetched layer (2 of 16) whole,
    # and the gradients of the one layer whose reduce-scatter is pending
    assert zero3.weights == pytest.approx(plain.weights * (1 / 8 + 2 / 16), rel=1e-6)
    assert zero3.gradients == pytest.approx(plain.gradients * (1 / 8 + 1 / 16), rel=1e-6)
    assert (zero3.optimizer, zero3.activations) == (plain.optimizer, plain.activations)


def test_zero2_shards_gradients_only_and_no_shard_nothing():
    plain = est(parallel__use_distributed_optimizer=True)
    zero2 = est(**FSDP, parallel__data_parallel_sharding_strategy="optim_grads")
    assert zero2.weights == plain.weights and zero2.gradients < plain.gradients / 4
    assert est(**FSDP).total == plain.total  # no_shard: what the distributed optimizer does already


def test_offloaded_layers_activations_leave_the_gpu():
    full = est().activations
    assert est(parallel__cpu_offloading=True, parallel__cpu_offloading_num_layers=0).activations == full
    half = est(parallel__cpu_offloading=True, parallel__cpu_offloading_num_layers=8).activations
    assert 0.4 * full < half < 0.6 * full  # 8 of 16 layers' activations (the output layer's stay)


def test_precision_aware_optimizer_counts_its_state_dtypes():
    plain = est().optimizer  # fp32 master + two fp32 moments = 12 bytes per parameter
    pao = dict(optim__use_precision_aware_optimizer=True, parallel__use_distributed_optimizer=True)
    bf16 = dict(optim__exp_avg_dtype="bfloat16", optim__exp_avg_sq_dtype="bfloat16")
    dist = est(parallel__use_distributed_optimizer=True).optimizer
    # bf16 parameters: the fp32 master is kept as 16-bit remainders (2 bytes) unless that is switched off
    assert est(**pao).optimizer == pytest.approx(dist * 10 / 12, rel=1e-6)
    assert est(**pao, optim__store_param_remainders=False).optimizer == pytest.approx(dist, rel=1e-6)
    assert est(**pao, **bf16).optimizer == pytest.approx(dist * 6 / 12, rel=1e-6)
    assert plain == pytest.approx(dist * 8, rel=1e-5)
