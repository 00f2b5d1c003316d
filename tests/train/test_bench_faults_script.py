"""The fault benchmark runs end to end: a real in-job restart after a SIGKILLed rank, its figures printed.

The figures are not asserted beyond their shape and the 60 s bound (timings on shared machines are
noisy; docs/faults.md quotes measured medians): what is tested is that the script still drives a real
``kilocard run`` under ft_launcher, injects the fault and finds the resumed step.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_faults.py"


def test_bench_faults_reports_a_killed_rank_restarted_in_job(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    args = ["--tries", "1", "--faults", "kill", "--modes", "in-job", "--workdir", str(tmp_path / "w")]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    m = re.search(r"kill in-job try 0: detect ([\d.]+)s, resume ([\d.]+)s, (\d+) steps recomputed", r.stdout)
    assert m, r.stdout
    assert float(m[1]) < float(m[2]) < 60
    assert re.search(r"^\| kill \| in-job \| [\d.]+ \| [\d.]+ \| \d+ \| 1 \|$", r.stdout, re.M), r.stdout
