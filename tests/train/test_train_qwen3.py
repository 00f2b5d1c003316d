"""The tiny Qwen3 twins train on two CPU ranks (gloo) as their recipes lay them out, and the loss falls:
``tiny_qwen3`` tensor parallel (TP2), ``tiny_qwen3_moe`` expert parallel (EP2); the committed step holds the
per-head query/key norms (``qk_layernorm``) and the layout it was trained in."""

from __future__ import annotations

import json

import pytest

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

RECIPES = {"tiny_qwen3": {"tp": 2, "ep": 1}, "tiny_qwen3_moe": {"tp": 1, "ep": 2}}


@pytest.mark.slow  # 2-rank training
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_the_tiny_qwen3_recipes_train_on_two_ranks_and_the_loss_falls(kilocard_run, recipe):
    from megatron.core import dist_checkpointing

    code, out, run_dir = kilocard_run(f"recipe={recipe}", "data=tiny_corpus", "trainer.train_iters=8", "--nproc", "2")
    assert code == 0, out[-3000:]
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses
    step = run_dir / "checkpoints" / "step_0000008"
    layout = json.loads((step / "trainer_state.json").read_text())["layout"]
    assert {k: layout[k] for k in RECIPES[recipe]} == RECIPES[recipe]
    keys = dist_checkpointing.load_tensors_metadata(str(step))
    assert any("self_attention.q_layernorm.weight" in k for k in keys), sorted(keys)[:20]
