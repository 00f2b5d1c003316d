"""Each issue is reported once per cause: no (code, field) pair twice, for every launcher rule's bad input."""

from __future__ import annotations

from collections import Counter

import pytest

from kilocard.validate import validate
from run_configs import cfg_of

SLURM = {"launcher.kind": "slurm", "launcher.time": "04:00:00", "launcher.signal_lead_s": 300}

BAD_LAUNCHER_INPUTS = {
    # the two causes that used to be reported twice
    "secret value in secret_env": {"launcher.secret_env": ["sk-live-abc=def"]},
    "malformed time under Slurm": {"launcher.time": "4 hours"},
    "zero time under Slurm": {"launcher.time": "00:00:00"},
    "lead too short for the save": {"checkpoint.expected_save_time_s": 1000.0},
    "lead longer than the time": {"launcher.time": "00:01:00", "launcher.signal_lead_s": 90},
    "job name": {"launcher.job_name": "a b;c"},
    "run name": {"launcher.run_name": "../x"},
    "dependency": {"launcher.dependency": "after ok"},
    "extra sbatch": {"launcher.extra_sbatch": ["--x=$(id)"]},
    "env name": {"launcher.env": {"1BAD": "x"}},
    "env value newline": {"cluster.env": {"X": "a\nb"}},
    "master port": {"launcher.master_port": 70000},
    "max requeues": {"launcher.max_requeues": -1},
    "launcher kind": {"launcher.kind": "mpi"},
}


@pytest.mark.parametrize("case", sorted(BAD_LAUNCHER_INPUTS))
def test_every_cause_is_reported_once(case):
    report = validate(cfg_of({**SLURM, **BAD_LAUNCHER_INPUTS[case]}))
    assert not report.valid, f"{case}: not refused"
    pairs = Counter((i.code, i.field) for i in report.issues)
    assert [p for p, n in pairs.items() if n > 1] == [], case
    fields = Counter(i.field for i in report.errors)
    assert [f for f, n in fields.items() if n > 1] == [], f"{case}: one field, several errors: {report.errors}"


def test_malformed_time_is_launcher_time_only():
    report = validate(cfg_of({**SLURM, "launcher.time": "4 hours"}))
    assert [(i.code, i.field) for i in report.errors] == [("LAUNCHER_TIME", "launcher.time")]


def test_secret_value_is_reported_once_and_hidden():
    report = validate(cfg_of({**SLURM, "launcher.secret_env": ["sk-live-abc=def"]}))
    assert [(i.code, i.field, i.value) for i in report.errors] == [
        ("SECRET_VALUE", "launcher.secret_env[0]", "<hidden>")
    ]
