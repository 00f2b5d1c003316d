"""``tiny_deepseek_v3`` trains on 2 CPU ranks (gloo) with EP 2, TP 2 and PP 2, and its loss falls; the
committed step holds what the recipe asks Megatron-Core to build: multi-latent attention with its latent
norms in every layer, a dense first layer then MoE layers (routed and shared experts, a router whose expert
bias moved during training) and the multi-token-prediction layer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

LAYOUTS = {
    # YaRN rotary embedding (MLA's default, DeepSeek-V3's) on this one
    "ep2": [
        "parallel.expert_model_parallel_size=2",
        "model.rope_type=yarn",
        "model.rotary_scaling_factor=4.0",
        "model.original_max_position_embeddings=16",
        "model.mscale_all_dim=1.0",
    ],
    "tp2": ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"],
    "pp2": ["parallel.pipeline_model_parallel_size=2"],
}


def checkpoint_tensors(step_dir: Path, suffix: str) -> dict:
    """The model tensors of a committed torch_dist step whose names end in ``suffix``, read on one process."""
    import torch
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(step_dir))
    meta = reader.read_metadata().state_dict_metadata
    out = {k: torch.empty(meta[k].size, dtype=meta[k].properties.dtype) for k in meta if k.endswith(suffix)}
    dcp.load(out, storage_reader=reader, no_dist=True)
    return out


def model_keys(step_dir: Path) -> set[str]:
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    return {k for k in meta if not k.startswith("optimizer") and "_extra_state" not in k}


@pytest.mark.slow  # 2-rank training
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_tiny_deepseek_v3_trains_and_builds_its_architecture(kilocard_run, name):
    code, out, run_dir = kilocard_run(
        "recipe=tiny_deepseek_v3", *LAYOUTS[name], "trainer.train_iters=8", "checkpoint.save_interval=8", "--nproc", "2"
    )
    assert code == 0, out[-3000:]
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, f"{name}: loss did not fall: {losses}"
    step = run_dir / "checkpoints" / "step_0000008"
    keys = model_keys(step)
    attention = "decoder.layers.{}.self_attention."
    for layer in range(4):
        for part in ("linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj"):
            assert attention.format(layer) + part + ".weight" in keys
        assert {attention.format(layer) + n + ".weight" for n in ("q_layernorm", "kv_layernorm")} <= keys
    assert "decoder.layers.0.mlp.linear_fc1.weight" in keys  # moe_layer_freq [0, 1, 1, 1]: layer 0 dense
    assert not any(k.startswith("decoder.layers.0.mlp.router") for k in keys)
    for layer in (1, 2, 3):
        for n in (
            "router.weight",
            "router.expert_bias",
            "shared_experts.linear_fc1.weight",
            "experts.experts.linear_fc1.weight",
        ):
            assert f"decoder.layers.{layer}.mlp.{n}" in keys
    assert {"mtp.layers.0.eh_proj.weight", "mtp.layers.0.transformer_layer.mlp.router.expert_bias"} <= keys
    biases = checkpoint_tensors(step, "router.expert_bias")
    assert len(biases) == 4
    assert any(b.abs().sum() > 0 for b in biases.values()), f"the expert bias never moved: {biases}"


@pytest.mark.slow  # one rank, stops at the model's build
def test_without_the_shims_mla_section_the_model_does_not_build(kilocard_run):
    """CPU shim section 12 is what lets multi-latent attention build on CPU ranks (YaRN's device context and
    0.16.1's mistaken Transformer Engine check); the run above needs it."""
    code, out, run_dir = kilocard_run(
        "recipe=tiny_deepseek_v3", "model.rope_type=yarn", "trainer.train_iters=1", KILOCARD_CPU_SHIM_SKIP="12"
    )
    assert code == 1, out[-3000:]
    assert "MLASelfAttention" in (run_dir / "logs" / "train.log").read_text()


@pytest.mark.slow  # three 2-rank runs
def test_a_pp2_run_continued_from_its_checkpoint_equals_the_uninterrupted_one(kilocard_run):
    """With PP 2 the MTP layer sits on the stage without the embedding (it keeps a tied copy) and every MoE
    layer holds its expert bias: steps 5-6 continued from step 4's checkpoint equal the uninterrupted run's
    bit for bit (weights, expert biases, Adam state and the MTP block all come back)."""
    common = ("recipe=tiny_deepseek_v3", "parallel.pipeline_model_parallel_size=2", "optim.lr_decay_iters=6")
    runs = {}
    for name, extra in {
        "whole": ("trainer.train_iters=6",),
        "first": ("trainer.train_iters=4",),
    }.items():
        code, out, run_dir = kilocard_run(*common, *extra, "--nproc", "2")
        assert code == 0, out[-3000:]
        runs[name] = run_dir
    load = f"checkpoint.load={runs['first'] / 'checkpoints'}"
    code, out, rest = kilocard_run(*common, "trainer.train_iters=6", load, "--nproc", "2")
    assert code == 0, out[-3000:]
    whole = [json.loads(line)["loss"] for line in (runs["whole"] / "metrics.jsonl").read_text().splitlines()]
    continued = [json.loads(line)["loss"] for line in (rest / "metrics.jsonl").read_text().splitlines()]
    assert continued == whole[4:], (whole, continued)
