"""``kilocard goodput`` on a real faulted run: two gloo CPU ranks of tiny_gpt, rank 1 SIGKILLed mid-run,
then ``kilocard run --resume``. The time the report says the fault cost is checked against what this
test measured with its own clock (within 10%)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from faults import EVERY, ITERS, TINY, kill_rank, records, run_until, tracker
from kilocard import exitcodes
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events

pytestmark = pytest.mark.slow

TOLERANCE = 0.10
"""The reported lost time may differ from the measured one by this fraction."""


def _resume_watching(kilocard_run, run_dir, step: int) -> tuple[int, float]:
    """``kilocard run --resume``; returns (exit code, unix time at which this test first saw a record of
    ``step`` written by the resumed run in metrics.jsonl, polled every 50 ms)."""
    launched = time.time()
    proc = kilocard_run.start("--resume", str(run_dir))
    drain = threading.Thread(target=proc.communicate, daemon=True)  # keeps the output pipe from filling
    drain.start()
    seen = None
    while seen is None and proc.poll() is None:
        if any(r["step"] == step and r["time"] > launched for r in records(run_dir)):
            seen = time.time()
        time.sleep(0.05)
    drain.join(timeout=300)
    assert seen is not None, f"the resumed run wrote no record of step {step}"
    return proc.wait(), seen


def test_goodput_reports_the_time_a_killed_rank_cost(kilocard_run):
    """The report names the fault (step, kind, recomputed steps) and its lost time within 10% of the
    time this test measured from the resumed commit to the first step trained after the fault."""
    killed: list[float] = []

    def kill(proc, _run_dir, step):
        if step <= EVERY:
            return False
        killed.append(time.time())
        kill_rank(proc, 1)
        return True

    code, out, run_dir, took = run_until(kilocard_run, TINY, kill)
    assert code == exitcodes.FAULT, out[-3000:]
    committed = tracker(run_dir)
    assert committed is not None and committed < ITERS
    commit_time = (ck.step_dir(run_dir / "checkpoints", committed) / "manifest.json").stat().st_mtime
    recorded = max(r["step"] for r in records(run_dir))

    code, first_seen = _resume_watching(kilocard_run, run_dir, committed + 1)
    assert code == exitcodes.DONE
    assert all("time" in r for r in records(run_dir))
    assert [e["event"] for e in events.read(run_dir)].count("start") == 2

    cli = [sys.executable, "-m", "kilocard.cli", "goodput", str(run_dir), "--format", "json"]
    got = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)
    assert set(got) == {"wall_s", "productive_s", "goodput", "checkpoint_s", "eval_s", "faults"}
    assert set(got["checkpoint_s"]) == {"local", "persistent"} and got["checkpoint_s"]["local"] == 0
    assert got["checkpoint_s"]["persistent"] > 0
    assert 0 < got["productive_s"] < got["wall_s"] and got["goodput"] == got["productive_s"] / got["wall_s"]
    [fault] = got["faults"]
    assert fault["kind"] == "rank_lost" and fault["step"] >= recorded
    assert fault["steps_recomputed"] == fault["step"] - committed
    assert 0 <= fault["seconds_to_detect"] <= took + 1
    measured_lost = first_seen - commit_time
    measured_resume = first_seen - killed[0]
    # a step's record is written once the next step computed: the test sees it a step (and a poll) late
    assert abs(fault["seconds_lost"] - measured_lost) <= TOLERANCE * measured_lost, (fault, measured_lost)
    assert abs(fault["seconds_to_resume"] - measured_resume) <= TOLERANCE * measured_resume, (fault, measured_resume)
