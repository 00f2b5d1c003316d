"""In-job restarts on local ranks: ``kilocard run ... launcher.max_restarts=2`` under NVRx's real ``ft_launcher``.

Two gloo CPU ranks of tiny_gpt, a committed step every EVERY steps. Rank 1 is SIGKILLed (a dead rank)
or SIGSTOPped (a hung rank) mid-run by PID; the same launch restarts both ranks from the newest
committed step and ends DONE, with the loss of every step equal to the uninterrupted run's (deterministic
mode: bit-equal). The test measures with its own clock the seconds from the fault to the first step
trained after it, and checks ``kilocard goodput`` against that.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from conftest import KilocardRun
from faults import EVERY, losses, rank_process, records, run_dir_of, tracker, train_log
from kilocard import exitcodes
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events
from kilocard.train.heartbeat import HEARTBEAT_FILE

pytestmark = pytest.mark.slow

ITERS = 60
"""Steps of every run here: long enough (several seconds) for a fault after the heartbeats are calibrated."""
BASE = [
    "--nproc",
    "2",
    "recipe=tiny_gpt",
    f"trainer.train_iters={ITERS}",
    f"checkpoint.save_interval={EVERY}",
    "trainer.tensorboard=false",
]
"""The uninterrupted run; the faulted runs add ``launcher.max_restarts``."""
INJOB = [*BASE, "launcher.max_restarts=2", f"checkpoint.keep_last={ITERS // EVERY}"]
"""In-job restarts; every committed step kept (the test reads the resumed step's commit time at the end)."""
RESUME_WITHIN_S = 60
"""A dead or hung rank: the first step after the fault within this many seconds (issue 14)."""
TOLERANCE = 0.10
"""``kilocard goodput``'s lost time may differ from the measured one by this fraction."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (torchrun, no restarts): [(step, loss)]."""
    code, out, run_dir = KilocardRun(tmp_path_factory.mktemp("reference"))(*BASE, timeout=300)
    assert code == exitcodes.DONE, out[-3000:]
    curve = losses(run_dir)
    assert [s for s, _ in curve] == list(range(1, ITERS + 1))
    return curve


@dataclass
class Trial:
    """One faulted ``kilocard run`` as this test saw it."""

    code: int = -1
    output: list[str] = field(default_factory=list)
    run_dir: Path | None = None
    fault_at: float = 0.0
    """Unix time of the fault."""
    resumed: int = 0
    """The committed step the restarted attempt resumed from."""
    first_seen: float = 0.0
    """Unix time at which this test first saw the record of step ``resumed + 1`` written after the fault."""


def _first_resumed_step(run_dir: Path, since: float) -> tuple[int, float] | None:
    """(resumed step, now) once the attempt after ``since`` has recorded its first step, else ``None``."""
    resumes = [e for e in events.read(run_dir) if e["event"] == "resume" and e["time"] > since]
    if not resumes:
        return None
    step = resumes[0]["step"]
    if any(r["step"] == step + 1 and r["time"] > since for r in records(run_dir)):
        return step, time.time()
    return None


def _faulted_run(
    workdir: Path, args: list[str], ready: Callable[[Path, int], bool], fault: Callable[[psutil.Process], None]
) -> Trial:
    """``kilocard run ARGS``; once ``ready(run_dir, newest step)``, ``fault(rank 1)``; then watch (every 20 ms)
    for the first step trained after the fault and wait for the end."""
    proc = KilocardRun(workdir).start(*args)
    trial = Trial()
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: trial.output.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    deadline = time.monotonic() + 300
    try:
        while trial.run_dir is None or not ready(trial.run_dir, max([0, *(r["step"] for r in records(trial.run_dir))])):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(trial.output)[-3000:]
            trial.run_dir = trial.run_dir or next(filter(None, (run_dir_of(l, workdir) for l in trial.output)), None)
            time.sleep(0.02)
        victim = rank_process(proc.pid, 1)
        trial.fault_at = time.time()
        fault(victim)
        while (seen := _first_resumed_step(trial.run_dir, trial.fault_at)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(trial.output)[-3000:]
            time.sleep(0.02)
        trial.resumed, trial.first_seen = seen
        trial.code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=300)
    reader.join(timeout=10)
    return trial


def test_killed_rank_restarts_in_job_exactly_and_goodput_reports_the_cost(reference, tmp_path):
    """SIGKILL of rank 1 after a committed step: the same launch ends DONE (0); the restarted attempt
    resumed from a committed step; the loss curve equals the uninterrupted run's; the first step after
    the kill came within RESUME_WITHIN_S; ``kilocard goodput`` reports that fault with seconds to resume
    and seconds lost within 10% of what this test measured."""
    calibrated = lambda d, step: (d / HEARTBEAT_FILE).exists() and step > EVERY + 1  # noqa: E731
    trial = _faulted_run(tmp_path, INJOB, calibrated, lambda p: p.kill())
    out = "".join(trial.output)
    assert trial.code == exitcodes.DONE, out[-3000:]
    run_dir = trial.run_dir
    assert run_dir is not None
    measured_resume = trial.first_seen - trial.fault_at
    assert measured_resume < RESUME_WITHIN_S, f"first step {measured_resume:.1f}s after the kill"
    assert losses(run_dir) == reference
    starts = [e for e in events.read(run_dir) if e["event"] == "start"]
    assert [e["restart"] for e in starts] == [0, 1], starts
    assert 0 < trial.resumed < ITERS and (trial.resumed % EVERY == 0)
    assert f"{ck.step_dir(Path('checkpoints'), trial.resumed)} (step {trial.resumed}," in train_log(run_dir)
    assert "heartbeat timeouts kept from an earlier attempt: initial" in train_log(run_dir), "restarted uncalibrated"

    cli = [sys.executable, "-m", "kilocard.cli", "goodput", str(run_dir), "--format", "json"]
    got = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)
    [fault] = got["faults"]
    assert fault["kind"] == "rank_lost", fault
    assert fault["steps_recomputed"] == fault["step"] - trial.resumed
    commit_time = (ck.step_dir(run_dir / "checkpoints", trial.resumed) / ck.MANIFEST).stat().st_mtime
    measured_lost = trial.first_seen - commit_time
    print(f"kill -> first resumed step: measured {measured_resume:.2f}s, reported {fault}")
    # the test sees a step's record once the next step has computed: a step (and a 20 ms poll) late
    assert abs(fault["seconds_to_resume"] - measured_resume) <= TOLERANCE * measured_resume, (fault, measured_resume)
    assert abs(fault["seconds_lost"] - measured_lost) <= TOLERANCE * measured_lost, (fault, measured_lost)


