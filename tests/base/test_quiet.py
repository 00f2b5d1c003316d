"""Quiet by default: the library notes every rank used to print are filtered where they come from, and
nothing else is (real imports of torch and Megatron-Core in fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kilocard.base.quiet import LAUNCHER_NOISE, with_launcher_filter

pytestmark = pytest.mark.slow  # imports Megatron-Core in a fresh interpreter (~10 s)


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )


def test_rank_imports_are_quiet_and_other_warnings_still_show():
    code = (
        "from kilocard.base.quiet import quiet_library_warnings; quiet_library_warnings()\n"
        "import torch.cuda, megatron.core.optimizer, megatron.core.models.gpt.gpt_layer_specs\n"
        "import warnings; warnings.warn('a warning of the user', UserWarning)\n"
    )
    proc = python(code)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "Warning:" in line]
    assert len(warned) == 1 and "a warning of the user" in warned[0], proc.stderr


def test_without_the_filters_the_same_imports_warn():
    """The test above can fail: the same imports, unfiltered, print the notes."""
    proc = python("import torch.cuda, megatron.core.optimizer")
    assert "Transformer Engine and Apex are not installed" in proc.stderr


def test_the_launcher_filter_silences_pynvml_in_a_process_kilocard_does_not_run():
    assert with_launcher_filter("error::DeprecationWarning") == f"error::DeprecationWarning,{LAUNCHER_NOISE}"
    assert with_launcher_filter(LAUNCHER_NOISE) == LAUNCHER_NOISE
    proc = python("import torch.cuda; import warnings; warnings.warn('kept', FutureWarning)",
                  PYTHONWARNINGS=with_launcher_filter(None))  # fmt: skip
    assert "pynvml" not in proc.stderr and "kept" in proc.stderr
