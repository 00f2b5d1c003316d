"""``tiny_gpt_oss`` trains on 2 CPU ranks (gloo, EP 2) with Megatron-Core's local attention, and the sliding
window is really applied: the first step's loss differs from full attention's with an 8-token window and
equals it, bit for bit, with a window as long as the sequence (never a silent fallback to full attention)."""

from __future__ import annotations

import json

import pytest

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

EP2 = ("recipe=tiny_gpt_oss", "parallel.expert_model_parallel_size=2", "--nproc", "2")


def losses(run_dir) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow  # 2-rank training
def test_tiny_gpt_oss_trains_with_ep2(kilocard_run):
    code, out, run_dir = kilocard_run(*EP2, "trainer.train_iters=8")
    assert code == 0, out[-3000:]
    ls = losses(run_dir)
    assert len(ls) == 8 and ls[-1] < ls[0] - 0.5, ls


@pytest.mark.slow  # three 2-rank runs of one step
def test_the_sliding_window_changes_attention_exactly_as_a_window(kilocard_run):
    first = {}
    for name, extra in {
        "window 8": (),
        "full": ("model.window_size=null", "model.window_attn_skip_freq=null"),
        "window 64": ("model.window_size=[64,0]",),
    }.items():
        code, out, run_dir = kilocard_run(*EP2, "trainer.train_iters=1", "optim.lr_warmup_iters=0", *extra)
        assert code == 0, out[-3000:]
        first[name] = losses(run_dir)[0]
    assert first["window 8"] != first["full"], first
    assert first["window 64"] == first["full"], first