def test_hung_rank_is_found_by_calibrated_heartbeats_and_restarted(reference, tmp_path):
    """SIGSTOP of rank 1 once the heartbeat timeouts are calibrated (``heartbeat.json``, after the first
    save): its rank monitor finds no heartbeat within the calibrated timeout (seconds, not the
    120 s start-up allowance of trainer.hang_timeout_s, which also arms each rank's own watchdog), kills
    it, ft_launcher restarts both ranks and the run ends DONE with the uninterrupted loss curve."""
    hang_s = 120
    stopped: list[psutil.Process] = []

    def freeze(p: psutil.Process) -> None:
        p.suspend()
        stopped.append(p)

    calibrated = lambda d, step: (d / HEARTBEAT_FILE).exists() and step > EVERY + 2  # noqa: E731
    try:
        trial = _faulted_run(tmp_path, [*INJOB, f"trainer.hang_timeout_s={hang_s}"], calibrated, freeze)
    finally:
        for p in stopped:
            if p.is_running():
                p.kill()
    out = "".join(trial.output)
    assert trial.code == exitcodes.DONE, out[-3000:]
    assert trial.run_dir is not None
    timeouts = json.loads((trial.run_dir / HEARTBEAT_FILE).read_text())["current_timeouts"]["heartbeat"]
    assert timeouts["were_calculated"] and timeouts["subsequent"] < RESUME_WITHIN_S / 2, timeouts
    took = trial.first_seen - trial.fault_at
    print(f"SIGSTOP -> first resumed step {took:.2f}s; calibrated timeouts {timeouts}")
    assert took < RESUME_WITHIN_S < hang_s, f"first step {took:.1f}s after the hang"
    assert "no progress for" not in train_log(trial.run_dir), "the own watchdog, not the heartbeats, found the hang"
    assert losses(trial.run_dir) == reference


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_term_to_kilocard_run_under_ft_launcher_saves_commits_and_leaves_no_process(tmp_path):
    """TERM to ``kilocard run`` with in-job restarts on: ft_launcher passes it to the ranks (its
    ``--term-timeout`` is the launcher's stop wait), they save the same step and exit RETRY (75), which
    ``kilocard run`` returns; no restart is attempted, and no rank or launcher process is left."""
    proc = KilocardRun(tmp_path).start(
        "--nproc",
        "2",
        "recipe=tiny_gpt",
        "trainer.train_iters=400",
        "trainer.tensorboard=false",
        "launcher.max_restarts=2",
    )
    assert proc.stdout is not None
    lines, family = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            step = line.split()[1].split("/")[0] if line.startswith("step ") else None
            if step is not None and int(step) >= 3:
                family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                proc.send_signal(signal.SIGTERM)
                break
        out = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        left = [p for p in family if _alive(p)]
        for p in left:
            p.kill()
    run_dir = KilocardRun(tmp_path).run_dir_of(out)
    assert proc.returncode == exitcodes.RETRY, out[-3000:]
    assert not left, f"processes outlived kilocard run: {[p.cmdline() for p in left]}"
    assert tracker(run_dir) is not None and tracker(run_dir) >= 3
    assert [e["event"] for e in events.read(run_dir)].count("start") == 1
