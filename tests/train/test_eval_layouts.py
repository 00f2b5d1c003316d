"""Evaluation (``trainer.eval_interval``): one model state has one validation loss, whatever the layout.

One tiny MoE model trains 2 steps on one CPU rank on the shipped tiny corpus (indexed data), evaluating
the validation split at step 2 (its record is the reference) and the test split at the end, and
commits step 2. Each layout then loads that step and only evaluates it (``trainer.skip_train``:
Megatron-LM's ``--skip-train``), reading the same validation samples through its own pipeline
schedule with ``forward_only=True``; no layout is trained. Context parallelism is not among them:
Megatron-Core's local layer spec (the only one CPU ranks can build) has no context-parallel
attention, so CP needs Transformer Engine on GPUs; here a CP run is refused with one line.
"""

from __future__ import annotations

import json

import pytest

from conftest import KilocardRun

pytestmark = pytest.mark.slow

COMMON = [
    "recipe=tiny_moe",
    "data=tiny_corpus",
    "model.make_vocab_size_divisible_by=1",  # the same padded vocabulary under TP1 and TP2
    "trainer.train_iters=2",
    "trainer.eval_interval=2",
    "trainer.eval_iters=2",
]
LAYOUTS = {
    "tp2_sp": ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"],
    "pp2": ["parallel.pipeline_model_parallel_size=2"],
    "pp2_vp2": [
        "parallel.pipeline_model_parallel_size=2",
        "parallel.virtual_pipeline_model_parallel_size=2",
        "parallel.overlap_p2p_comm=true",
    ],
    "ep2_dp2": ["parallel.expert_model_parallel_size=2"],
}
TOLERANCE = 1e-4
"""Largest |validation loss difference| allowed between layouts (float32 summation order)."""


def records(run_dir):
    """Every record of metrics.jsonl, eval records included."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def evals(run_dir, split):
    """The eval records of ``split``."""
    return [r for r in records(run_dir) if r.get("split") == split]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The reference run: (runner, run dir, its output)."""
    runner = KilocardRun(tmp_path_factory.mktemp("eval_ref"))
    code, out, run_dir = runner(*COMMON, "--nproc", "1")
    assert code == 0, out[-3000:]
    return runner, run_dir, out


def test_training_run_records_validation_and_test_apart_from_steps(trained):
    _, run_dir, out = trained
    recs = records(run_dir)
    assert [(r["step"], r.get("split")) for r in recs] == [(1, None), (2, None), (2, "valid"), (2, "test")]
    valid = evals(run_dir, "valid")[0]
    assert valid["eval_iters"] == 2 and valid["eval_time_s"] > 0 and 0 < valid["loss"] < 10
    assert f"validation loss (last)     {valid['loss']:.4f} at step 2" in out
    assert f"step 2 | valid loss {valid['loss']:.4f}" in out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_validation_loss_of_one_model_state_is_the_same_in_every_layout(trained, name):
    runner, ref_dir, _ = trained
    reference = evals(ref_dir, "valid")[0]["loss"]
    code, out, run_dir = runner(
        *COMMON,
        *LAYOUTS[name],
        "trainer.skip_train=true",
        f"checkpoint.load={ref_dir / 'checkpoints'}",
        "--nproc",
        "2",
    )
    assert code == 0, out[-3000:]
    got = evals(run_dir, "valid")
    assert [r["step"] for r in got] == [2]
    assert abs(got[0]["loss"] - reference) < TOLERANCE, f"{name}: {got[0]['loss']} vs {reference}"
    assert [r["step"] for r in evals(run_dir, "test")] == [2]
    assert not [r for r in records(run_dir) if "split" not in r], "skip_train trained a step"


def test_context_parallel_on_cpu_ranks_is_refused_naming_the_field(trained):
    """CP cannot be built here (no Transformer Engine attention): one line naming the field, exit BAD_CONFIG,
    instead of Megatron-Core's AssertionError as a CRASH."""
    runner, ref_dir, _ = trained
    code, out, run_dir = runner(
        *COMMON,
        "parallel.context_parallel_size=2",
        "trainer.skip_train=true",
        f"checkpoint.load={ref_dir / 'checkpoints'}",
        "--nproc",
        "2",
    )
    assert code == 2, out[-3000:]
    assert "error: parallel.context_parallel_size: 2 needs Transformer Engine's attention" in out
    assert "crashed" not in out
