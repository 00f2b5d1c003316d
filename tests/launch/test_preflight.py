"""The in-job preflight (slurm/preflight.py) records what runs and refuses a node that cannot run the job.

Run as the batch script runs it: a plain ``python preflight.py`` in a real interpreter, once with
kilocard's own environment and once in a real venv that lacks megatron-core.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from venvs import REPO, venv_without

pytestmark = pytest.mark.integration  # runs preflight.py in real interpreters (each imports torch and megatron)

SCRIPT = REPO / "slurm" / "preflight.py"
RANGE = ["--mcore-min", "0.16.1", "--mcore-below", "0.20"]


def preflight(python: str, run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "1", "HOME": str(run_dir)}
    return subprocess.run(
        [python, str(SCRIPT), str(run_dir), *args], env=env, capture_output=True, text=True, timeout=120
    )


def record(run_dir: Path) -> dict:
    (path,) = (run_dir / "provenance").glob("job-4242-1-*.json")
    return json.loads(path.read_text())


def test_ready_node_with_nvrx_records_versions_and_passes(tmp_path):
    """kilocard's own environment, with ``--need-nvrx`` (rendered when launcher.max_restarts > 0): it passes
    and records every version, NVRx's included."""
    proc = preflight(sys.executable, tmp_path, "--gpus-per-node", "0", *RANGE, "--need-nvrx")
    assert proc.returncode == 0, proc.stderr
    rec = record(tmp_path)
    assert rec["megatron-core"].startswith("0.16.1") and rec["torch"] and rec["kilocard"]
    assert rec["nvidia-resiliency-ext"] == "0.4.1"
    assert rec["gpu_count"] == 0 and rec["problems"] == [] and rec["restart"] == 1
    assert not (tmp_path / "FAILED").exists()


def test_gpu_count_and_version_range_are_bad_config_naming_node_and_reason(tmp_path):
    proc = preflight(sys.executable, tmp_path, "--gpus-per-node", "8", "--mcore-min", "0.17", "--mcore-below", "0.20")
    assert proc.returncode == 2
    failed = (tmp_path / "FAILED").read_text()
    assert "0 GPU(s) visible, the job asked for 8 per node" in failed
    assert "outside the supported range >=0.17,<0.20" in failed
    assert failed.startswith("preflight failed on node ")
    assert len(proc.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_venv_without_megatron_core_and_nvrx_fails_in_seconds_naming_each_module(tmp_path):
    """A node whose Python lacks megatron-core, and NVRx which in-job restarts (``--need-nvrx``) need: the
    preflight fails within seconds, naming each missing module and the fix for the restarts."""
    from kilocard.launch.ftlaunch import MODULE

    venv = venv_without(tmp_path, ("megatron", "nvidia_resiliency"))
    t0 = time.monotonic()
    proc = preflight(str(venv / "bin" / "python"), tmp_path / "run", "--gpus-per-node", "0", *RANGE, "--need-nvrx")
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - t0 < 60
    failed = (tmp_path / "run" / "FAILED").read_text()
    assert "import megatron.core failed: ModuleNotFoundError" in failed
    assert f"import {MODULE} failed" in failed
    assert "launcher.max_restarts=0" in proc.stderr
    assert record(tmp_path / "run")["megatron-core"] is None


def test_preflight_names_the_launcher_module_the_batch_script_runs():
    """preflight.py keeps its own copy (standard library only): it must stay ftlaunch.MODULE."""
    import runpy

    from kilocard.launch.ftlaunch import MODULE

    assert runpy.run_path(str(SCRIPT))["NVRX_LAUNCHER"] == MODULE
