"""Watching a real 2-rank ``kilocard run``: rank 0's step lines reach train.log and ``kilocard logs -f`` while
the ranks train, every line carries its rank, ``logs --rank 1`` shows rank 1's lines only, and ``--resume`` of
the finished run starts no rank."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kilocard import exitcodes
from kilocard.rundir import events
from kilocard.rundir.names import STEP_DELAY_ENV
from kilocard.rundir.progress import STEP_LINE

pytestmark = pytest.mark.slow

STEPS = 12


def _logs(run, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kilocard.cli", "logs", *args],
        cwd=run.workdir,
        env=run.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_run_dir(run, proc: subprocess.Popen):
    """The run directory from the launcher's first line (``run dir: ...``)."""
    first = proc.stdout.readline()
    assert first.startswith("run dir: "), first + proc.stdout.read()
    return run.run_dir_of(first)


def test_step_lines_reach_train_log_and_logs_follow_while_the_ranks_train(kilocard_run):
    launcher = kilocard_run.start(
        "recipe=tiny_gpt", "--nproc", "2", f"trainer.train_iters={STEPS}", "trainer.log_interval=2",
        **{STEP_DELAY_ENV: "0.4"},
    )  # fmt: skip
    run_dir = _wait_for_run_dir(kilocard_run, launcher)
    while not (run_dir / "logs" / "train.log").exists():
        time.sleep(0.1)
    follow = _logs(kilocard_run, str(run_dir), "-f")
    seen_while_running = None
    for line in follow.stdout:
        if line.startswith("[rank0]: step ") and "/12 | loss " in line:
            seen_while_running = (line, launcher.poll() is None)
            break
    followed = follow.stdout.read()  # --follow ends by itself when the launcher lets go of the run directory
    assert follow.wait(timeout=120) == 0
    out = launcher.stdout.read()
    assert launcher.wait(timeout=300) == exitcodes.DONE, out[-3000:]
    assert seen_while_running is not None and seen_while_running[1], (seen_while_running, followed[-3000:])
    assert "TFLOP/s/gpu" in seen_while_running[0] and "grad norm" in seen_while_running[0]

    log = (run_dir / "logs" / "train.log").read_text().splitlines()
    steps = [line for line in log if line.startswith("[rank0]: step ") and " | loss " in line]
    assert [s.split()[2] for s in steps] == [f"{n}/{STEPS}" for n in (2, 4, 6, 8, 10, 12)]  # trainer.log_interval=2
    assert all("TFLOP/s/gpu" in s and "MFU" in s and "ETA" in s for s in steps)
    terminal = [line for line in out.splitlines() if STEP_LINE.match(line)]
    assert terminal == [s.removeprefix("[rank0]: ") for s in steps]  # one stream: the terminal shows rank 0's lines
    ranks = [line for line in log if not line.startswith("W") and not line.startswith("I")]  # torchrun's own notes
    assert all(line.startswith(("[rank0]: ", "[rank1]: ")) for line in ranks), [
        line for line in ranks if not line.startswith("[rank")
    ][:5]

    one = _logs(kilocard_run, str(run_dir), "--rank", "1")
    mine = one.communicate(timeout=120)[0].splitlines()
    assert one.returncode == 0 and mine and all(line.startswith("[rank1]: ") for line in mine), mine
    assert any("kilocard.train: rank 1 of 2 up on" in line for line in mine)
    assert len(mine) == sum(line.startswith("[rank1]: ") for line in log)

    starts = sum(e["event"] == "start" for e in events.read(run_dir))
    before = (run_dir / "logs" / "train.log").read_bytes()
    code, again, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE and f"is complete: step {STEPS} is committed" in again, again
    assert sum(e["event"] == "start" for e in events.read(run_dir)) == starts  # no rank started
    assert (run_dir / "logs" / "train.log").read_bytes() == before
