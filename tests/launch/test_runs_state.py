"""How ``kilocard runs`` reads a run's state from its directory (``kilocard.launch.runs``): each rule of the
module docstring on a run directory written the way the trainer, the local launcher and the batch script
write theirs (real records, real frozen config; the Slurm queue as ``squeue`` prints it)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import pytest

from kilocard import exitcodes
from kilocard.commands import main
from kilocard.config.compose import compose
from kilocard.launch import runs
from kilocard.launch.slurm import parse_queue
from kilocard.rundir import events
from kilocard.rundir.freeze import write_frozen
from kilocard.rundir.lock import LOCK_FILE


def run_dir(tmp_path: Path, name: str = "r", slurm: bool = False, steps: int = 0, iters: int = 10) -> Path:
    """A tiny_gpt run directory with ``steps`` metrics records (a Slurm run has its batch script)."""
    rd = tmp_path / name
    rd.mkdir()
    write_frozen(compose(["recipe=tiny_gpt", f"trainer.train_iters={iters}"]), rd)
    if slurm:
        (rd / "submit.sbatch").write_text("#!/bin/bash\n")
    records = [
        {"step": s, "time": 100.0 + s, "loss": 5.0 - s / 10, "step_time_s": 1.0, "tflops_per_gpu": 2.0, "mfu": 0.5}
        for s in range(1, steps + 1)
    ]
    (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return rd


def launched(rd: Path, *ends: tuple[str, int]) -> Path:
    """One launch attempt: a start, then each ``(event, code)`` end record."""
    events.append(rd, "start", when=100.0, world_size=1)
    for kind, code in ends:
        events.append(rd, kind, when=120.0, code=code)
    return rd


def test_the_launchers_verdict_wins_over_rank_0s_exit(tmp_path):
    rd = launched(run_dir(tmp_path, steps=4), ("exit", exitcodes.RETRY), ("end", exitcodes.FAULT))
    info = runs.read_run(rd, {})
    assert (info.state, info.exit_code) == ("fault", exitcodes.FAULT)
    assert info.resume_command == f"kilocard run --resume {rd}"
    assert info.eta_s == 6 * 1.0 and info.wall_s == 20.0 and info.step == 4


@pytest.mark.parametrize(
    "code, state",
    [(0, "done"), (75, "retry"), (76, "fault"), (77, "fault"), (137, "fault"), (1, "failed"), (3, "failed")],
)
def test_each_exit_code_is_a_state(tmp_path, code, state):
    info = runs.read_run(launched(run_dir(tmp_path, steps=2), ("exit", code)), {})
    assert info.state == state
    assert (info.resume_command is None) == (state == "done")


def test_a_busy_exit_is_not_the_runs_and_a_launch_without_any_exit_record_is_a_fault(tmp_path):
    rd = launched(run_dir(tmp_path, steps=2), ("exit", exitcodes.RETRY), ("exit", exitcodes.BUSY))
    assert runs.read_run(rd, {}).state == "retry"
    killed = launched(run_dir(tmp_path, "killed", steps=2))
    info = runs.read_run(killed, {})
    assert info.state == "fault" and "killed" in info.detail


def test_a_run_never_started_is_new(tmp_path):
    info = runs.read_run(run_dir(tmp_path), {})
    assert (info.state, info.step, info.committed_step, info.loss, info.eta_s) == ("new", None, None, None, None)
    assert info.resume_command == f"kilocard run --resume {tmp_path / 'r'}"


def test_a_live_local_holder_is_running_and_continues_by_itself(tmp_path):
    rd = launched(run_dir(tmp_path, steps=3))
    (rd / LOCK_FILE).write_text(json.dumps({"host": platform.node(), "pid": os.getpid()}))
    info = runs.read_run(rd, {}, now=200.0)
    assert info.state == "running" and info.resume_command is None and info.wall_s == 100.0


def test_slurm_markers_and_the_command_that_resubmits(tmp_path):
    done = launched(run_dir(tmp_path, "done", slurm=True, steps=10), ("exit", 0))
    (done / "DONE").write_text("2026-12-07T10:00:00Z\n")
    assert runs.read_run(done, {}).state == "done"
    failed = launched(run_dir(tmp_path, "failed", slurm=True, steps=2), ("exit", exitcodes.CRASH))
    (failed / "FAILED").write_text("job 7 exit code 1 at 2026-12-07T10:00:00Z\n")
    info = runs.read_run(failed, {})
    assert info.state == "failed" and "job 7 exit code 1" in info.detail
    assert info.resume_command == f"rm {failed / 'FAILED'} && sbatch {failed / 'submit.sbatch'}"
    retry = launched(run_dir(tmp_path, "retry", slurm=True, steps=2), ("exit", exitcodes.RETRY))
    assert runs.read_run(retry, {}).resume_command == f"sbatch {retry / 'submit.sbatch'}"


QUEUE = "7|RUNNING|None\n8|PENDING|Dependency\n9|PENDING|Resources\n10|PENDING|Priority\n junk line\n"
"""``squeue --noheader --format=%i|%T|%r`` as Slurm prints it."""


def test_the_slurm_queue_says_running_chained_or_queued(tmp_path):
    queue = parse_queue(QUEUE)
    assert queue == {
        7: ("RUNNING", "None"),
        8: ("PENDING", "Dependency"),
        9: ("PENDING", "Resources"),
        10: ("PENDING", "Priority"),
    }
    cases = {(7, 8): "running", (8,): "chained", (9,): "queued", (11,): "new"}
    for i, (ids, state) in enumerate(cases.items()):
        rd = run_dir(tmp_path, f"r{i}", slurm=True)
        (rd / "jobs.json").write_text(json.dumps({"submissions": [], "job_ids": list(ids)}))
        info = runs.read_run(rd, queue)
        assert info.state == state, (ids, info)
        assert info.job_ids == list(ids) and (info.resume_command is None) == (state != "new")


def test_a_slurm_holder_elsewhere_without_squeue_is_unknown(tmp_path):
    rd = launched(run_dir(tmp_path, slurm=True, steps=2))
    (rd / LOCK_FILE).write_text(json.dumps({"host": "node-that-is-not-here", "pid": 1, "slurm_job_id": "41"}))
    info = runs.read_run(rd, None)
    assert info.state == "unknown" and "41" in info.detail and info.job_ids == [41]
    assert runs.read_run(rd, {}).state == "fault"  # Slurm answered: job 41 is gone, and it left no exit record


def test_a_broken_run_is_one_line_and_the_others_are_listed(tmp_path, capsys):
    launched(run_dir(tmp_path, "good", steps=2), ("exit", 0))
    bad_jobs = run_dir(tmp_path, "bad-jobs", slurm=True)
    (bad_jobs / "jobs.json").write_text(json.dumps({"job_ids": ["x"]}))
    torn = launched(run_dir(tmp_path, "bad-events"))
    (torn / "events.jsonl").write_text("not json\n")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / ".good.tmp-1").mkdir()  # a run directory being written: not listed, not a problem
    assert main(["runs", str(tmp_path), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [r["run_dir"] for r in json.loads(out)] == [str(tmp_path / "good")]
    lines = err.splitlines()
    assert len(lines) == 3 and all(l.startswith(f"kilocard runs: skipped {tmp_path}/") for l in lines)
    assert {"bad-jobs", "bad-events", "not-a-run"} == {l.split(": ")[1].split()[1].split("/")[-1] for l in lines}


def test_one_run_in_full_and_usage_errors(tmp_path, capsys):
    rd = launched(run_dir(tmp_path, steps=2), ("end", exitcodes.RETRY))
    assert main(["runs", str(rd)]) == 0
    out = capsys.readouterr().out
    assert "retry (exit 75 RETRY" in out and f"kilocard run --resume {rd}" in out
    assert main(["runs", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("kilocard runs: error: ")
    (rd / "events.jsonl").write_text("\x00\x00\n")
    assert main(["runs", str(rd)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "NUL bytes" in err
    assert main(["runs", str(tmp_path / "empty")] if (tmp_path / "empty").mkdir() is None else []) == 0
    assert capsys.readouterr().out == f"no runs under {tmp_path / 'empty'}\n"


def test_the_committed_step_is_the_newest_one_whose_manifest_is_there(tmp_path, capsys):
    """A tracker naming a step that lost its manifest (or its folder) is not shown as committed: the run lists the
    newest intact step, the one a resume with ``checkpoint.fallback_to_previous`` would take, and says which step
    the tracker names (JSON ``tracker_step``)."""
    rd = launched(run_dir(tmp_path, steps=10), ("exit", exitcodes.RETRY))
    root = rd / "checkpoints"
    for step in (5, 10):
        (root / f"step_{step:07d}").mkdir(parents=True)
        (root / f"step_{step:07d}" / "manifest.json").write_text("{}")
    (root / "latest_committed.txt").write_text("10\n")
    info = runs.read_run(rd, {})
    assert (info.committed_step, info.tracker_step) == (10, None)
    (root / "step_0000010" / "manifest.json").unlink()
    info = runs.read_run(rd, {})
    assert (info.committed_step, info.tracker_step) == (5, 10)
    assert main(["runs", str(rd)]) == 0
    out = capsys.readouterr().out
    assert "committed step" in out and "5 (the tracker names step 10, whose manifest is missing)" in out
    (root / "step_0000005" / "manifest.json").unlink()
    assert (runs.read_run(rd, {}).committed_step, runs.read_run(rd, {}).tracker_step) == (None, 10)
