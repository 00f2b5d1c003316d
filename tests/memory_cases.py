"""Random Megatron-style run configs (typed ``RunConfig``) for the memory and validator tests."""

from __future__ import annotations

import dataclasses
import random

from kilocard.config.schema import ClusterConfig, ModelConfig, ParallelConfig, PrecisionConfig, RunConfig, TrainerConfig


def _divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


def random_run_config(
    rng: random.Random, moe: bool | None = None, mla: bool | None = None, cp1: bool = False
) -> RunConfig:
    """A valid-by-construction layout on an 8-GPU-node H100 cluster, in Megatron's formula domain.

    bf16 params, fp32 gradients, Adam, RoPE, no linear biases (what Megatron-LM's formula counts).
    """
    moe = rng.random() < 0.4 if moe is None else moe
    mla = (rng.random() < 0.2) if mla is None else mla
    tp = rng.choice([1, 2, 4, 8])
    heads = tp * rng.choice([1, 2, 4, 8])
    h = heads * rng.choice([32, 64, 128])
    groups = rng.choice([None] + [g for g in _divisors(heads) if g % tp == 0 or tp % g == 0])
    pp = rng.choice([1, 1, 2, 4, 8])
    vp = rng.choice([None, 2]) if pp > 2 else None
    layers = pp * (vp or 1) * rng.randint(1, 6)
    cp = 1 if cp1 else rng.choice([1, 1, 2, 4])
    dp = rng.choice([1, 2, 4, 8, 16])
    world = tp * pp * cp * dp
    experts = rng.choice([8, 16, 64, 256]) if moe else None
    ep_choices = [e for e in _divisors(experts) if (world // pp) % (e * tp) == 0] if moe else [1]
    ep = rng.choice(ep_choices or [1])
    mbs = rng.choice([1, 2, 4])
    m = rng.choice([1, 2, 3, 8]) * (pp if vp else 1)
    seq = rng.choice([1024, 2048, 4096, 8192])
    model = ModelConfig(
        name="random",
        num_layers=layers,
        hidden_size=h,
        num_attention_heads=heads,
        num_query_groups=None if mla else groups,
        ffn_hidden_size=rng.choice([None, 4 * h, int(h * 8 / 3) // 64 * 64 or 64]),
        seq_length=seq,
        max_position_embeddings=seq,
        vocab_size=rng.choice([32000, 50257, 128256]),
        normalization=rng.choice(["RMSNorm", "LayerNorm"]),
        gated_linear_unit=rng.random() < 0.7,
        add_bias_linear=False,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=rng.random() < 0.5,
        num_moe_experts=experts,
        moe_router_topk=rng.choice([1, 2, 8]) if moe else 2,
        moe_ffn_hidden_size=rng.choice([None, h // 2, 2 * h]) if moe else None,
        moe_shared_expert_intermediate_size=rng.choice([None, h]) if moe else None,
        moe_layer_freq=rng.choice([1, 2, [0] + [1] * (layers - 1)]) if moe else 1,
        multi_latent_attention=mla,
        q_lora_rank=rng.choice([None, 768]) if mla else None,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        mtp_num_layers=rng.choice([None, None, 1]),
    )
    sp = tp > 1 and (moe or rng.random() < 0.6)
    par = ParallelConfig(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        sequence_parallel=sp,
        use_distributed_optimizer=rng.random() < 0.5,
        overlap_p2p_comm=bool(vp),
        recompute_granularity=rng.choice([None, "selective"]),
    )
    gpn = 8
    nodes = max(1, world // gpn)
    if world < gpn:
        gpn = world
    cluster = ClusterConfig(
        name="h100",
        gpu="h100-sxm5-80gb",
        nodes=nodes,
        gpus_per_node=gpn,
        nvlink_domain_size=gpn,
        env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    )
    prec = PrecisionConfig(bf16=True, params_dtype="bfloat16", grad_reduce_in_fp32=True)
    trainer = TrainerConfig(micro_batch_size=mbs, global_batch_size=mbs * dp * m)
    return dataclasses.replace(RunConfig(), model=model, parallel=par, cluster=cluster, precision=prec, trainer=trainer)
