"""A lean user install (docs/install.md): ``pip install .`` on a fresh venv, no test tools, no oracle, no
extras; then what a new user does first.

Bounded: torch (a ~700 MB unpack) is linked into the fresh venv from the test venv, exactly that
distribution (``torch``, ``torchgen``, ``functorch`` and its dist-info), so pip finds it installed; every
other dependency is resolved and installed by pip from its index and cache, kilocard from a wheel that pip
builds from this checkout. Measured about 2-7 minutes on 2 busy cores, once per session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from venvs import REPO, site_packages

pytestmark = pytest.mark.slow

TORCH = ("torch", "torchgen", "functorch")


@pytest.fixture(scope="module")
def lean(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("lean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    src, dst = site_packages(Path(sys.prefix)), site_packages(venv)
    for entry in src.iterdir():
        if entry.name in TORCH or (entry.name.startswith("torch-") and entry.name.endswith(".dist-info")):
            (dst / entry.name).symlink_to(entry)
    proc = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
        capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


def kc(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(
        [str(venv / "bin" / "kilocard"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_lean_install_has_no_test_tools_and_no_extras(lean):
    code = (
        "import importlib.util as u; "
        "print([m for m in ('pytest', 'hatchling', 'tensorboard', 'matplotlib', 'wandb', 'mlflow', "
        "'nvidia_resiliency_ext', 'transformers') if u.find_spec(m)])"
    )
    proc = subprocess.run([str(lean / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr
    assert not (site_packages(lean) / "kilocard" / "__init__.py").is_symlink()  # installed, not linked


def test_a_new_users_first_commands(lean, tmp_path):
    from kilocard import __version__

    v = kc(lean, tmp_path, "--version")
    assert (v.returncode, v.stdout.strip()) == (0, f"kilocard {__version__}")
    assert kc(lean, tmp_path, "validate", "recipe=tiny_gpt").returncode == 0

    # the first run works without any extra: TensorBoard is off unless asked (torchtitan, Megatron-LM)
    first = kc(lean, tmp_path, "run", "recipe=tiny_gpt", "trainer.train_iters=2")
    assert first.returncode == 0 and "0 DONE" in first.stdout, first.stdout + first.stderr
    (first_dir,) = (tmp_path / "runs").iterdir()
    assert (first_dir / "metrics.jsonl").is_file() and not (first_dir / "tensorboard").exists()
    shutil.rmtree(tmp_path / "runs")

    # asked for without its extra: one line naming the extra, nothing written
    r = kc(lean, tmp_path, "run", "recipe=tiny_gpt", "trainer.tensorboard=true")
    assert r.returncode == 1 and "pip install 'kilocard[tensorboard]', or trainer.tensorboard=false" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "runs").exists()
    p = kc(lean, tmp_path, "plan", "recipe=tiny_gpt", "--plot", "p.png")
    assert (p.returncode, p.stderr) == (2, "kilocard plan: error: --plot p.png: needs matplotlib "
                                           "(pip install 'kilocard[plots]')\n")  # fmt: skip

    # the default snapshot packaging from an installed kilocard: no build backend at submit time
    s = kc(lean, tmp_path, "sbatch", "recipe=tiny_gpt", "cluster.shared_fs=runs")
    assert s.returncode == 0, s.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "code" / "site" / "kilocard" / "conf" / "config.yaml").is_file()
