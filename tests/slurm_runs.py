"""Runs on the local Slurm cluster for the in-job restart tests and ``scripts/bench_faults_slurm.py``.

tiny_gpt on 2 nodes x 2 CPU ranks (``cluster=local_cpu``; 1 rank per node where a test needs no more):
submit it with ``kilocard sbatch --submit``,
watch the job, find one of its ranks and signal it, and measure the recovery from the run's own
records (``events.jsonl``, ``metrics.jsonl``).
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
from dataclasses import dataclass
from pathlib import Path

import psutil

from kilocard.cli import main
from kilocard.rundir.names import STEP_DELAY_ENV

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
ITERS, EVERY = 60, 5
"""Steps of each run and steps between committed saves: a fault after step 10 lands mid-run."""
SLOW = {STEP_DELAY_ENV: "0.25"}
"""The environment of a run whose ranks sleep 0.25 s before each step (``KILOCARD_FAULT_STEP_DELAY_S``): its
50 steps after a fault at step 10 take over 12 s however fast the machine, without computing more steps."""


@dataclass
class Run:
    """One submitted run."""

    run_dir: Path
    """Its run directory."""
    job_id: int
    """Its Slurm job id (the first link's, for a chain)."""
    later_links: tuple[int, ...] = ()
    """The job ids of a chain's later links (``--chain``), in order."""


def sbatch_in_process(args: list[str], env: dict[str, str] | None = None) -> tuple[int, io.StringIO, io.StringIO]:
    """``kilocard ARGS`` in this process with ``env`` set in the submitting environment meanwhile (sbatch passes
    it on to the job): exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out, err


def submit(
    root: Path,
    *overrides: str,
    env: dict[str, str] | None = None,
    iters: int = ITERS,
    chain: int = 1,
    ranks: int = 2,
) -> Run:
    """``kilocard sbatch --submit --chain CHAIN`` of tiny_gpt on 2 nodes x ``ranks`` CPU ranks, ``iters`` steps;
    ``env`` is set in the submitting environment (sbatch passes it on to the job)."""
    args = [
        "sbatch",
        "recipe=tiny_gpt",
        "cluster=local_cpu",
        "cluster.nodes=2",
        f"cluster.gpus_per_node={ranks}",
        f"cluster.cpus_per_node={ranks}",
        "cluster.partition=local",
        f"cluster.venv={sys.prefix}",
        f"cluster.shared_fs={root}",
        "trainer.tensorboard=false",
        "launcher.time=00:10:00",
        "launcher.signal_lead_s=45",
        f"trainer.train_iters={iters}",
        f"checkpoint.save_interval={EVERY}",
        "trainer.hang_timeout_s=20",
        *overrides,
        "--submit",
        f"--chain={chain}",
    ]
    rc, out, err = sbatch_in_process(args, env)
    if rc != 0:
        raise AssertionError(f"kilocard sbatch exit {rc}: {err.getvalue()}")
    lines = dict(line.split(": ", 1) for line in out.getvalue().strip().splitlines() if ": " in line)
    first, *later = (int(i) for i in (lines.get("job id") or lines["job ids"]).split())
    return Run(Path(lines["run dir"]), first, tuple(later))


def scontrol(*args: str) -> str:
    """scontrol's output (bounded: a dead controller makes clients retry)."""
    return subprocess.run(["timeout", "10", "scontrol", *args], capture_output=True, text=True).stdout


def job(job_id: int) -> dict[str, str]:
    """``scontrol show job`` as a dict."""
    return dict(re.findall(r"(\w+)=(\S*)", scontrol("show", "job", str(job_id))))


def cancel(*runs: Run) -> None:
    """scancel the runs' jobs, every link of a chain (a finished job is left as it is)."""
    ids = [str(i) for r in runs for i in (r.job_id, *r.later_links)]
    subprocess.run(["timeout", "10", "scancel", *ids], capture_output=True)


def wait_until(predicate, timeout_s: float, what: str, every: float = 0.2):
    """The first truthy value of ``predicate()``, polled every ``every`` s for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def finished(run: Run, timeout_s: float = 300) -> dict[str, str]:
    """The job's record once it is in a terminal state."""
    return wait_until(
        lambda: (j := job(run.job_id)).get("JobState") in TERMINAL and j, timeout_s, f"job {run.job_id}", every=1
    )


def jsonl(path: Path) -> list[dict]:
    """Every whole line of a JSON-lines file ([] when missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().split("\n")[:-1] if line.strip()]


def metrics(run: Run) -> list[dict]:
    """metrics.jsonl."""
    return jsonl(run.run_dir / "metrics.jsonl")


def losses(run: Run) -> dict[int, float]:
    """step -> loss."""
    return {m["step"]: m["loss"] for m in metrics(run)}


def logs(run: Run) -> str:
    """The job's Slurm output (every requeue appends to it)."""
    return "".join(p.read_text(errors="replace") for p in sorted((run.run_dir / "logs").glob("slurm-*.out")))


STORY = re.compile(
    r"start: restart|node health|failed \(exitcode|resumed from|exit code|excluding|done at step|exiting [A-Z_]+ \(|"
    r"error:|TERM|requeue"
)
"""The lines of a job's output that tell what happened to its attempts (a failed test's message)."""


def story(run: Run) -> str:
    """The job's output cut to ``STORY``'s lines: every attempt's start, health verdict, failures and end."""
    return "\n".join(line[:300] for line in logs(run).splitlines() if STORY.search(line))


def trainer(run: Run, p: psutil.Process | None) -> bool:
    """Whether ``p`` runs this run's trainer (under srun or ft_launcher; not the launcher itself)."""
    cmd = " ".join(p.cmdline()) if p is not None else ""
    return "kilocard.train" in cmd and str(run.run_dir) in cmd and "fault_tolerance" not in cmd


def rank_processes(run: Run) -> list[psutil.Process]:
    """This run's rank processes, not the processes a rank forked (Megatron-Core's checkpoint writers
    share its command line and environment)."""
    found = []
    for p in psutil.process_iter():
        try:
            if trainer(run, p) and not trainer(run, p.parent()):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def rank_on_node(run: Run, node: str, since: float) -> psutil.Process | None:
    """A rank process of this run on ``node`` started after unix time ``since``, or None."""
    for p in rank_processes(run):
        try:
            if p.create_time() > since and p.environ().get("SLURMD_NODENAME") == node:
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def rank_process(run: Run, rank: int, timeout_s: float = 120) -> psutil.Process:
    """The rank process of ``rank`` of this run."""

    def find():
        for p in rank_processes(run):
            try:
                env = p.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if (env.get("RANK") or env.get("SLURM_PROCID")) == str(rank):
                return p
        return None

    return wait_until(find, timeout_s, f"rank {rank} of {run.run_dir.name}")


def inject(run: Run, rank: int, kind: str, after_step: int = 10) -> float:
    """Once the run has recorded ``after_step``, SIGKILL (``kill``) or SIGSTOP (``stop``) ``rank``;
    return the unix time of the signal."""
    wait_until(lambda: len(metrics(run)) >= after_step, 300, f"step {after_step} of {run.run_dir.name}")
    proc = rank_process(run, rank)
    proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    return time.time()


def recovery(run: Run, fault_time: float) -> dict[str, float | int | None]:
    """From the run's records: the step it resumed from after the fault, the steps computed again, and
    the seconds from the fault to the first step computed after it."""
    resume = next(
        (e for e in jsonl(run.run_dir / "events.jsonl") if e["event"] == "resume" and e["time"] > fault_time), None
    )
    if resume is None:
        return {"resumed_from": None, "steps_recomputed": None, "seconds_to_resume": None}
    first = next((m for m in metrics(run) if m["step"] == resume["step"] + 1 and m["time"] > fault_time), None)
    return {
        "resumed_from": resume["step"],
        "steps_recomputed": (resume.get("superseded_step") or resume["step"]) - resume["step"],
        "seconds_to_resume": None if first is None else first["time"] - fault_time,
    }


def idle_nodes() -> list[str]:
    """The partition's idle nodes, in Slurm's order."""
    out = subprocess.run(
        ["timeout", "10", "sinfo", "-h", "-p", "local", "-t", "idle", "-N", "-o", "%N"], capture_output=True, text=True
    ).stdout
    return sorted(set(out.split()), key=lambda n: (len(n), n))
