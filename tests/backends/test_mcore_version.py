"""The megatron-core under test is the one this pass of scripts/test.sh means to prove.

scripts/test.sh runs the suite on megatron-core 0.16.1 (.venv), then the ``mcore_range`` tests again
with 0.19.2 first on the path (``KILOCARD_EXPECT_MCORE=0.19.2``). Without this check a broken
second pass could silently test 0.16.1 twice.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

import pytest

from kilocard.backends import cpu_shim

pytestmark = pytest.mark.mcore_range

REPO = Path(__file__).resolve().parents[2]


def test_installed_megatron_core_is_the_expected_and_a_proven_release():
    version = cpu_shim.megatron_core_version()
    assert version in cpu_shim.PROVEN_VERSIONS
    expected = os.environ.get("KILOCARD_EXPECT_MCORE")
    if expected:
        assert version == expected
        import megatron.core

        assert expected.startswith(megatron.core.__version__.split("+")[0])


def test_declared_range_starts_and_ends_at_proven_releases():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in deps if d.startswith("megatron-core")]
    low, high = re.fullmatch(r"megatron-core>=([\d.]+),<([\d.]+)", spec).groups()
    proven = sorted(cpu_shim.PROVEN_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))
    assert proven[0] == low
    assert tuple(map(int, proven[-1].split("."))) < tuple(map(int, high.split(".")))
