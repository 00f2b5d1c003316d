"""A run with a relative checkpoint.save resumed from another directory keeps its history."""

from __future__ import annotations

import pytest

from conftest import SHARED_SECRET, KilocardRun
from faults import tracker
from kilocard import exitcodes

pytestmark = pytest.mark.slow


def test_relative_checkpoint_save_resumed_from_elsewhere_finds_its_steps(finished_tiny_run, tmp_path):
    """The shared run saves to ``checkpoint.save=ckrel``; ``cd elsewhere && kilocard run --resume <abs run dir>``:
    the finished run is found complete (DONE, no rank started), its metrics and checkpoints untouched."""
    code, out, run_dir = finished_tiny_run.code, finished_tiny_run.out, finished_tiny_run.run_dir
    assert code == exitcodes.DONE, out[-3000:]
    assert tracker(run_dir) is None and (finished_tiny_run.launcher.workdir / "ckrel" / "latest_committed.txt").exists()
    metrics = (run_dir / "metrics.jsonl").read_bytes()

    elsewhere = KilocardRun(tmp_path / "elsewhere")
    elsewhere.workdir.mkdir()
    code, out, _ = elsewhere("--resume", str(run_dir.resolve()), **dict([SHARED_SECRET]))
    assert code == exitcodes.DONE and "is complete: step 3 is committed" in out, out[-3000:]
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics, "the finished run's metrics were rewritten"
    assert not (elsewhere.workdir / "ckrel").exists(), "the resume wrote checkpoints relative to its cwd"
