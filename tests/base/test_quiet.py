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


PROFILE = (
    "from kilocard.base.quiet import quiet_library_warnings; quiet_library_warnings()\n"
    "import torch, warnings\n"
    "from torch.profiler import profile\n"
    "with profile(): torch.ones(3) + 1\n"
    "import torch.distributed.checkpoint.planner_helpers as m\n"
    "warnings.warn_explicit('Please use DTensor instead and we are deprecating ShardedTensor.', FutureWarning,\n"
    "                       m.__file__, 1, module=m.__name__)\n"  # as torch warns it on every checkpoint load
)


def test_profiler_lines_and_torch_notes_are_kept_at_debug_level():
    """The torch profiler's ``USDT:`` lines and torch's ShardedTensor note are filtered; ``KILOCARD_DEBUG=1``
    shows both (the filter is what hides them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KINETO_LOG_LEVEL", "KILOCARD_DEBUG")}
    runs = [
        subprocess.run([sys.executable, "-c", PROFILE], capture_output=True, text=True, timeout=300, env=e)
        for e in (env, {**env, "KILOCARD_DEBUG": "1"})
    ]
    quiet, loud = runs
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert loud.returncode == 0 and "USDT:" in loud.stderr and "deprecating ShardedTensor" in loud.stderr, loud.stderr
