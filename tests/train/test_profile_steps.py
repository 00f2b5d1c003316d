"""``trainer.profile_steps=[a,b]`` on a real 3-step run (one CPU rank): a Chrome trace of those steps."""

from __future__ import annotations

import json

import pytest

from kilocard import exitcodes

pytestmark = pytest.mark.slow


def test_profile_steps_write_a_trace_of_the_window(finished_tiny_run):
    """The shared run profiles steps 2 and 3 of 3 (``conftest.SHARED_RUN_ARGS``)."""
    code, out, run_dir = finished_tiny_run.code, finished_tiny_run.out, finished_tiny_run.run_dir
    assert code == exitcodes.DONE, out[-3000:]
    assert [p.name for p in (run_dir / "profile").iterdir()] == ["rank_0_steps_2-3.json"]
    trace = json.loads((run_dir / "profile" / "rank_0_steps_2-3.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert any("aten::" in n for n in names)  # the model's operators were recorded
    log = (run_dir / "logs" / "train.log").read_text()
    trace = run_dir.relative_to(finished_tiny_run.launcher.workdir) / "profile" / "rank_0_steps_2-3.json"
    assert f"kilocard.train: profiler: trace of steps 2-3 written to {trace} " in log, log[-3000:]
    assert "USDT:" not in log  # the profiler's own lines are filtered (kilocard.base.quiet)
