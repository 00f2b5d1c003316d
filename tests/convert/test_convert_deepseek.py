"""A tiny random ``DeepseekV3ForCausalLM`` (transformers' own config class, no download) goes through ``convert
hf-to-mcore`` without a recipe and back bit-identically (expert biases and the dense/MoE layer pattern
included), and the Megatron-Core model's logits equal transformers' at TP1, TP2 and EP2."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_hf import TOLERANCE, assert_logits_match, forward_plan, hf_tensors, model_class, round_trip, run_forward

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return round_trip("deepseek_v3", tmp_path_factory.mktemp("deepseek"))


def test_the_import_derives_the_model_and_the_export_is_bit_identical(converted) -> None:
    root, model = converted
    saved = json.loads((root / "ck" / "step_0000000" / "trainer_state.json").read_text())["model"]
    assert (saved["moe_layer_freq"], saved["moe_router_num_groups"], saved["moe_router_group_topk"]) == (
        [0, 1, 1],
        2,
        1,
    )
    assert (saved["multi_latent_attention"], saved["moe_router_enable_expert_bias"], saved["mtp_num_layers"]) == (
        True,
        True,
        None,
    )
    original, back = hf_tensors(root / "hf"), hf_tensors(root / "back")
    assert set(back) == set(original)
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in back
    assert all(torch.equal(back[k], original[k]) for k in original), [
        k for k in original if not torch.equal(back[k], original[k])
    ]
    reloaded = model_class("deepseek_v3").from_pretrained(root / "back").eval()
    tokens = torch.randint(0, 258, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(reloaded(tokens).logits, model(tokens).logits)


@pytest.mark.slow
def test_forward_matches_transformers_in_tp1_tp2_ep2(converted, tmp_path) -> None:
    root, model = converted
    layouts = [("deepseek_v3", "ck", 1, 1, 1), ("deepseek_v3", "ck", 2, 1, 1), ("deepseek_v3", "ck", 1, 1, 2)]
    plan = forward_plan(root, tmp_path, {"deepseek_v3": model}, layouts)
    out = run_forward(plan, tmp_path)
    assert_logits_match(plan, out, TOLERANCE)


@pytest.mark.slow  # trains a step
def test_an_export_of_a_model_with_mtp_says_it_dropped_the_mtp_layer(kilocard_run, tmp_path) -> None:
    """transformers' DeepseekV3ForCausalLM has no MTP module: the export writes everything else, says in its one
    line that it dropped the MTP layer, and transformers loads the result."""
    import subprocess
    import sys

    code, out, run_dir = kilocard_run("recipe=tiny_deepseek_v3", "trainer.train_iters=1", "optim.lr_warmup_iters=0")
    assert code == 0, out[-3000:]
    cmd = [sys.executable, "-W", "ignore", "-m", "kilocard.cli", "convert", "mcore-to-hf", str(run_dir / "checkpoints")]
    proc = subprocess.run([*cmd, str(tmp_path / "hf")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "dropped the 1 multi-token-prediction layer(s)" in lines[0], lines
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert (config["num_nextn_predict_layers"], config["first_k_dense_replace"], config["n_group"]) == (0, 1, 2)
    model_class("deepseek_v3").from_pretrained(tmp_path / "hf")
