"""What a dead or hung rank costs on local CPU ranks: in-job restart (ft_launcher) against the old way.

Each try starts ``kilocard run`` (tiny_gpt, two gloo CPU ranks, a committed step every ``--every`` steps),
waits until a step is committed (and, in-job, the heartbeat timeouts are calibrated), then SIGKILLs
(``kill``) or SIGSTOPs (``hang``) rank 1 by PID and measures with its own clock:

- ``detect``: seconds from the fault until the other rank of that attempt has ended (it noticed, or was
  stopped by the launcher);
- ``resume``: seconds from the fault to the first step trained after it (its record in metrics.jsonl,
  polled every 20 ms);
- ``recomputed``: steps recorded after the resumed commit before the fault, trained again.

Modes: ``in-job`` (``launcher.max_restarts=2``: the same launch restarts both ranks) and ``requeue``
(``max_restarts=0``: the run ends FAULT, then ``kilocard run --resume`` at once, standing in for a
Slurm requeue with no queue wait). Every run uses ``trainer.hang_timeout_s=--hang-timeout`` (the own
watchdog's timeout, which finds the hang in the requeue mode). Prints a table of medians over ``--tries``.

usage: python scripts/bench_faults.py [--tries 3] [--faults kill,hang] [--modes in-job,requeue] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SIGNALS = {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}
"""The faults: a dead rank, a hung rank."""
MODES = {"in-job": ["launcher.max_restarts=2"], "requeue": ["launcher.max_restarts=0"]}
"""How a fault is recovered: the overrides of each mode."""
LAUNCHERS = ("torch.distributed.run", "fault_tolerance.launcher")
"""Modules of the launchers whose command lines also name ``kilocard.train``."""
LIMIT_S = 600.0
"""The longest one try may take."""


@dataclass
class Result:
    """One try's figures (seconds, steps)."""

    detect_s: float
    resume_s: float
    recomputed: int


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def _events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def _ranks(launcher_pid: int) -> dict[int, psutil.Process]:
    """The rank processes under a ``kilocard run``, by rank."""
    out = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            rank = child.environ().get("RANK")
            if "kilocard.train" in cmd and rank is not None and not any(m in cmd for m in LAUNCHERS):
                out[int(rank)] = child
        except psutil.Error:
            continue
    return out


def _kilocard(workdir: Path, log: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(workdir / "tmp")}
    (workdir / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "kilocard.cli", "run", *args],
        cwd=workdir,
        env=env,
        stdout=open(log, "w"),  # noqa: SIM115  (the child holds it)
        stderr=subprocess.STDOUT,
    )


def _wait_for(what: str, check, proc: subprocess.Popen, deadline: float, poll_s: float = 0.02):
    """Poll ``check()`` until it returns something truthy; fail if ``proc`` ends first or time runs out."""
    while True:
        got = check()
        if got:
            return got
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not seen (kilocard run exit {proc.poll()})")
        time.sleep(poll_s)


def _run_dir(log: Path, workdir: Path) -> Path | None:
    for line in log.read_text().splitlines():
        if line.startswith("run dir: "):
            return workdir / line[len("run dir: ") :].strip()
    return None


def one_try(workdir: Path, fault: str, mode: str, base: list[str], every: int) -> Result:
    """Run, inject ``fault`` into rank 1, recover by ``mode``; the try's figures."""
    workdir.mkdir(parents=True)
    deadline = time.monotonic() + LIMIT_S
    proc = _kilocard(workdir, workdir / "first.log", *base, *MODES[mode])
    run_dir = _wait_for("run dir", lambda: _run_dir(workdir / "first.log", workdir), proc, deadline)

    def ready() -> bool:
        steps = [r["step"] for r in _records(run_dir)]
        calibrated = mode != "in-job" or (run_dir / "heartbeat.json").exists()
        return calibrated and bool(steps) and max(steps) > every + 1

    _wait_for("a committed step", ready, proc, deadline)
    ranks = _wait_for("both ranks", lambda: (r := _ranks(proc.pid)) and len(r) == 2 and r, proc, deadline)
    t_fault = time.time()
    ranks[1].send_signal(SIGNALS[fault])
    try:
        psutil.wait_procs([ranks[0]], timeout=max(1.0, deadline - time.monotonic()))
        detect = time.time() - t_fault
        if mode == "requeue":
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            proc = _kilocard(workdir, workdir / "resume.log", "--resume", str(run_dir))

        def resumed() -> tuple[int, int] | None:
            after = [e for e in _events(run_dir) if e["event"] == "resume" and e["time"] > t_fault]
            if not after:
                return None
            step = after[0]["step"]
            if any(r["step"] == step + 1 and r["time"] > t_fault for r in _records(run_dir)):
                return step, (after[0].get("superseded_step") or step) - step
            return None

        _, recomputed = _wait_for("the first step after the fault", resumed, proc, deadline)
        resume = time.time() - t_fault
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        if code != 0:
            raise RuntimeError(f"the recovered run ended with exit {code} (see {workdir})")
    finally:  # after an error: no stopped rank or launcher left behind
        for p in ranks.values():
            if p.is_running():
                p.kill()
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    return Result(detect, resume, recomputed)


def _table(results: dict[tuple[str, str], list[Result]]) -> str:
    rows = [
        "| fault | recovery | seconds to detect | seconds from fault to first resumed step "
        "| steps recomputed | tries |",
        "|---|---|---|---|---|---|",
    ]
    for (fault, mode), rs in results.items():
        rows.append(
            f"| {fault} | {mode} | {statistics.median(r.detect_s for r in rs):.1f} "
            f"| {statistics.median(r.resume_s for r in rs):.1f} "
            f"| {statistics.median(r.recomputed for r in rs):g} | {len(rs)} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tries", type=int, default=3)
    p.add_argument("--faults", default="kill,hang")
    p.add_argument("--modes", default="in-job,requeue")
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--every", type=int, default=4, help="checkpoint.save_interval")
    p.add_argument("--hang-timeout", type=float, default=30.0, help="trainer.hang_timeout_s")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    base = [
        "--nproc",
        "2",
        "recipe=tiny_gpt",
        f"trainer.train_iters={a.iters}",
        f"checkpoint.save_interval={a.every}",
        f"trainer.hang_timeout_s={a.hang_timeout:g}",
        "trainer.tensorboard=false",
    ]
    root = Path(a.workdir or tempfile.mkdtemp(prefix="bench-faults-"))
    results: dict[tuple[str, str], list[Result]] = {}
    for fault in a.faults.split(","):
        for mode in a.modes.split(","):
            for n in range(a.tries):
                r = one_try(root / f"{fault}-{mode}-{n}", fault, mode, base, a.every)
                results.setdefault((fault, mode), []).append(r)
                print(
                    f"{fault} {mode} try {n}: detect {r.detect_s:.2f}s, resume {r.resume_s:.2f}s, "
                    f"{r.recomputed} steps recomputed",
                    flush=True,
                )
    load = os.getloadavg()
    print(
        f"\ntiny_gpt, 2 gloo CPU ranks, {a.iters} steps, a committed step every {a.every}, "
        f"trainer.hang_timeout_s={a.hang_timeout:g}; {os.cpu_count()} CPUs, load average {load[0]:.1f}; "
        f"medians of {a.tries} tries; runs under {root}\n"
    )
    print(_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
