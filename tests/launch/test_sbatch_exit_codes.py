"""The batch script acts on the trainer's exit codes: its own copies equal ``kilocard.exitcodes``."""

from __future__ import annotations

import re

from kilocard import exitcodes
from kilocard.paths import data_dir


def test_template_exit_codes_are_the_trainers():
    text = (data_dir("slurm") / "train.sbatch.tmpl").read_text()
    found = {name: int(v) for name, v in re.findall(r"\bEXIT_([A-Z]+)=(\d+)", text)}
    assert found == {name: getattr(exitcodes, name) for name in found}
    assert set(found) == {"DONE", "BUSY", "RETRY", "FAULT"}
