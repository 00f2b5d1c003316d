"""Helpers of the fault-injection tests (tests/*/test_faults_*.py): find a rank, watch a run, read its files."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

ITERS, EVERY = 24, 4
"""Steps of the run every fault test interrupts, and steps between its committed saves."""
TINY = [
    "--nproc",
    "2",
    "recipe=tiny_gpt",
    f"trainer.train_iters={ITERS}",
    f"checkpoint.save_interval={EVERY}",
    "trainer.tensorboard=false",
]
"""Two gloo CPU ranks (DP2), ITERS steps, a committed step every EVERY: long enough (a few seconds) for
a fault to land mid-run even when the launcher's progress lines come only every 0.5 s."""


def records(run_dir: Path) -> list[dict]:
    """metrics.jsonl as a list of dicts."""
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def losses(run_dir: Path) -> list[tuple[int, float]]:
    """(step, loss) of every record."""
    return [(r["step"], r["loss"]) for r in records(run_dir)]


def tracker(run_dir: Path) -> int | None:
    """The newest committed step, or None."""
    t = run_dir / "checkpoints" / "latest_committed.txt"
    return int(t.read_text()) if t.exists() else None


LAUNCHERS = ("torch.distributed.run", "fault_tolerance.launcher", "kilocard.launch.ftlaunch")
"""Modules of the launchers whose command lines also name ``kilocard.train`` (torchrun, NVRx ft_launcher)."""


def rank_process(launcher_pid: int, rank: int, timeout: float = 120) -> psutil.Process:
    """The ``python -m kilocard.train`` process of ``rank`` under the ``kilocard run`` launcher."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher_pid).children(recursive=True):
            try:
                cmd = " ".join(child.cmdline())
                if (
                    "kilocard.train" in cmd
                    and child.environ().get("RANK") == str(rank)
                    and not any(launcher in cmd for launcher in LAUNCHERS)
                ):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} process not found")


def run_dir_of(line: str, workdir: Path) -> Path | None:
    """The run directory of a ``run dir: ...`` line."""
    return workdir / line[len("run dir: ") :].strip() if line.startswith("run dir: ") else None


def step_of(line: str) -> int | None:
    """N of a ``step N/M | ...`` progress line."""
    if line.startswith("step ") and "/" in line:
        return int(line.split()[1].split("/")[0])
    return None


def run_until(
    kilocard_run,
    args: list[str],
    act: Callable[[subprocess.Popen, Path, int], bool],
    timeout: float = 300,
    after_step: int = 0,
) -> tuple[int, str, Path, float]:
    """Start ``kilocard run ARGS``; call ``act(proc, run_dir, step)`` on every progress line of a step
    after ``after_step`` (a resumed run first shows its last recorded step) until it returns True;
    then wait for the exit. Returns (code, output, run dir, seconds from the act to the exit)."""
    proc = kilocard_run.start(*args)
    lines, run_dir, acted_at = [], None, None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        run_dir = run_dir or run_dir_of(line, kilocard_run.workdir)
        step = step_of(line)
        if step is not None and step > after_step and run_dir is not None and act(proc, run_dir, step):
            acted_at = time.monotonic()
            break
    out = "".join(lines) + proc.communicate(timeout=timeout)[0]
    assert acted_at is not None, f"the run ended before the fault was injected:\n{out[-3000:]}"
    assert run_dir is not None
    return proc.returncode, out, run_dir, time.monotonic() - acted_at


def kill_rank(proc: subprocess.Popen, rank: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to one rank of a running ``kilocard run``."""
    rank_process(proc.pid, rank).send_signal(sig)


def exit_codes(run_dir: Path) -> list[int]:
    """The per-rank exit codes the ranks recorded (sorted)."""
    return sorted(int(p.read_text()) for p in (run_dir / "logs" / "exit").glob("rank_*"))


def train_log(run_dir: Path) -> str:
    """The ranks' log."""
    return (run_dir / "logs" / "train.log").read_text(errors="replace")
