"""The fast tier (docs/testing.md): what ``scripts/test.sh --fast`` selects, and what it must never pay for.

The verbs that only read configs (``recipes``, ``show``, ``validate``, ``plan``) import neither torch nor
Megatron-Core; collecting the unit tier imports neither; and the guard in tests/conftest.py fails a
unit test that starts a Python process or imports one of them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # each test starts a Python process

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "megatron", "transformers")

VERBS_IN_ONE_PROCESS = """
import contextlib, io, json, sys
from kilocard.commands import main
seen = {}
for argv in (["recipes"], ["show", "recipe=tiny_gpt"], ["validate", "recipe=llama3_8b"], ["plan", "recipe=tiny_moe"]):
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    seen[argv[0]] = [code, sorted(m for m in HEAVY if m in sys.modules)]
print(json.dumps(seen))
"""


def test_config_verbs_import_neither_torch_nor_megatron_core():
    """One process runs the four verbs in turn: each exits 0 and none has imported a heavy module after it."""
    code = f"HEAVY = {HEAVY!r}\n" + VERBS_IN_ONE_PROCESS
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert list(seen) == ["recipes", "show", "validate", "plan"]
    assert {verb: got for verb, got in seen.items() if got != [0, []]} == {}


def test_fast_collects_the_unit_tier_without_heavy_imports():
    """``scripts/test.sh --fast --collect-only``: exit 0 (a test module importing torch at the top would make it
    a usage error, exit 4), unit tests of each package collected, no slow, Slurm or integration test among them."""
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "test.sh"), "--fast", "--collect-only", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    collected = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", proc.stdout)
    assert collected, proc.stdout[-1000:]
    assert int(collected[1]) == len(ids) > 300
    for package in ("commands", "config", "launch", "perf", "planner", "validate"):
        assert any(i.startswith(f"tests/{package}/") for i in ids), package
    for outside in (
        "tests/launch/test_slurm_e2e.py",  # slurm, slow
        "tests/train/test_faults_train.py",  # slow
        "tests/launch/test_preflight.py",  # integration
        "tests/test_unit_tier.py",  # this module: integration
    ):
        assert not any(i.startswith(outside) for i in ids), outside


GUARDED = """
import subprocess, sys

def test_starts_python():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_imports_torch():
    import torch  # noqa: F401
"""


def test_guard_fails_a_unit_test_that_starts_python_or_imports_torch(tmp_path):
    """The conftest's guard, run on two unmarked tests in a scratch tree with the suite's conftest."""
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "unit",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore",
            "test_guarded.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "2 passed, 2 errors" in proc.stdout, proc.stdout[-3000:]
    assert re.search(r"unit test started '.*python[^']* -c pass': mark it integration", proc.stdout), proc.stdout
    assert "unit test imported torch: mark it integration" in proc.stdout


def test_unit_tier_refuses_a_module_that_imports_torch_when_collected(tmp_path):
    """``-m unit`` on a module with ``import torch`` at the top: a usage error (exit 4) naming the module."""
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_heavy.py").write_text("import torch  # noqa: F401\n\n\ndef test_nothing():\n    pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-m", "unit", "-p", "no:cacheprovider", "-Wignore", "test_heavy.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 4, (proc.stdout + proc.stderr)[-3000:]
    assert "test_heavy.py imports torch when collected" in proc.stdout + proc.stderr


@pytest.mark.parametrize("oracle", [False, True], ids=["oracle-missing", "oracle-first"])
def test_the_second_pass_stops_unless_its_megatron_core_is_the_one_imported(tmp_path, oracle):
    """scripts/test.sh's megatron-core 0.19.2 pass sets ``KILOCARD_EXPECT_MCORE``: with ``.oracle/`` absent from the
    path (0.16.1 would be imported) the session is a usage error (exit 4) naming the fix before any test runs; with
    it first on the path the tests run."""
    if oracle and not (REPO / ".oracle" / "megatron" / "core").is_dir():
        pytest.skip("no .oracle/ here: bash scripts/install_oracle.sh")
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_one.py").write_text("def test_nothing():\n    pass\n")
    env = {**os.environ, "KILOCARD_EXPECT_MCORE": "0.19.2"}
    env["PYTHONPATH"] = str(REPO / ".oracle") if oracle else ""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_one.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    if oracle:
        assert proc.returncode == 0 and "1 passed" in out, out[-3000:]
    else:
        assert proc.returncode == 4, out[-3000:]
        assert "KILOCARD_EXPECT_MCORE=0.19.2: megatron-core 0.16.1" in out and "install_oracle.sh" in out, out[-3000:]
