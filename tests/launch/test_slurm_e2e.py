"""End to end on a real Slurm cluster (scripts/slurm-up.sh): `kilocard sbatch --submit` -> the emitted
script -> srun -> `python -m kilocard.train` on CPU ranks (gloo) on several slurmd nodes.

* basic: tiny_gpt on 2 nodes x 2 ranks COMPLETES and writes metrics.jsonl; an env value carrying
  `$(touch ...)` reaches the job and never executes.
* time limit: `--time=00:02:00` with USR1 45 s before it; the ranks save and exit RETRY, the job
  requeues itself, resumes and finishes; its loss curve equals an uninterrupted run's.
* chain: 3 jobs (afterany); the first is cancelled with scancel while training; the second resumes
  from the committed step and finishes; the third exits at once (DONE marker).

Steps must outlast the USR1 lead: Slurm sends USR1 45 to 75 s after the start of a 2-minute job
(its time-limit check runs every 30 s). The basic run, the chain and the chain's uninterrupted twin
(2 nodes x 1 rank) start together (6 nodes); once they end, the time-limit and reference runs take
at least 90 s: each rank sleeps ``DELAY_S`` before every step (``KILOCARD_FAULT_STEP_DELAY_S``), so
the runs last long without computing for long (they once trained flat out for 90 s, two runs of two
ranks: the most CPU of any test).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.rundir.names import STEP_DELAY_ENV
from slurm_runs import SLOW, sbatch_in_process

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
#: Seconds of steps of the time-limit and reference runs, at least: ``TRAIN_S / DELAY_S`` steps.
TRAIN_S = 90
#: Seconds each rank of those runs sleeps before a step (the steps themselves take ~0.05 s): 90 steps and 18
#: committed saves per run (at 0.25 s, 360 steps and 72 saves cost four times the CPU for the same proof).
DELAY_S = 1.0
#: Steps of the chain and its uninterrupted twin: the chain's ranks sleep 0.25 s before each step (``SLOW``), so
#: the cancel after step 7 lands well before the end (over 8 s of steps are left) however fast the machine.
CHAIN_ITERS = 40
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def submit(
    root: Path, *overrides: str, chain: int = 1, nodes: int = 2, ranks: int = 2, env: dict[str, str] | None = None
) -> dict[str, object]:
    """`kilocard sbatch ... --submit` in this process, with ``env`` set in the submitting environment (sbatch
    passes it on to the job); returns run dir, script and job ids."""
    args = [
        "sbatch",
        "recipe=tiny_gpt",
        "cluster=local_cpu",
        f"cluster.nodes={nodes}",
        f"cluster.gpus_per_node={ranks}",
        f"cluster.cpus_per_node={ranks}",
        "cluster.partition=local",
        f"cluster.venv={sys.prefix}",
        f"cluster.shared_fs={root}",
        "trainer.tensorboard=false",
        "launcher.time=00:10:00",
        "launcher.signal_lead_s=45",
        *overrides,
        "--submit",
    ]
    if chain > 1:
        args += ["--chain", str(chain)]
    rc, out, err = sbatch_in_process(args, env)
    assert rc == 0, err.getvalue()
    lines = dict(line.split(": ", 1) for line in out.getvalue().strip().splitlines())
    ids = [int(x) for x in lines[next(k for k in lines if k.startswith("job id"))].split()]
    return {"run_dir": Path(lines["run dir"]), "ids": ids}


def scontrol_job(job_id: int) -> dict[str, str]:
    out = subprocess.run(
        ["timeout", "10", "scontrol", "show", "job", str(job_id)], capture_output=True, text=True
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait_state(job_id: int, timeout_s: float, states=TERMINAL) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    info: dict[str, str] = {}
    while time.monotonic() < deadline:
        info = scontrol_job(job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(2)
    raise AssertionError(f"job {job_id} not in {sorted(states)} after {timeout_s:.0f} s: {info.get('JobState')}")


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("slurm-*.out")))


def losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics(run_dir)}


@pytest.fixture(scope="module")
def runs(local_slurm, tmp_path_factory):
    """Submit the basic run, the chain and its uninterrupted twin; once the basic run and the twin end,
    submit the time-limit and reference runs (``TRAIN_S / DELAY_S`` steps, ``DELAY_S`` of sleep before each)."""
    root = tmp_path_factory.mktemp("slurm-runs")
    pwned = root / "pwned"
    basic = submit(root, "trainer.train_iters=10", f"+launcher.env.INJECTED='$(touch {pwned}); `touch {pwned}`'")
    short = [f"trainer.train_iters={CHAIN_ITERS}", "checkpoint.save_interval=5"]
    calib = submit(root, *short, "launcher.job_name=calibrate", nodes=2, ranks=1)
    chain = submit(root, *short, "launcher.job_name=chain", chain=3, nodes=2, ranks=1, env=SLOW)
    while_running = cancel_after_first_commit(chain["ids"][0], chain["run_dir"])
    info = wait_state(basic["ids"][0], 300)
    wait_state(calib["ids"][0], 300)
    # one uninterrupted attempt takes over 90 s whatever the machine's speed: USR1 (45-75 s after the start)
    # interrupts it, and the second attempt (USR1 again after >= 45 s) usually finishes the rest
    iters = math.ceil(TRAIN_S / DELAY_S)
    common = [f"trainer.train_iters={iters}", "checkpoint.save_interval=5"]
    slow = {STEP_DELAY_ENV: str(DELAY_S)}
    ref = submit(root, *common, "launcher.job_name=reference", nodes=2, ranks=1, env=slow)
    limited = submit(root, *common, "launcher.job_name=timelimit", "launcher.time=00:02:00", nodes=2, ranks=1, env=slow)
    return {
        "root": root,
        "pwned": pwned,
        "basic": basic,
        "basic_info": info,
        "iters": iters,
        "ref": ref,
        "limited": limited,
        "calib": calib,
        "chain": chain,
        "chain_logs_while_running": while_running,
    }


def cancel_after_first_commit(job_id: int, run_dir: Path) -> str:
    """scancel the job once it has trained past its first committed step (5); returns what ``kilocard logs
    RUN_DIR --rank 0`` printed just before, while the job ran."""
    deadline = time.monotonic() + 300
    while len(metrics(run_dir)) < 7:
        state = scontrol_job(job_id).get("JobState")
        assert state in ("PENDING", "RUNNING") and time.monotonic() < deadline, (state, logs(run_dir))
        time.sleep(0.5)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["logs", str(run_dir), "--rank", "0"]) == 0
    assert scontrol_job(job_id).get("JobState") == "RUNNING"
    subprocess.run(["timeout", "10", "scancel", str(job_id)], check=True)
    return out.getvalue()


def test_basic_run_completes_on_two_nodes(runs):
    """2 nodes x 2 ranks through the emitted script: COMPLETED, metrics for every step, ids recorded."""
    run_dir, info = runs["basic"]["run_dir"], runs["basic_info"]
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", logs(run_dir)
    assert info["NumNodes"] == "2" and info["NumTasks"] == "4"
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, 11))
    assert (run_dir / "DONE").exists()
    assert json.loads((run_dir / "jobs.json").read_text())["job_ids"] == runs["basic"]["ids"]
    assert not runs["pwned"].exists(), "an env value was executed by the batch script"
    # the job's log ends with the reproduction report, and `kilocard report` reads the Slurm run directory
    assert "reproduction (kilocard report RUN_DIR" in logs(run_dir) and "measured (median)" in logs(run_dir)
    # rank 0's step line every trainer.log_interval (1) steps, labelled by srun; every rank says where it runs
    steps = [line for line in logs(run_dir).splitlines() if re.match(r"0: step \d+/10 \| loss \d", line)]
    assert [line.split()[2] for line in steps] == [f"{n}/10" for n in range(1, 11)], logs(run_dir)
    assert all("TFLOP/s/gpu" in line and "MFU" in line and "grad norm" in line for line in steps)
    assert all(
        re.search(rf"^{r}: \[rank {r}\] kilocard\.train: rank {r} of 4 up on n\d", logs(run_dir), re.M)
        for r in range(4)
    )
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(run_dir), "--format", "json"]) == 0
    rep = json.loads(out.getvalue())
    assert rep["steps_used"] and rep["predicted"]["tflops_per_gpu"] > 0 and rep["measured"]["tflops_per_gpu"] > 0


def test_time_limit_requeues_and_matches_uninterrupted_run(runs):
    """USR1 before the limit -> save, exit 75, scontrol requeue -> resume -> the same loss curve."""
    ref_info = wait_state(runs["ref"]["ids"][0], 420)
    info = wait_state(runs["limited"]["ids"][0], 420)
    run_dir = runs["limited"]["run_dir"]
    assert ref_info["JobState"] == "COMPLETED", logs(runs["ref"]["run_dir"])
    assert info["JobState"] == "COMPLETED", logs(run_dir)
    assert int(info["Restarts"]) >= 1, logs(run_dir)
    text = logs(run_dir)
    assert "trainer exit code 75" in text and "requeueing job" in text
    expected, got = losses(runs["ref"]["run_dir"]), losses(run_dir)
    assert sorted(got) == list(range(1, runs["iters"] + 1))
    assert got == expected


def test_chain_continues_after_scancel(runs):
    """Cancel link 1 mid-run: link 2 resumes from the committed step and finishes; link 3 exits at once;
    the loss curve equals the uninterrupted twin's."""
    ids, run_dir = runs["chain"]["ids"], runs["chain"]["run_dir"]
    first = wait_state(ids[0], 120)
    second = wait_state(ids[1], 420)
    third = wait_state(ids[2], 120)
    text = logs(run_dir)
    assert first["JobState"] == "CANCELLED", text
    assert second["JobState"] == "COMPLETED" and third["JobState"] == "COMPLETED", text
    m = re.search(r"resumed from \S+ \(step (\d+)", text)
    assert m and int(m.group(1)) >= 5, text
    assert "run already complete (DONE marker)" in text
    shown = runs["chain_logs_while_running"].splitlines()  # `kilocard logs --rank 0` while link 1 trained
    assert any(re.match(rf"0: step [1-7]/{CHAIN_ITERS} \| loss \d.* TFLOP/s/gpu", line) for line in shown), shown
    twin_info = wait_state(runs["calib"]["ids"][0], 420)
    assert twin_info["JobState"] == "COMPLETED"
    assert sorted(losses(run_dir)) == list(range(1, CHAIN_ITERS + 1))
    assert losses(run_dir) == losses(runs["calib"]["run_dir"])
