"""One owner per checkpoint directory, with real ranks: run B never loads or commits into run A's
``checkpoint.save``, also when B's run directory was written before A committed there (two jobs queued with
the same save directory, each validated while it was still empty). And a lost tracker never restarts A
from step 0: its resume recovers the newest step whose manifest verifies."""

from __future__ import annotations

import pytest

from kilocard import exitcodes
from kilocard.config.compose import compose
from kilocard.launch.rundir import create_run_dir
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events

pytestmark = pytest.mark.slow

ARGS = ["recipe=tiny_gpt", "trainer.train_iters=2", "trainer.tensorboard=false"]


def test_run_b_never_loads_or_commits_into_run_a_s_checkpoint_directory(kilocard_run, tmp_path):
    shared = tmp_path / "shared"
    b_dir = create_run_dir(compose([*ARGS, f"checkpoint.save={shared}", "launcher.run_name=b"]), [], tmp_path / "runs")
    code, out, a_dir = kilocard_run(*ARGS, f"checkpoint.save={shared}", "launcher.run_name=a")
    assert code == exitcodes.DONE, out[-3000:]
    assert a_dir is not None and ck.read_owner(shared) == ck.run_id(a_dir)
    before = sorted(p.name for p in shared.iterdir())

    code, out, _ = kilocard_run("--resume", str(b_dir))
    assert code == exitcodes.BAD_CONFIG, out[-3000:]
    assert f"belongs to run {ck.run_id(a_dir)}" in out and "checkpoint.load=" in out
    assert sorted(p.name for p in shared.iterdir()) == before and ck.latest_committed(shared) == 2
    ck.verify_step(ck.step_dir(shared, 2))
    assert not (b_dir / "metrics.jsonl").exists(), "run B trained"

    code, out, _ = kilocard_run(*ARGS, f"checkpoint.save={shared}")  # a new run is refused before it starts
    assert code == 1 and "CHECKPOINT_SAVE_OWNED" in out

    # Its owner, with the tracker lost, recovers it instead of training again from step 0 over its steps.
    (shared / ck.TRACKER).unlink()
    code, out, _ = kilocard_run("--resume", str(a_dir))
    log = (a_dir / "logs" / "train.log").read_text(errors="replace")
    assert code == exitcodes.DONE, out[-3000:]
    assert "recovered it: step 2 is the newest step whose manifest verifies" in log
    assert [e["step"] for e in events.read(a_dir) if e["event"] == "resume"] == [0, 2]
    assert ck.latest_committed(shared) == 2
