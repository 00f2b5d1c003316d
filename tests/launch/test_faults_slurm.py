"""A node dies in the middle of a 2-node job on the local Slurm cluster (scripts/slurm-up.sh).

The node's slurmd, its slurmstepd and its rank are SIGKILLed while the run trains (a crashed
host). The controller would notice the silent slurmd after SlurmdTimeout (60 s here); the test
marks the node DOWN at once instead, as a site's health check does, so the test need not wait.
Slurm then fails the allocation (NODE_FAIL) and, the script having ``#SBATCH --requeue``,
requeues the job onto healthy nodes; the rerun resumes from the last committed step and the run
completes with every step's loss equal to an uninterrupted run's. The node is restarted and
returned to service afterwards.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from kilocard.cli import main

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
ITERS = 30
DEFAULT_CONF = "/etc/slurm/slurm.conf"
"""The cluster's configuration when ``SLURM_CONF`` is unset (scripts/slurm-up.sh exports it to its daemons)."""


def submit(root: Path, *overrides: str) -> dict[str, object]:
    """`kilocard sbatch --submit` of tiny_gpt on 2 nodes x 1 rank; returns run dir and job id."""
    args = [
        "sbatch",
        "recipe=tiny_gpt",
        "cluster=local_cpu",
        "cluster.nodes=2",
        "cluster.gpus_per_node=1",
        "cluster.cpus_per_node=1",
        "cluster.partition=local",
        f"cluster.venv={sys.prefix}",
        f"cluster.shared_fs={root}",
        "trainer.tensorboard=false",
        "launcher.time=00:10:00",
        "launcher.signal_lead_s=45",
        f"trainer.train_iters={ITERS}",
        "checkpoint.save_interval=3",
        "trainer.hang_timeout_s=60",
        *overrides,
        "--submit",
    ]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    assert rc == 0, err.getvalue()
    lines = dict(line.split(": ", 1) for line in out.getvalue().strip().splitlines())
    return {"run_dir": Path(lines["run dir"]), "id": int(lines["job id"])}


def scontrol(*args: str) -> str:
    return subprocess.run(["timeout", "10", "scontrol", *args], capture_output=True, text=True).stdout


def job(job_id: int) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", scontrol("show", "job", str(job_id))))


def wait_until(predicate, timeout_s: float, what: str, state=lambda: ""):
    """``predicate``'s first true value within ``timeout_s``; on timeout fail with ``state()`` (what went on)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{state()}")


def job_and_log(run: dict) -> str:
    """The job's Slurm state and the end of the run's log: why a wait timed out."""
    info = job(run["id"])
    keys = ("JobState", "Reason", "Restarts", "NodeList", "ExcNodeList")
    return " ".join(f"{k}={info.get(k)}" for k in keys) + "\n" + logs(run["run_dir"])[-6000:]


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("slurm-*.out")))


def crash_node(node: str) -> list[int]:
    """SIGKILL the node's slurmd, and every process running for it (slurmstepd, the rank), of this test
    run's cluster only (its ``SLURM_CONF``): another local cluster's node of the same name is left alone."""
    victims = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if not re.search(rf"\bslurmd\b.*-N {node}\b", cmd) and "kilocard.train" not in cmd:
                continue
            env = p.environ()
            if env.get("SLURM_CONF", DEFAULT_CONF) != os.environ.get("SLURM_CONF", DEFAULT_CONF):
                continue
            if "kilocard.train" not in cmd:
                victims.append(p)
            elif env.get("SLURMD_NODENAME") == node:
                victims.append(p)
                parent = p.parent()
                if parent is not None and "slurmstepd" in " ".join(parent.cmdline()):
                    victims.append(parent)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    return [p.pid for p in victims]


def test_node_crash_mid_run_requeues_and_completes(local_slurm, tmp_path):
    ref = submit(tmp_path, "launcher.job_name=nodefail-ref", "launcher.requeue=false")
    run = submit(tmp_path, "launcher.job_name=nodefail")
    started = "the run to pass its first committed step"
    wait_until(lambda: len(metrics(run["run_dir"])) >= 5, 240, started, lambda: job_and_log(run))
    info = job(run["id"])
    nodes = scontrol("show", "hostnames", info["NodeList"]).split()
    victim = next(n for n in nodes if n != info["BatchHost"])
    try:
        assert len(crash_node(victim)) >= 2, f"nothing of node {victim} found to kill"
        scontrol("update", f"nodename={victim}", "state=down", "reason=fault-injection")
        final = wait_until(
            lambda: (
                (j := job(run["id"])).get("JobState") in TERMINAL
                and j.get("JobState") != "NODE_FAIL"
                and (run["run_dir"] / "DONE").exists()
                and j
            ),
            420,
            "the requeued job to complete",
            lambda: job_and_log(run),
        )
    finally:
        subprocess.run(["slurmd", "-N", victim], capture_output=True, timeout=30)
        scontrol("update", f"nodename={victim}", "state=resume")
    text = logs(run["run_dir"])
    assert final["JobState"] == "COMPLETED", text[-4000:]
    assert int(final["Restarts"]) >= 1, text[-4000:]
    assert re.search(r"resumed from \S+ \(step (\d+)", text), text[-4000:]
    ref_info = wait_until(lambda: (j := job(ref["id"])).get("JobState") in TERMINAL and j, 300, "the reference run")
    assert ref_info["JobState"] == "COMPLETED", logs(ref["run_dir"])[-3000:]
    got = {m["step"]: m["loss"] for m in metrics(run["run_dir"])}
    assert sorted(got) == list(range(1, ITERS + 1))
    assert got == {m["step"]: m["loss"] for m in metrics(ref["run_dir"])}
