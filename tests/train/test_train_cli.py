"""``kilocard run``: the README demo end to end, and an invalid config that starts nothing."""

from __future__ import annotations

import json

from kilocard import exitcodes
from kilocard.commands import exits


def test_readme_demo_trains_and_summarises(kilocard_run):
    code, out, run_dir = kilocard_run("recipe=tiny_gpt")
    assert code == exitcodes.DONE, out[-3000:]
    lines = out.splitlines()
    assert lines[0] == f"run dir: {run_dir.relative_to(kilocard_run.workdir)}"
    assert any(l.startswith("step 20/20 | loss ") and "TFLOP/s/gpu" in l and "MFU" in l for l in lines)
    table = out[out.index("summary") :]
    for row in (
        "exit                       0 DONE",
        "last committed step        20",
        "TFLOP/s per GPU (median)",
        "megatron_current FLOPs",
        "MFU (median)",
        "of cpu fp32 dense 0.05 TFLOP/s",
        "peak memory (rank 0)",
    ):
        assert row in table, table
    recs = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(recs) == 20 and recs[-1]["loss"] < recs[0]["loss"]


def test_invalid_config_starts_nothing(kilocard_run):
    """An invalid config exits 1 like ``validate`` and ``sbatch`` (one exit-code policy), starting nothing."""
    code, out, run_dir = kilocard_run("recipe=tiny_gpt", "parallel.tensor_model_parallel_size=3", "--nproc", "2")
    assert code == exits.INVALID
    assert run_dir is None and "nothing was started" in out and "tensor_model_parallel_size" in out
    assert not (kilocard_run.workdir / "runs").exists() or not any((kilocard_run.workdir / "runs").iterdir())
