"""The built wheel ships conf/, recipes/, slurm/ and baselines/, and composes a recipe on its own.

Builds the real wheel with pip (hatchling, no build isolation: nothing is downloaded), unpacks it
into a temporary directory (what ``pip install --target`` does for a pure-Python wheel), and
composes ``recipe=llama3_70b`` in a fresh interpreter whose working directory is outside the
repository and whose ``kilocard`` is the unpacked one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # builds the wheel and composes in a fresh interpreter

PROBE = """
import json, kilocard
from kilocard.paths import data_dir
from kilocard.config.compose import compose, to_run_config

rc = to_run_config(compose(["recipe=llama3_70b"]))
print(json.dumps({"pkg": kilocard.__file__, "conf": str(data_dir("conf")), "layers": rc.model.num_layers,
                  "gpus": rc.cluster.nodes * rc.cluster.gpus_per_node, "tp": rc.parallel.tensor_model_parallel_size}))
"""


def test_wheel_ships_the_data_and_composes_outside_the_repo(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path / "dist"), str(REPO)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("kilocard-*.whl")
    target = tmp_path / "target"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(target)
    for shipped in (
        "conf/config.yaml",
        "conf/cluster/h100_dgx.yaml",
        "recipes/llama/llama3_70b.yaml",
        "baselines/published.yaml",
        "baselines/published.folds.json",  # kilocard plan states the model error from it
    ):
        assert f"kilocard/{shipped}" in names, shipped
    assert any(n.startswith("kilocard/slurm/") for n in names)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**env, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["pkg"].startswith(str(target)) and got["conf"] == str(target / "kilocard" / "conf")
    assert (got["layers"], got["gpus"], got["tp"]) == (80, 512, 4)
