"""A run directory is never overwritten: a second `kilocard sbatch` or `kilocard run` with the same
launcher.run_name is refused with a clear message and leaves the first run untouched; without a
run_name every launch gets a new directory. Real console-script subprocesses, no Slurm needed
(no --submit)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # runs the kilocard console script

KILOCARD = Path(sys.executable).with_name("kilocard")
BASE = ["recipe=tiny_gpt", "trainer.train_iters=1"]


def kilocard(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(cwd), "KILOCARD_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run([str(KILOCARD), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def tree_digest(root: Path) -> str:
    """sha256 over every file path and content under ``root``."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def test_same_run_name_is_refused_by_sbatch_and_run_and_auto_names_never_collide(tmp_path):
    shared = tmp_path / "shared"
    named = [*BASE, f"cluster.shared_fs={shared}", "launcher.run_name=exp-1"]
    first = kilocard("sbatch", *named, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = shared / "exp-1"
    assert (run_dir / "submit.sbatch").is_file()
    before = tree_digest(run_dir)

    again = kilocard("sbatch", *named, "trainer.train_iters=2", cwd=tmp_path)
    assert again.returncode != 0
    assert f"launcher.run_name: {run_dir} already exists; a run directory is never overwritten" in again.stderr
    assert "Traceback" not in again.stderr

    local = kilocard("run", *named, cwd=tmp_path)
    assert local.returncode != 0
    assert f"launcher.run_name: {run_dir} already exists; a run directory is never overwritten" in local.stderr
    assert "--resume" in local.stderr and "Traceback" not in local.stderr
    assert tree_digest(run_dir) == before, "the existing run directory was modified"
    assert sorted(p.name for p in shared.iterdir()) == ["exp-1"], "a second directory appeared"

    unnamed = [*BASE, f"cluster.shared_fs={shared}"]
    made = []
    for _ in range(2):
        res = kilocard("sbatch", *unnamed, cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        made.append(next(line[len("run dir: ") :] for line in res.stdout.splitlines() if line.startswith("run dir: ")))
    assert len(set(made)) == 2 and all(Path(m).parent == shared for m in made)
    assert tree_digest(run_dir) == before
