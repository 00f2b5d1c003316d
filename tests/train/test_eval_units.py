"""Evaluation without training anything: the split arithmetic (against Megatron-Core's own), the validator's
split rules, the metrics readers, the summary, goodput and the step-time model's forward-only pass."""

from __future__ import annotations

import json

import pytest

from kilocard.data.errors import DataError
from kilocard.data.split import (
    eval_count,
    split_bounds,
    split_documents,
    split_weights,
    valid_samples,
    valid_start,
)
from kilocard.layout import compute_layout
from kilocard.rundir.metrics import MetricsWriter, read_evals, read_metrics, scalars
from kilocard.rundir.names import METRICS_FILE
from kilocard.rundir.progress import summary_table
from kilocard.validate import evaluation, validate
from run_configs import cfg_of


# --- data.split arithmetic --------------------------------------------------------------------------------
@pytest.mark.integration  # compares with Megatron-Core's own split functions
@pytest.mark.parametrize("split", ["969,30,1", "98,2,0", "1", "90,10", "1/1/1", "0,1,0", "7,0,3"])
def test_split_bounds_are_megatron_cores(split):
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    weights = split_weights(split)
    assert weights == pytest.approx(parse_and_normalize_split(split))
    theirs = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    for mine, ref in zip(split_bounds(weights), theirs, strict=True):
        assert (mine is None) == (ref is None)
        if mine is not None:
            assert mine == pytest.approx(ref)


def test_split_documents_rounds_like_megatron():
    w = split_weights("969,30,1")
    assert split_documents(w, 1000) == [969, 30, 1]
    assert split_documents(w, 20) == [19, 1, 0]  # a 0.6-document valid share rounds up, the test share to 0
    assert split_documents(w, 10) == [10, 0, 0]  # 9.69 rounds to 10: nothing left for validation
    assert split_documents(split_weights("98,2,0"), 100) == [98, 2, 0]
    assert sum(split_documents(w, 12345)) == 12345


@pytest.mark.parametrize("bad", ["", "a,b", "1,2,3,4", "-1,2,3", "0,0,0", "nan,1,1"])
def test_malformed_split_is_one_line_naming_the_field(bad):
    with pytest.raises(DataError) as e:
        split_weights(bad)
    assert str(e.value).startswith("data.split: ") and "fix: " in str(e.value) and "\n" not in str(e.value)


def test_each_evaluation_reads_the_next_validation_batches():
    # eval every 5 steps, 2 rounds of 8 samples: step 5 reads 0..15, step 10 reads 16..31, the end (12) 32..47
    assert [valid_start(s, 5, 2, 8) for s in (5, 10, 12)] == [0, 16, 32]
    assert eval_count(12, 5) == 3 and valid_samples(12, 5, 2, 8) == 48
    assert valid_start(10, 5, 2, 8) + 16 <= valid_samples(10, 5, 2, 8)  # the last periodic one fits too


# --- validator rules -------------------------------------------------------------------------------------
def _codes(rule, values):
    cfg = cfg_of(values)
    return [i.code for i in rule(cfg, compute_layout(cfg))]


def test_eval_split_empty_is_refused_naming_data_split():
    bad = {"trainer.eval_interval": 10, "data.split": "99,0,1"}
    assert _codes(evaluation.rule_eval_split, bad) == ["EVAL_SPLIT_EMPTY"]
    assert _codes(evaluation.rule_eval_split, {**bad, "data.split": "99,1,0"}) == []
    assert _codes(evaluation.rule_eval_split, {**bad, "trainer.eval_interval": None}) == []
    (issue,) = [i for i in validate(cfg_of(bad)).issues if i.code == "EVAL_SPLIT_EMPTY"]
    assert issue.field == "data.split" and "trainer.eval_interval=null" in issue.hint


def test_split_form_and_skip_train_rules():
    assert _codes(evaluation.rule_split_form, {"data.split": "1,x"}) == ["DATA_SPLIT"]
    assert _codes(evaluation.rule_split_form, {"data.split": "0,1,0"}) == ["DATA_SPLIT"]
    assert _codes(evaluation.rule_split_form, {"data.split": "0,1,0", "trainer.skip_train": True}) == []
    assert _codes(evaluation.rule_skip_train_evaluates, {"trainer.skip_train": True}) == ["SKIP_TRAIN_NO_EVAL"]
    ok = {"trainer.skip_train": True, "trainer.eval_interval": 1}
    assert _codes(evaluation.rule_skip_train_evaluates, ok) == []


def test_eval_numbers_have_floors():
    found = {i.field for i in validate(cfg_of({"trainer.eval_interval": 0, "trainer.eval_iters": 0})).issues}
    assert {"trainer.eval_interval", "trainer.eval_iters"} <= found


# --- metrics.jsonl readers -------------------------------------------------------------------------------
def _step(n, t=100.0):
    return {
        "step": n,
        "time": t + n,
        "loss": 5.0 - n / 10,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "step_time_s": 1.0,
        "consumed_samples": 8 * n,
        "tokens_per_s_per_gpu": 1.0,
        "tflops_per_gpu": 1.0,
        "mfu": None,
        "peak_mem_bytes": 2**20,
        "train_iters": 4,
    }


def _eval(n, split="valid", loss=4.0, t=100.0):
    return {"step": n, "split": split, "loss": loss, "time": t + n + 0.5, "eval_time_s": 0.5, "eval_iters": 2}


