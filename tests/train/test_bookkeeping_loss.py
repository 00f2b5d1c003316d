"""Losing or damaging a bookkeeping file never restarts a run from zero (file level, no ranks): a deleted
tracker, a torn manifest, a NUL-filled metrics line, a conversion aimed into a checkpoint tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.rundir import checkpoint as ck
from kilocard.rundir.metrics import MetricsWriter, read_metrics


def _commit(root: Path, step: int) -> Path:
    d = ck.step_dir(root, step)
    d.mkdir(parents=True)
    (d / "__0_0.distcp").write_bytes(b"weights" * 10)
    ck.commit_step(root, step, keep_last=10, owner="/runs/a")
    return d


def test_a_deleted_tracker_is_recovered_from_the_newest_step_that_verifies(tmp_path):
    _commit(tmp_path, 5)
    _commit(tmp_path, 10)
    (tmp_path / ck.TRACKER).unlink()
    note = ck.recover_tracker(tmp_path)
    assert note is not None and "step 10 is the newest step whose manifest verifies" in note
    assert ck.latest_committed(tmp_path) == 10
    assert ck.load_root_and_step(tmp_path, None, fallback=False) == (tmp_path, 10)
    assert ck.recover_tracker(tmp_path) is None  # nothing to do once it is back


def test_a_deleted_tracker_skips_a_damaged_newest_step_and_says_so(tmp_path):
    _commit(tmp_path, 5)
    (_commit(tmp_path, 10) / "__0_0.distcp").write_bytes(b"torn")
    (tmp_path / ck.TRACKER).unlink()
    note = ck.recover_tracker(tmp_path)
    assert note is not None and "step 5" in note and "step 10" in note and "newer steps fail" in note
    assert ck.latest_committed(tmp_path) == 5


def test_a_deleted_tracker_with_no_step_that_verifies_is_refused_not_restarted(tmp_path):
    (_commit(tmp_path, 5) / "__0_0.distcp").write_bytes(b"torn")
    (tmp_path / ck.TRACKER).unlink()
    with pytest.raises(ck.CheckpointError, match="refusing to start again from step 0"):
        ck.recover_tracker(tmp_path)
    assert not (tmp_path / ck.TRACKER).exists()


def test_nothing_committed_is_a_fresh_start(tmp_path):
    assert ck.recover_tracker(tmp_path) is None
    assert ck.recover_tracker(tmp_path / "absent") is None


@pytest.mark.parametrize("torn", [b'{"step": 10, "files": {"__0_', b"\x00" * 64, b"[1, 2]", b'{"step": 10}'])
def test_a_torn_newest_manifest_falls_back_or_is_bad_ckpt(tmp_path, torn):
    _commit(tmp_path, 5)
    (_commit(tmp_path, 10) / ck.MANIFEST).write_bytes(torn)
    assert ck.load_root_and_step(tmp_path, None, fallback=True) == (tmp_path, 5)
    with pytest.raises(ck.CheckpointError, match=r"manifest.json.*damaged manifest: the step cannot be verified"):
        ck.load_root_and_step(tmp_path, None, fallback=False)


def _metrics_with_a_nul_line(run_dir: Path) -> None:
    lines = [json.dumps({"step": 1, "loss": 5.0}), "\x00" * 40, json.dumps({"step": 3, "loss": 4.0})]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_nul_filled_metrics_line_is_skipped_with_a_warning_naming_it(tmp_path, capsys):
    _metrics_with_a_nul_line(tmp_path)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3]
    err = capsys.readouterr().err
    assert "metrics.jsonl line 2: NUL bytes" in err and "skipped" in err


def test_resume_over_a_nul_filled_metrics_line_drops_it_from_the_file(tmp_path):
    _metrics_with_a_nul_line(tmp_path)
    writer = MetricsWriter(tmp_path, tensorboard=False, resume_step=1)
    writer.close()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1]
    assert writer.superseded == {"step": 3, "loss": 4.0}


@pytest.mark.integration  # kilocard convert imports torch
def test_convert_never_writes_inside_a_checkpoint_tree(tmp_path, capsys):
    """``mcore-to-hf ok1 ok1/step_0000000/hfout`` once succeeded and then the step failed verification."""
    ok1 = tmp_path / "ok1"
    step = _commit(ok1, 0)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.sha256").write_text("x\n")
    for out in (step / "hfout", ok1 / "hfout", run / "checkpoints" / "hf"):
        assert main(["convert", "mcore-to-hf", str(ok1), str(out)]) == 2
        assert "lies inside the checkpoint directory" in capsys.readouterr().err
        assert not out.exists()
    ck.verify_step(step)
    assert sorted(p.name for p in ok1.iterdir()) == ["latest_committed.txt", "step_0000000"]


def _records(*steps: dict) -> str:
    return "".join(json.dumps(r, allow_nan=True) + "\n" for r in steps)


GOOD = {"step": 1, "time": 11.0, "loss": 5.0, "step_time_s": 1.0, "tflops_per_gpu": 0.01, "mfu": 0.1}


def test_metrics_records_outside_their_shape_and_range_are_skipped_with_a_warning(tmp_path, capsys):
    """``tflops_per_gpu: NaN`` or ``step_time_s: -1`` were averaged into report and goodput silently (a NUL line
    got a warning, these none): each is checked on read and skipped, named by file and line."""
    bad = [
        {**GOOD, "step": 2, "time": 12.0, "tflops_per_gpu": float("nan")},
        {**GOOD, "step": 3, "time": 13.0, "step_time_s": -1},
        {**GOOD, "step": "4", "time": 14.0},
        {"step": 2, "split": "train?", "loss": 1.0, "time": 12.5},
    ]
    (tmp_path / "metrics.jsonl").write_text(_records(GOOD, *bad, {**GOOD, "step": 5, "time": 15.0}))
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 5]
    err = capsys.readouterr().err
    for n, why in [(2, "tflops_per_gpu is nan"), (3, "step_time_s is -1"), (4, 'step "4" is not a step number')]:
        assert f"metrics.jsonl line {n}: {why}" in err and "skipped" in err, err
    assert "metrics.jsonl line 5: split" in err


def test_report_and_goodput_use_only_the_records_that_pass(tmp_path, capsys):
    from kilocard.config.compose import compose
    from kilocard.rundir import events
    from kilocard.rundir.freeze import write_frozen

    rd = tmp_path / "rd"
    rd.mkdir()
    write_frozen(compose(["recipe=tiny_gpt"]), rd)
    events.append(rd, "start", when=10.0, world_size=1)
    nan = {**GOOD, "step": 2, "time": 12.0, "tflops_per_gpu": float("nan"), "step_time_s": -1}
    (rd / "metrics.jsonl").write_text(_records(GOOD, nan, {**GOOD, "step": 3, "time": 13.0}))
    from kilocard.rundir import metrics

    for argv in (["goodput", str(rd), "--format", "json"], ["report", str(rd), "--format", "json"]):
        metrics._WARNED.clear()  # each verb is its own process in use: each warns
        capsys.readouterr()
        main(argv)
        out, err = capsys.readouterr()
        assert "metrics.jsonl line 2: step_time_s is -1, not a finite number >= 0" in err, (argv, err)
        assert "NaN" not in out and "nan" not in out.lower().replace("nan_", ""), (argv, out[:2000])
