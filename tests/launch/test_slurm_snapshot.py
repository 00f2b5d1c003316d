"""Code delivery and the in-job preflight on the real local Slurm cluster (scripts/slurm-up.sh).

* snapshot: the nodes' venv has every dependency but NOT kilocard (tests/venvs.py). `kilocard sbatch
  --submit` runs from a copy of the checkout (the "checkout"), the job is held, the copy's kilocard is
  then broken, the job released: it trains to DONE on 2 nodes from <run_dir>/code/site, which the
  per-node preflight records as the kilocard that ran.
* preflight: a venv lacking megatron-core ends the job FAILED (exit 2) in under 60 s, not requeued,
  its FAILED marker naming the module.

Both jobs are submitted together (3 nodes, 1 rank each); about a minute on 2 cores.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from kilocard.commands.logs import show as show_logs
from venvs import REPO, venv_without

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
#: What a checkout needs to pack kilocard's wheel: pyproject.toml, README.md and pyproject's hatch build
#: sections (the package and every force-included folder), read from pyproject so a new one is not missed.
_WHEEL = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
CHECKOUT = ("pyproject.toml", "README.md", "src", *_WHEEL["force-include"])
#: The editable install's entries in site-packages (the package, its metadata, its .pth hook).
KILOCARD_ENTRIES = ("kilocard", "_kilocard", "_editable_impl_kilocard", "__editable__")


def wait_state(job_id: int, timeout_s: float) -> dict[str, str]:
    """``scontrol show job`` fields once the job has ended (COMPLETED, FAILED, ...)."""
    deadline, info = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        out = subprocess.run(["timeout", "10", "scontrol", "show", "job", str(job_id)], capture_output=True, text=True)
        info = dict(re.findall(r"(\w+)=(\S*)", out.stdout))
        if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return info
        time.sleep(1)
    raise AssertionError(f"job {job_id} still {info.get('JobState')} after {timeout_s:.0f} s")


def logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("slurm-*.out")))


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def copy_checkout(dst: Path) -> Path:
    """A copy of this checkout's working tree (what `git clone` + edits would be), no caches."""
    for rel in CHECKOUT:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dst / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def sbatch(checkout: Path, root: Path, venv: Path, nodes: int, *overrides: str) -> dict:
    """`python -m kilocard.cli sbatch ... --submit` with kilocard imported from ``checkout`` only."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(checkout / "src"), OMP_NUM_THREADS="1")
    argv = [
        sys.executable, "-m", "kilocard.cli", "sbatch", "recipe=tiny_gpt", "cluster=local_cpu",
        f"cluster.nodes={nodes}", "cluster.gpus_per_node=1", "cluster.cpus_per_node=1", "cluster.partition=local",
        f"cluster.venv={venv}", f"cluster.shared_fs={root}", "trainer.tensorboard=false", "trainer.train_iters=3",
        "launcher.time=00:10:00", "launcher.signal_lead_s=45", *overrides, "--submit",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(": ", 1) for line in proc.stdout.strip().splitlines())
    return {"run_dir": Path(out["run dir"]), "id": int(out["job id"])}


@pytest.fixture(scope="module")
def jobs(local_slurm, tmp_path_factory):
    """Submit the held snapshot job and the no-megatron job; break the checkout; release the first."""
    tmp = tmp_path_factory.mktemp("snapshot")
    checkout = copy_checkout(tmp / "checkout")
    root = tmp / "runs"
    root.mkdir()
    no_kilocard = venv_without(tmp / "a", KILOCARD_ENTRIES)
    no_mcore = venv_without(tmp / "b", ("megatron",))
    held = sbatch(checkout, root, no_kilocard, 2, "launcher.job_name=snapshot", "launcher.extra_sbatch=['--hold']")
    t0 = time.monotonic()
    broken = sbatch(checkout, root, no_mcore, 1, "launcher.job_name=nomcore")
    init = checkout / "src" / "kilocard" / "__init__.py"
    init.write_text('raise ImportError("the edited checkout was imported")\n' + init.read_text())
    subprocess.run(["timeout", "10", "scontrol", "release", str(held["id"])], check=True)
    broken["info"] = wait_state(broken["id"], 120)
    broken["elapsed_s"] = time.monotonic() - t0
    held["info"] = wait_state(held["id"], 300)
    return {"held": held, "broken": broken}


def test_snapshot_trains_without_kilocard_installed_and_ignores_later_edits(jobs):
    """DONE from <run_dir>/code/site on both nodes although the venv lacks kilocard and the checkout broke."""
    run_dir, info = jobs["held"]["run_dir"], jobs["held"]["info"]
    assert info["JobState"] == "COMPLETED", logs(run_dir)
    assert (run_dir / "DONE").exists() and [m["step"] for m in metrics(run_dir)] == [1, 2, 3]
    assert (run_dir / "code" / "requirements.txt").read_text().count("megatron-core==") == 1
    records = [json.loads(p.read_text()) for p in (run_dir / "provenance").glob(f"job-{jobs['held']['id']}-0-*.json")]
    assert len({r["node"] for r in records}) == 2, records  # one preflight task per node
    assert {r["kilocard_path"] for r in records} == {str(run_dir / "code" / "site" / "kilocard")}
    assert all(r["problems"] == [] and r["megatron-core"] for r in records)
    out = io.StringIO()
    with redirect_stdout(out):
        assert show_logs(run_dir, rank=0) == 0
    lines = out.getvalue().splitlines()
    assert any(line.startswith("0: ") for line in lines) and not any(line.startswith("1: ") for line in lines)
    assert any("trainer exit code 0" in line for line in lines)


def test_node_without_megatron_core_fails_fast_naming_the_module(jobs):
    """The preflight ends the job with exit 2 in under 60 s; the FAILED marker is the preflight's; no requeue."""
    run_dir, info = jobs["broken"]["run_dir"], jobs["broken"]["info"]
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", logs(run_dir)
    assert info["Restarts"] == "0" and jobs["broken"]["elapsed_s"] < 60
    failed = (run_dir / "FAILED").read_text()
    assert failed.startswith("preflight failed on node ") and "import megatron.core failed" in failed
    assert not (run_dir / "metrics.jsonl").exists()


def test_test_only_asks_the_controller_and_writes_nothing(local_slurm, tmp_path, capsys):
    """`kilocard sbatch --test-only`: slurmctld's start estimate for the real script; no run dir, no job."""
    from kilocard.cli import main

    root = tmp_path / "runs"
    args = ["recipe=tiny_gpt", "cluster.nodes=2", "cluster.partition=local", f"cluster.shared_fs={root}"]
    rc = main(["sbatch", *args, "launcher.signal_lead_s=60", "launcher.job_name=h8-testonly", "--test-only"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert re.fullmatch(
        r"test only \(nothing submitted\): sbatch: Job \d+ to start at \S+ using \d+ processors on nodes \S+ "
        r"in partition local\n",
        out,
    ), out
    assert not root.exists()
    queued = subprocess.run(["timeout", "10", "squeue", "-h", "-n", "h8-testonly"], capture_output=True, text=True)
    assert queued.returncode == 0 and queued.stdout.strip() == ""
