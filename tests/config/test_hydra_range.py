"""The declared hydra-core range (``>=1.3.2,<1.4``) holds at both ends: 1.3.2 (what NeMo images pin)
composes every shipped recipe to the same resolved config as the venv's 1.3.8.

hydra-core 1.3.2 is installed once (``pip install --no-deps --target``, from PyPI or pip's cache) into
``.venv/hydra-core-1.3.2`` and put first on a fresh interpreter's path; omegaconf and antlr are shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # one pip install (first time) and a fresh interpreter composing every recipe

LOW = "1.3.2"
TARGET = Path(sys.prefix) / f"hydra-core-{LOW}"
DUMP = (
    "import json, sys, hydra; from omegaconf import OmegaConf\n"
    "from kilocard.config.compose import compose, recipe_catalog\n"
    "out = {'version': hydra.__version__}\n"
    "for name in sorted(recipe_catalog()):\n"
    "    cfg = compose([f'recipe={name}', 'cluster.nodes=2'])\n"
    "    out[name] = OmegaConf.to_container(cfg, resolve=True)\n"
    "print(json.dumps(out, sort_keys=True))\n"
)


def low_end() -> Path:
    if not (TARGET / "hydra").is_dir():
        tmp = TARGET.with_name(TARGET.name + ".tmp")
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp), f"hydra-core=={LOW}"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, f"pip could not install hydra-core=={LOW}: {proc.stderr[-500:]}"
        tmp.rename(TARGET)
    return TARGET


def dump(pythonpath: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-c", DUMP], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_both_ends_of_the_hydra_range_compose_every_recipe_alike():
    high, low = dump(None), dump(str(low_end()))
    assert low.pop("version") == LOW and high.pop("version").startswith("1.3.")
    assert len(high) >= 20 and low == high
