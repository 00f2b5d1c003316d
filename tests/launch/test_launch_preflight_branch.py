"""The batch script's preflight branch: a failed preflight ends the job with 2, keeps its FAILED marker.

srun and scontrol are stand-ins (the branch depends only on the preflight step's exit code and the
marker it leaves); the real preflight on the local Slurm cluster is in test_slurm_snapshot.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.launch.render import render_script
from kilocard.plan import build_plan

MARKER = "preflight failed on node n1 (job 9): import megatron.core failed: ModuleNotFoundError\n"


def run_script(tmp_path: Path, preflight_body: str) -> tuple[subprocess.CompletedProcess, Path, str]:
    run_dir, bin_dir, calls = tmp_path / "run", tmp_path / "bin", tmp_path / "calls"
    run_dir.mkdir()
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        f'#!/bin/bash\nif [[ "$*" == *preflight.py* ]]; then echo preflight >> {calls}; {preflight_body}; fi\n'
        f"echo train >> {calls}\nexit 0\n"
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "scontrol $*" >> {calls}\necho n1\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    rc = to_run_config(compose(["recipe=tiny_gpt", "launcher=slurm"]))
    script = tmp_path / "train.sbatch"
    script.write_text(render_script(rc, build_plan(rc), run_dir))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1"}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    return proc, run_dir, calls.read_text()


@pytest.mark.parametrize(
    "body,marker",
    [
        (f"printf '{MARKER}' > FAILED; exit 2", MARKER),  # the preflight's own verdict is kept as written
        ("exit 127", "job 9 preflight exit code 127"),  # python missing: the script writes the marker
    ],
)
def test_failed_preflight_ends_the_job_with_bad_config_and_no_training(tmp_path, body, marker):
    proc, run_dir, calls = run_script(tmp_path, body)
    assert proc.returncode == 2, proc.stderr
    assert "requeue" not in calls and "train" not in calls
    assert (run_dir / "FAILED").read_text().startswith(marker) and not (run_dir / "DONE").exists()
    assert "preflight failed (code" in proc.stderr


def test_passed_preflight_goes_on_to_train(tmp_path):
    proc, run_dir, calls = run_script(tmp_path, "exit 0")
    assert proc.returncode == 0, proc.stderr
    assert calls.count("preflight") == 1 and calls.rstrip().endswith("train") and (run_dir / "DONE").exists()
