"""One owner per checkpoint directory (file level, no ranks): the owner file, the manifest's run, the refusal
of a new run whose ``checkpoint.save`` holds another run's steps, and the lock of an outside directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import lock as runlock
from run_configs import cfg_of


def _commit(root: Path, step: int, owner: str | None) -> None:
    d = ck.step_dir(root, step)
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"weights" * 10)
    ck.commit_step(root, step, keep_last=10, owner=owner)


def test_every_committed_step_names_its_run(tmp_path):
    _commit(tmp_path / "shared", 4, owner="/runs/a")
    manifest = json.loads((ck.step_dir(tmp_path / "shared", 4) / ck.MANIFEST).read_text())
    assert manifest["run"] == "/runs/a"
    assert ck.owner_of(tmp_path / "shared") == "/runs/a"  # from the manifest when no owner file was written


def test_claim_records_the_owner_and_refuses_another_run(tmp_path):
    shared = tmp_path / "shared"
    ck.claim_owner(shared, "/runs/a", inside=False)
    with pytest.raises(ck.ForeignCheckpoint, match="belongs to run /runs/a"):  # A may be training: no step yet
        ck.claim_owner(shared, "/runs/b", inside=False)
    _commit(shared, 4, owner="/runs/a")
    ck.claim_owner(shared, "/runs/a", inside=False)  # the owner resumes: fine
    with pytest.raises(ck.ForeignCheckpoint) as e:
        ck.claim_owner(shared, "/runs/b", inside=False)
    msg = str(e.value)
    assert "run /runs/a" in msg and "kilocard run --resume /runs/a" in msg and f"checkpoint.load={shared}" in msg


def test_steps_of_an_unknown_run_are_foreign_outside_the_run_dir_and_adopted_inside(tmp_path):
    legacy = tmp_path / "legacy"
    _commit(legacy, 2, owner=None)  # written before owners were recorded, or by kilocard convert
    with pytest.raises(ck.ForeignCheckpoint, match="a run that did not record its name"):
        ck.claim_owner(legacy, "/runs/b", inside=False)
    ck.claim_owner(legacy, "/runs/own", inside=True)  # a run's own checkpoints/ from an older kilocard
    assert ck.read_owner(legacy) == "/runs/own"
    ck.claim_owner(legacy, "/moved/own", inside=True)  # the run directory was copied or moved: still its own
    assert ck.read_owner(legacy) == "/moved/own"


def test_an_empty_or_missing_save_directory_has_no_owner(tmp_path):
    assert ck.owner_of(tmp_path / "nothing") is None
    assert ck.fresh_save_issues(str(tmp_path)) == []
    assert ck.fresh_save_issues(None) == []


def test_a_new_run_refuses_a_save_directory_holding_another_runs_steps(tmp_path, monkeypatch, capsys):
    """Run A committed into ``shared``; run B with the same ``checkpoint.save`` must not load or commit there:
    ``kilocard run`` refuses with exit 1 before a run directory is written (once: B trained on A's steps)."""
    shared = tmp_path / "shared"
    _commit(shared, 4, owner=str(tmp_path / "runs" / "a"))
    monkeypatch.chdir(tmp_path)
    rc = main(["run", f"checkpoint.save={shared}", f"cluster.shared_fs={tmp_path / 'runs'}"])
    err = capsys.readouterr()
    assert rc == 1
    text = err.out + err.err
    assert "CHECKPOINT_SAVE_OWNED" in text and f"run {tmp_path / 'runs' / 'a'}" in text
    assert "--resume" in text and "checkpoint.load=" in text
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert ck.latest_committed(shared) == 4 and sorted(p.name for p in shared.glob("step_*")) == ["step_0000004"]


def test_validate_names_the_owner_of_a_relative_save(tmp_path, monkeypatch, capsys):
    _commit(tmp_path / "shared", 4, owner="/runs/a")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "checkpoint.save=shared"]) == 1
    assert "CHECKPOINT_SAVE_OWNED" in capsys.readouterr().out


def test_an_outside_checkpoint_directory_is_locked_like_the_run_directory(tmp_path):
    """The launcher locks ``checkpoint.save`` with the run directory's token: a second writer is refused."""
    shared = tmp_path / "shared"
    shared.mkdir()
    held = runlock.acquire(shared, "token-a", what="checkpoint directory")
    try:
        with pytest.raises(runlock.RunDirBusy, match=f"checkpoint directory {shared} is in use"):
            runlock.acquire(shared, what="checkpoint directory")
        assert runlock.claim(shared, "token-a", wait_s=0, what="checkpoint directory") is None  # its own ranks
    finally:
        held.release()


def test_where_checkpoints_go_and_whether_they_are_outside(tmp_path):
    run = tmp_path / "run"
    own, shared = cfg_of({}), cfg_of({"checkpoint.save": str(tmp_path / "shared")})
    assert ck.checkpoint_root(run, own) == run / "checkpoints"
    assert not ck.outside(ck.checkpoint_root(run, own), run)
    assert ck.outside(ck.checkpoint_root(run, shared), run)


def test_kilocard_run_refuses_a_checkpoint_directory_another_writer_holds(tmp_path, monkeypatch, capsys):
    """The launcher takes the outside ``checkpoint.save``'s lock too: held elsewhere, the run is refused with
    exit 1 naming the holder, before any rank starts (nothing trained, nothing written there)."""
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.chdir(tmp_path)
    run_dir = create_run_dir(compose(["trainer.train_iters=2", f"checkpoint.save={shared}"]), [], tmp_path / "runs")
    held = runlock.acquire(shared, what="checkpoint directory")
    try:
        assert main(["run", "--resume", str(run_dir)]) == 1
    finally:
        held.release()
    assert f"checkpoint directory {shared} is in use by another writer" in capsys.readouterr().err
    assert not (run_dir / "metrics.jsonl").exists() and sorted(p.name for p in shared.iterdir()) == [".lock"]
