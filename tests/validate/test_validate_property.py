"""Property: on thousands of arbitrary configs the validator never raises and always reports.

``validate`` is pure, so this runs in-process on typed ``RunConfig`` trees whose fields are drawn
from value pools that include nonsense (zero and negative sizes, unknown GPUs and dtypes, a
62,500-node world): 500 examples searched by hypothesis (which shrinks a failure to a minimal
config) and 5,000 more drawn uniformly with a seeded ``random.Random``.
"""

from __future__ import annotations

import dataclasses
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilocard.config.schema import RunConfig
from kilocard.topology import GPU_TABLE
from kilocard.validate import validate
from kilocard.validate.issues import Report

SIZES = [1, 1, 2, 3, 4, 8, 16, 0, -1]
OPT_SIZES = [None, None] + SIZES
SMALL = [None, -1, 0, 1, 2, 3, 5, 8]
POOLS: dict[str, list[object]] = {
    "model.num_layers": [-1, 0, 1, 2, 3, 4, 8, 61, 126],
    "model.hidden_size": [0, 8, 64, 96, 4096, 16384],
    "model.num_attention_heads": [0, 1, 3, 4, 8, 64, 128],
    "model.num_query_groups": SMALL,
    "model.kv_channels": [None, 0, 16, 128],
    "model.ffn_hidden_size": [None, 0, 256, 53248],
    "model.seq_length": [0, 7, 32, 4096, 131072],
    "model.max_position_embeddings": [0, 32, 131072],
    "model.vocab_size": [0, 128, 50257, 129280],
    "model.make_vocab_size_divisible_by": [0, 1, 128],
    "model.gated_linear_unit": [False, True],
    "model.add_bias_linear": [False, True],
    "model.share_embeddings_and_output_weights": [False, True],
    "model.position_embedding_type": ["rope", "learned_absolute", "none"],
    "model.num_moe_experts": [None, None, 0, 1, 4, 6, 64, 256, 4096],
    "model.moe_router_topk": [0, 1, 2, 8, 9],
    "model.moe_ffn_hidden_size": [None, 0, 128, 2048],
    "model.moe_shared_expert_intermediate_size": [None, 0, 2048],
    "model.moe_layer_freq": [-1, 0, 1, 2, [], [0, 1], [1, 1, 1, 1]],
    "model.multi_latent_attention": [False, True],
    "model.q_lora_rank": [None, 0, 1536],
    "model.mtp_num_layers": [None, 0, 1, 2],
    "model.moe_grouped_gemm": [False, True],
    "parallel.tensor_model_parallel_size": SIZES,
    "parallel.pipeline_model_parallel_size": SIZES,
    "parallel.context_parallel_size": SIZES,
    "parallel.expert_model_parallel_size": SIZES + [64, 400],
    "parallel.expert_tensor_parallel_size": OPT_SIZES,
    "parallel.virtual_pipeline_model_parallel_size": OPT_SIZES,
    "parallel.sequence_parallel": [False, True],
    "parallel.use_distributed_optimizer": [False, True],
    "parallel.overlap_grad_reduce": [False, True],
    "parallel.overlap_param_gather": [False, True],
    "parallel.tp_comm_overlap": [False, True],
    "parallel.overlap_p2p_comm": [False, True],
    "parallel.num_layers_in_first_pipeline_stage": SMALL,
    "parallel.num_layers_in_last_pipeline_stage": SMALL,
    "parallel.account_for_embedding_in_pipeline_split": [False, True],
    "parallel.account_for_loss_in_pipeline_split": [False, True],
    "parallel.recompute_granularity": [None, None, "full", "selective", "bogus"],
    "parallel.recompute_method": [None, "uniform", "block", "x"],
    "parallel.recompute_num_layers": SMALL,
    "parallel.cp_within_nvlink": [False, True],
    "parallel.tp_within_node": [False, True],
    "precision.bf16": [False, True],
    "precision.fp16": [False, True],
    "precision.fp8": [None, None, "hybrid", "e5m2"],
    "precision.fp4": [None, None, "nvfp4"],
    "precision.fp8_param": [False, True],
    "precision.fp8_recipe": ["delayed", "mxfp8", "?"],
    "precision.params_dtype": ["float32", "bfloat16", "float16", "int8"],
    "precision.grad_reduce_in_fp32": [False, True],
    "optim.optimizer": ["adam", "sgd", "lion"],
    "cluster.gpu": list(GPU_TABLE) + ["tpu-v5"],
    "cluster.nodes": [0, 1, 2, 3, 128, 62500],
    "cluster.gpus_per_node": [0, 1, 4, 6, 8],
    "cluster.nvlink_domain_size": [0, 1, 8, 72],
    "cluster.hbm_bytes": [None, None, 0, 1 << 30],
    "cluster.env": [{}, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}],
    "launcher.kind": ["local", "slurm", "k8s"],
    "launcher.nproc": [0, 1, 8],
    "trainer.micro_batch_size": [-1, 0, 1, 2, 8],
    "trainer.global_batch_size": [-1, 0, 1, 7, 64, 4096, 50000],
    "trainer.train_iters": [0, 1, 10],
}


def build(values: dict[str, object]) -> RunConfig:
    """A ``RunConfig`` with the dotted fields of ``values`` replaced."""
    cfg, groups = RunConfig(), {}
    for path, v in values.items():
        g, f = path.split(".")
        groups.setdefault(g, {})[f] = v
    return dataclasses.replace(cfg, **{g: dataclasses.replace(getattr(cfg, g), **fs) for g, fs in groups.items()})


def check(cfg: RunConfig) -> None:
    report = validate(cfg)
    assert isinstance(report, Report)
    d = json.loads(report.to_json())
    assert d["valid"] == (not any(i["severity"] == "error" for i in d["issues"]))
    for issue in d["issues"]:
        assert issue["severity"] in ("error", "warning") and issue["code"] and issue["field"] and issue["message"]


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(st.fixed_dictionaries({k: st.sampled_from(v) for k, v in POOLS.items()}))
def test_validate_never_raises_hypothesis(values):
    check(build(values))


def test_validate_never_raises_uniform_random():
    rng = random.Random(62500)
    for _ in range(5000):
        check(build({k: rng.choice(v) for k, v in POOLS.items()}))
