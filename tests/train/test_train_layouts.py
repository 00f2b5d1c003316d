"""Each parallel layout trains on 4 CPU ranks (gloo) on the shipped tiny corpus and its loss falls.

TP2xPP2 is covered by tests/train/test_ckpt_resume_reshard.py (its straight run), to keep the suite lean.
"""

from __future__ import annotations

import json

import pytest

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

LAYOUTS = {
    "pp2_vp2": [
        "recipe=tiny_gpt",
        "parallel.pipeline_model_parallel_size=2",
        "parallel.virtual_pipeline_model_parallel_size=2",
        "parallel.overlap_p2p_comm=true",
    ],
    # Megatron-Core builds the stages a pipeline layout names (4 layers: 2 + 0 | 1 + 1 over PP2 x VP2)
    "pp2_layout": [
        "recipe=tiny_gpt",
        "parallel.pipeline_model_parallel_size=2",
        "parallel.virtual_pipeline_model_parallel_size=2",
        "parallel.overlap_p2p_comm=true",
        "parallel.pipeline_model_parallel_layout='Ett|t|t|L'",
    ],
    "ep2_moe": ["recipe=tiny_moe", "parallel.expert_model_parallel_size=2"],
    "tp2_ep2_moe": [
        "recipe=tiny_moe",
        "parallel.tensor_model_parallel_size=2",
        "parallel.expert_model_parallel_size=2",
        "parallel.sequence_parallel=true",
    ],
    "dp4_distopt": ["recipe=tiny_gpt", "parallel.use_distributed_optimizer=true"],
}


def losses(run_dir):
    """Per-step losses from metrics.jsonl."""
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 4-rank training
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_trains_and_loss_falls(kilocard_run, name):
    code, out, run_dir = kilocard_run(*LAYOUTS[name], "data=tiny_corpus", "trainer.train_iters=6", "--nproc", "4")
    assert code == 0, out[-3000:]
    ls = losses(run_dir)
    assert len(ls) == 6
    assert ls[-1] < ls[0] - 0.5, f"{name}: loss did not fall: {ls}"
    assert (run_dir / "checkpoints" / "latest_committed.txt").read_text().strip() == "6"
