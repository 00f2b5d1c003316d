"""``kilocard.rundir.goodput_report`` on hand-written records (a real frozen tiny_gpt config beside them),
for the cases a real run cannot be made to produce on demand, and the verb's bad input."""

from __future__ import annotations

import json

import pytest

from kilocard.commands import main
from kilocard.config.compose import compose
from kilocard.rundir import events
from kilocard.rundir.freeze import write_frozen
from kilocard.rundir.goodput_report import NoRecords, report
from kilocard.rundir.names import METRICS_FILE


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with tiny_gpt's frozen config and no records yet."""
    write_frozen(compose(["recipe=tiny_gpt", "checkpoint.save_interval=2"]), tmp_path)
    return tmp_path


def _step(step: int, end: float, dt: float = 1.0) -> dict:
    return {"step": step, "time": end, "step_time_s": dt}


def _write(run_dir, evts: list[dict], recs: list[dict]) -> None:
    for e in evts:
        events.append(run_dir, e.pop("event"), when=e.pop("time"), **e)
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_rank_0_killed_without_an_exit_record_is_detected_at_the_next_start(run_dir):
    """Attempt 1 commits step 2 at t=13, records step 3 at t=14, then rank 0 dies (no exit event); attempt
    2 starts at t=30, resumes step 2 (dropping step 3) and ends step 3 at t=40."""
    _write(
        run_dir,
        [
            {"event": "start", "time": 10.0, "world_size": 2},
            {"event": "resume", "time": 10.5, "step": 0, "superseded_step": None, "superseded_time": None},
            {"event": "commit", "time": 13.0, "step": 2, "seconds": 0.5, "tier": events.PERSISTENT},
            {"event": "start", "time": 30.0, "world_size": 2},
            {"event": "resume", "time": 35.0, "step": 2, "superseded_step": 3, "superseded_time": 14.0},
            {"event": "commit", "time": 42.0, "step": 4, "seconds": 0.5, "tier": events.PERSISTENT},
            {"event": "exit", "time": 43.0, "code": 0},
        ],
        [_step(1, 11.5), _step(2, 12.5), _step(3, 40.0), _step(4, 41.0)],
    )
    r = report(run_dir)
    assert (r.wall_s, r.productive_s, r.checkpoint_persistent_s, r.checkpoint_local_s) == (33.0, 4.0, 1.0, 0.0)
    [f] = r.faults
    assert (f.step, f.kind, f.steps_recomputed) == (3, "killed", 1)
    assert f.seconds_to_detect == 30.0 - 14.0  # no exit record: the next attempt's start
    assert f.seconds_to_resume == 40.0 - 14.0
    assert f.seconds_lost == 39.0 - 13.0  # from the commit of step 2 to the start of the new step 3


def test_a_retry_exit_is_no_fault(run_dir):
    """A stop after a committed save (exit 75, a time limit) followed by a resume is not a fault."""
    _write(
        run_dir,
        [
            {"event": "start", "time": 0.0},
            {"event": "commit", "time": 3.0, "step": 2, "seconds": 0.5, "tier": events.PERSISTENT},
            {"event": "exit", "time": 3.5, "code": 75},
            {"event": "start", "time": 10.0},
            {"event": "resume", "time": 11.0, "step": 2, "superseded_step": None, "superseded_time": None},
        ],
        [_step(1, 1.0), _step(2, 2.0), _step(3, 12.0)],
    )
    assert report(run_dir).faults == ()


def test_a_directory_without_events_is_no_records(run_dir):
    with pytest.raises(NoRecords, match="no launch attempt"):
        report(run_dir)


def test_goodput_verb_refuses_a_directory_that_never_trained_in_one_line(run_dir, tmp_path_factory, capsys):
    assert main(["goodput", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kilocard goodput: error: RUN_DIR: ") and "events" in err[0]
    missing = tmp_path_factory.mktemp("x") / "nope"
    assert main(["goodput", str(missing)]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"time": None}, "metrics.jsonl line 2: time is not a number"),
        ({"time": "soon"}, "metrics.jsonl line 2: time is not a number"),
        ({"step_time_s": "NaN"}, "metrics.jsonl line 2: step_time_s is not a number"),
        ({"step_time_s": float("nan")}, "metrics.jsonl line 2: step_time_s is nan, not a finite number >= 0"),
        ({"step_time_s": -1}, "metrics.jsonl line 2: step_time_s is -1, not a finite number >= 0"),
    ],
)
def test_records_that_are_no_numbers_are_skipped_with_a_warning(bad, expected, run_dir, capsys):
    """A null or string time was a TypeError traceback; a NaN step time made ``--format json`` print NaN. Every
    reader checks a record's shape and range (``rundir.metrics.record_problem``): the record is skipped with a
    warning naming its line, as a NUL-filled line is, and the report is made of the others."""
    from kilocard.rundir import metrics

    metrics._WARNED.clear()
    recs = [_step(1, 11.0), {**_step(2, 12.0), **bad}]
    _write(run_dir, [{"event": "start", "time": 10.0, "world_size": 1}], recs)
    assert main(["goodput", str(run_dir), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert expected in err and "the line is skipped" in err, err
    assert json.loads(out)["productive_s"] == _step(1, 11.0)["step_time_s"], out  # step 1 alone


def test_metrics_file_that_is_a_directory_is_one_line(run_dir, capsys):
    _write(run_dir, [{"event": "start", "time": 10.0, "world_size": 1}], [])
    (run_dir / METRICS_FILE).unlink()
    (run_dir / METRICS_FILE).mkdir()
    assert main(["goodput", str(run_dir)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"kilocard goodput: error: RUN_DIR: {run_dir / METRICS_FILE}: is a directory, not a regular file"
    )


def test_json_never_holds_nan_or_infinity(run_dir, capsys):
    """Times far apart overflow to infinity: JSON has no such number, so the field is null."""
    _write(run_dir, [{"event": "start", "time": -1.7e308, "world_size": 1}], [_step(1, 1.7e308)])
    assert main(["goodput", str(run_dir), "--format", "json"]) == 0
    text = capsys.readouterr().out
    assert "NaN" not in text and "Infinity" not in text and json.loads(text)["wall_s"] is None
