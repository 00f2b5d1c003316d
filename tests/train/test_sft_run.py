"""``recipe=tiny_llama_sft``: supervised fine-tuning of the tiny Llama on the shipped chat set, one CPU rank.

The loss falls, the held-out validation split is evaluated every ``trainer.eval_interval`` steps, and
the whole run stays under a minute. (That only assistant targets carry loss is shown on the samples
themselves: tests/data/test_data_sft.py.)
"""

from __future__ import annotations

import json
import time

import pytest

from conftest import KilocardRun

pytestmark = pytest.mark.slow


def test_tiny_llama_sft_trains_and_evaluates_in_under_a_minute(tmp_path) -> None:
    started = time.monotonic()
    code, out, run_dir = KilocardRun(tmp_path)("recipe=tiny_llama_sft", "--nproc", "1")
    elapsed = time.monotonic() - started
    assert code == 0, out[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r["loss"] for r in records if "split" not in r]
    valid = [(r["step"], r["loss"]) for r in records if r.get("split") == "valid"]
    assert len(train) == 30
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5 - 1.0  # from about 5.8 to about 4
    assert [s for s, _ in valid] == [10, 20, 30] and valid[-1][1] < valid[0][1]
    assert elapsed < 60, f"{elapsed:.0f} s"