def _write(run_dir, recs):
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_readers_keep_eval_records_apart_from_steps(tmp_path):
    _write(tmp_path, [_step(1), _step(2), _eval(2), _step(3), _step(4), _eval(4, loss=3.5), _eval(4, "test", 3.6)])
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert [(r["step"], r["split"]) for r in read_evals(tmp_path)] == [(2, "valid"), (4, "valid"), (4, "test")]
    assert [r["loss"] for r in read_evals(tmp_path, "test")] == [3.6]
    table = summary_table(
        read_metrics(tmp_path), tmp_path, 0, ckpt_root=tmp_path / "checkpoints", evals=read_evals(tmp_path)
    )
    assert "steps                      1..4 of 4" in table
    assert "validation loss (last)     3.5000 at step 4" in table and "test loss                  3.6000" in table


def test_resume_drops_the_eval_records_after_the_resumed_step(tmp_path):
    _write(tmp_path, [_step(1), _step(2), _eval(2), _step(3), _step(4), _eval(4)])
    w = MetricsWriter(tmp_path, tensorboard=False, resume_step=2)
    w.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert [r["step"] for r in read_evals(tmp_path)] == [2]
    assert w.superseded is not None and w.superseded["step"] == 4 and "split" not in w.superseded


def test_eval_scalars_are_named_by_split():
    assert scalars(_eval(2)) == {"valid/loss": 4.0, "valid/eval_time_s": 0.5, "valid/eval_iters": 2.0}
    assert "train/loss" in scalars(_step(1))


def test_goodput_counts_eval_time_apart_from_steps(tmp_path):
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir
    from kilocard.rundir import events
    from kilocard.rundir.goodput_report import report

    run_dir = create_run_dir(compose(["recipe=tiny_gpt"]), ["recipe=tiny_gpt"], root=tmp_path / "runs")
    events.append(run_dir, "start", when=100.0, world_size=1)
    _write(run_dir, [_step(1), _step(2), _eval(2), _step(3), _step(4), _eval(4), _eval(4, "test")])
    r = report(run_dir)
    assert r.steps == 4 and r.productive_s == 4.0
    assert r.evals == 3 and r.eval_s == pytest.approx(1.5) and r.to_json()["eval_s"] == pytest.approx(1.5)
    assert r.eval_share == pytest.approx(1.5 / 5.5)


# --- the step-time model ---------------------------------------------------------------------------------
def _llama8b(**trainer):
    """Llama 3 8B's shape at TP2 x PP2 on 8 H100s (compose is not needed for the step-time model)."""
    import dataclasses

    from kilocard.config.compose import compose, to_run_config

    cfg = to_run_config(compose(["recipe=llama3_8b", "cluster=h100_dgx", "cluster.nodes=1"]))
    t = dataclasses.replace(cfg.trainer, global_batch_size=64, micro_batch_size=1, **trainer)
    p = dataclasses.replace(
        cfg.parallel, tensor_model_parallel_size=2, pipeline_model_parallel_size=2, context_parallel_size=1
    )
    return dataclasses.replace(cfg, trainer=t, parallel=p)


def test_eval_time_is_forward_only_micro_batches_every_eval_interval():
    from kilocard.perf.goodput import predicted_step_s
    from kilocard.perf.predict import predict

    base = predict(_llama8b())
    assert base.eval_time_s == 0 and base.eval_s_per_step == 0
    cfg = _llama8b(eval_interval=100, eval_iters=10)
    p = predict(cfg)
    one_round = p.eval_time_s / 10
    # a forward is about a third of forward + backward, and there is no gradient reduce or optimizer step
    assert 0.2 * base.step_time_s < one_round < 0.5 * base.step_time_s
    assert p.eval_s_per_step == pytest.approx(p.eval_time_s / 100)
    assert p.step_time_s == base.step_time_s  # a training step is unchanged
    assert predicted_step_s(cfg) == pytest.approx(p.step_time_s + p.eval_s_per_step)


def test_skip_train_without_a_checkpoint_and_evaluations_too_big_to_index_are_refused():
    """``trainer.skip_train`` without ``checkpoint.load`` evaluated the random initialisation and exited 0;
    ``trainer.eval_iters`` large enough that the evaluations' samples overflow the dataset index died with a
    MemoryError in the ranks."""
    skip = {"trainer.skip_train": True, "trainer.eval_interval": 1}
    assert _codes(evaluation.rule_skip_train_loads, skip) == ["SKIP_TRAIN_NO_LOAD"]
    assert _codes(evaluation.rule_skip_train_loads, {**skip, "checkpoint.load": "runs/a/checkpoints"}) == []
    (issue,) = [i for i in validate(cfg_of(skip)).errors if i.code == "SKIP_TRAIN_NO_LOAD"]
    assert issue.field == "checkpoint.load" and "randomly initialised" in issue.message
    big = {"trainer.eval_interval": 1, "trainer.eval_iters": 10**6, "trainer.global_batch_size": 2**20}
    assert _codes(evaluation.rule_eval_samples, big) == ["EVAL_SAMPLES"]
    assert _codes(evaluation.rule_eval_samples, {**big, "trainer.eval_interval": None}) == []
    assert [i.code for i in validate(cfg_of({"trainer.eval_iters": 10**9})).errors] == ["OUT_OF_RANGE"]
