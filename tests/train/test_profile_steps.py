"""``trainer.profile_steps=[a,b]`` on a real 3-step run (one CPU rank): a Chrome trace of those steps."""

from __future__ import annotations

import json

import pytest

from kilocard import exitcodes

pytestmark = pytest.mark.slow


def test_profile_steps_write_a_trace_of_the_window(kilocard_run):
    code, out, run_dir = kilocard_run(
        "recipe=tiny_gpt", "trainer.train_iters=3", "trainer.profile_steps=[2,3]", "trainer.tensorboard=false"
    )
    assert code == exitcodes.DONE, out[-3000:]
    assert [p.name for p in (run_dir / "profile").iterdir()] == ["rank_0_steps_2-3.json"]
    trace = json.loads((run_dir / "profile" / "rank_0_steps_2-3.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("aten::" in n for n in names)  # the model's operators were recorded
