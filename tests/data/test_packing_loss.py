"""Packed and unpacked conversations give the same loss per token on the tiny Llama (``recipe=tiny_llama_sft``).

The worker ``packing_forward.py`` (one CPU rank; the model as the trainer builds it, the trainer's own forward
step) measures; this test holds the figures to what a user relies on: every assistant target of a packed
conversation has the loss it has alone in its own padded sequence, within float rounding (RoPE turns the
same relative positions by other absolute angles); without ``data.reset_*`` (conversations running on into
each other, what kilocard did before) they do not; and scrambling one conversation of a packed sequence moves
not one loss of the others. (Where the positions restart and what the mask allows: test_data_packing.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.mcore_range]  # builds Megatron-Core's GPTModel on a CPU rank

WORKER = Path(__file__).with_name("packing_forward.py")


def test_packed_and_unpacked_give_the_same_loss_per_token(tmp_path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(out), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["conversations"] >= 6 and r["tokens"] >= 100 and r["restarts"] >= 1, r
    assert r["max_abs_diff"] <= 1e-5, r  # measured 4.8e-7
    assert abs(r["mean_packed"] - r["mean_unpacked"]) <= 1e-6, r
    assert r["control_max_abs_diff"] >= 1e-3, r  # conversations that see each other: measured 0.026
    assert r["others_tokens"] > 0 and r["others_of_sample_moved"] == 0.0, r
    assert r["scrambled_moved"] > 0.01, r  # the scrambled conversation itself did change
