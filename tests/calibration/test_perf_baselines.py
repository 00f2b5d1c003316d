"""`kilocard baselines`: the step-time model reproduces the published throughput rows."""

from __future__ import annotations

import json

import pytest

from kilocard.calibration.baselines import compare_all, error_stats, load_rows, row_inputs, row_run_config
from kilocard.cli import main
from kilocard.perf.efficiency import FITTED, with_values
from kilocard.perf.predict import predict, predict_prepared


@pytest.fixture(scope="module")
def comparisons():
    return compare_all(recipes={})


def test_error_targets_on_rows_with_full_configurations(comparisons):
    """In sample (the shipped fit) over the 100+ scored rows: median |error| within 5%, mean within 6.5%,
    max within 30%, at least 85% of the rows within 12% (now 4.3%, 6.0%, 25.0%, 90 of 105). Issue 16's
    targets (mean 3%, max 12%) are not reached: the rows outside 12% carry effects the model has no term
    for (docs/perf_model.md, Accuracy)."""
    errs = sorted(abs(c.rel_error) for c in comparisons if c.rel_error is not None)
    assert len(errs) >= 100
    assert errs[len(errs) // 2] <= 0.05
    assert sum(errs) / len(errs) <= 0.065
    assert errs[-1] <= 0.30
    assert sum(e <= 0.12 for e in errs) >= 0.85 * len(errs)


def test_unverified_rows_are_listed_but_excluded(comparisons):
    by_id = {c.id: c for c in comparisons}
    assert by_id["megascale-175b"].rel_error is None and "unverified" in by_id["megascale-175b"].note
    assert by_id["nemo-gpt3-175b-fp8"].predicted_tflops_per_gpu is None
    assert by_id["sc21-1t"].rel_error is not None


def test_model_is_sensitive_to_its_parameters():
    """A worse GEMM efficiency must show up as a worse fit: the statistics are computed, not stored."""
    slow = with_values(
        FITTED, {"ampere.gemm_efficiency": 0.5, "hopper.gemm_efficiency": 0.4, "blackwell.gemm_efficiency": 0.4}
    )
    assert error_stats(compare_all(params=slow, recipes={}))["mean_abs_rel_error"] > 0.2


def test_json_format_and_custom_file(tmp_path, capsys):
    f = tmp_path / "rows.yaml"
    f.write_text(
        "rows:\n"
        "  - {id: a100-gpt-small, gpu: a100-sxm4-80gb, gpus: 8, precision: bf16, recompute: none,\n"
        "     model: {layers: 24, hidden: 2048, heads: 16, kv_heads: null, ffn: 8192, gated_mlp: false,\n"
        "             vocab: 50304, seq: 2048},\n"
        "     parallel: {tp: 1, pp: 1, vp: null, cp: 1, ep: 1, dp: 8}, batch: {gbs: 256, mbs: 8},\n"
        "     result: {mfu: 0.5}, flops_convention: six_n, source: test}\n"
        "  - {id: half-known, gpu: h100-sxm5-80gb, gpus: 8, precision: bf16, recompute: unverified,\n"
        "     model: {layers: 2, hidden: 64, heads: 4, ffn: 256, gated_mlp: false, vocab: 128, seq: 32},\n"
        "     parallel: unverified, batch: {gbs: 8, mbs: 1}, result: {tflops_per_gpu: 100}, flops_convention: six_n,\n"
        "     source: test}\n"
    )
    assert main(["baselines", "--file", str(f), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["id"]: r for r in doc["rows"]}
    assert set(rows["a100-gpt-small"]) >= {
        "id",
        "published_tflops_per_gpu",
        "predicted_tflops_per_gpu",
        "published_mfu",
        "predicted_mfu",
        "rel_error",
    }
    assert rows["a100-gpt-small"]["published_tflops_per_gpu"] == pytest.approx(156.0)
    assert rows["a100-gpt-small"]["predicted_tflops_per_gpu"] > 0
    assert rows["half-known"]["rel_error"] is None
    assert doc["mean_abs_rel_error"] == pytest.approx(abs(rows["a100-gpt-small"]["rel_error"]))
    # One source only: nothing to hold out, so no row is cross-validated.
    assert doc["n_scored"] == 0 and rows["a100-gpt-small"]["cv_rel_error"] is None


def test_unreadable_file_is_one_line_error(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("not: [a list of rows]\n")
    assert main(["baselines", "--file", str(f)]) == 2
    err = capsys.readouterr().err
    assert "rows" in err and "Traceback" not in err


def test_broken_yaml_is_one_line_error_naming_where(tmp_path, capsys):
    """A YAML syntax error is one line with the file, its line and the problem (the safe reader's form:
    no snippet of the file)."""
    f = tmp_path / "broken.yaml"
    f.write_text("rows: [\n")
    assert main(["baselines", "--file", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"--file: {f}:2: not valid YAML (did not find expected node content); fix the file" in err


def test_shipped_file_is_the_calibration_set():
    ids = [r.id for r in load_rows()]
    assert "sc21-1.7b" in ids and "bridge-llama31-405b-fp8" in ids


def test_row_software_override_changes_the_prediction(tmp_path):
    """The software rule is a default: a row can state its own (flash attention on an SC21 row)."""
    row = (
        "{id: r, gpu: a100-sxm4-80gb, gpus: 32, precision: fp16, recompute: full,"
        " model: {layers: 24, hidden: 2304, heads: 24, kv_heads: null, ffn: 9216, gated_mlp: false,"
        " vocab: 51200, seq: 2048},"
        " parallel: {tp: 1, pp: 1, vp: null, cp: 1, ep: 1, dp: 32}, batch: {gbs: 512, mbs: 16},"
        " result: {tflops_per_gpu: 137}, flops_convention: megatron_sc21, source: test%s}"
    )
    plain, flash = tmp_path / "plain.yaml", tmp_path / "flash.yaml"
    plain.write_text("rows:\n  - " + row % "" + "\n")
    flash.write_text("rows:\n  - " + row % ", software: {attention_backend: flash, overlap_grad_reduce: true}" + "\n")
    slow = compare_all(str(plain), recipes={})[0].predicted_tflops_per_gpu
    fast = compare_all(str(flash), recipes={})[0].predicted_tflops_per_gpu
    assert fast > slow * 1.05


def test_row_software_sets_precision_fields(tmp_path):
    """A row's ``software:`` may set PrecisionConfig fields too: gradients reduced in bf16
    (``grad_reduce_in_fp32: false``, NeMo's ``grad_sync_dtype: bf16``) halve the data-parallel traffic."""
    row = (
        "{id: r, gpu: h100-sxm5-80gb, gpus: 64, precision: bf16, recompute: none, model: {layers: 32,"
        " hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, gated_mlp: true, vocab: 128256, seq: 8192},"
        " parallel: {tp: 1, pp: 1, vp: null, cp: 1, ep: 1, dp: 64}, batch: {gbs: 64, mbs: 1},"
        " result: {tflops_per_gpu: 400}, flops_convention: megatron_current, source: test%s}"
    )
    fp32, bf16 = tmp_path / "fp32.yaml", tmp_path / "bf16.yaml"
    fp32.write_text("rows:\n  - " + row % "" + "\n")
    bf16.write_text("rows:\n  - " + row % ", software: {grad_reduce_in_fp32: false}" + "\n")
    cfg32, cfg16 = (row_run_config(load_rows(str(f))[0]) for f in (fp32, bf16))
    assert cfg32.precision.grad_reduce_in_fp32 and not cfg16.precision.grad_reduce_in_fp32
    comm32, comm16 = (predict(c).breakdown["dp_comm"] for c in (cfg32, cfg16))
    assert comm16 < comm32


def test_torchtitan_op_recompute_row_is_predicted_with_its_own_policy(tmp_path):
    """``recompute: op`` (torchtitan's op-level checkpointing) is neither none nor Megatron's selective:
    the row's step-time features carry it, and its prediction lies between none and full."""
    row = (
        "{id: r, gpu: h200-sxm-141gb, gpus: 32, precision: bf16, recompute: %s, model: {layers: 32, hidden: 4096,"
        " heads: 32, kv_heads: 8, ffn: 14336, gated_mlp: true, vocab: 128256, seq: 8192},"
        " parallel: {tp: 1, pp: 1, vp: null, cp: 1, ep: 1, dp: 32, fsdp: true}, batch: {gbs: 64, mbs: 2},"
        " result: {tokens_per_s_per_gpu: 10000}, flops_convention: six_n, source: test}"
    )
    tf = {}
    for mode in ("none", "op", "full"):
        f = tmp_path / f"{mode}.yaml"
        f.write_text("rows:\n  - " + row % mode + "\n")
        (r,) = load_rows(str(f))
        assert row_inputs(r, "six_n").features.recompute == mode
        tf[mode] = compare_all(str(f), recipes={})[0].predicted_tflops_per_gpu
    assert tf["full"] < tf["op"] < tf["none"]


def test_llama3_rows_run_the_papers_balanced_interleaved_pipeline():
    """Llama 3 Table 4 rows (arXiv 2407.21783, Section 3.3.2): one layer per model chunk, the embedding and
    the output/loss each in a chunk of their own (Megatron-Core's account_for_embedding/loss_in_pipeline_split),
    VP 8 on PP16; the bubble is the paper's (PP - 1) / (V * M) of the slowest stage's M passes, and that
    stage is an 8-layer middle one, not the 7-layer last stage with the output layer."""
    (row,) = [r for r in load_rows() if r.id == "llama3-405b-16384"]
    cfg = row_run_config(row)
    assert cfg.parallel.virtual_pipeline_model_parallel_size == 8 and cfg.parallel.overlap_p2p_comm
    inputs = row_inputs(row, "six_n")
    assert inputs.layout.stage_layers == [7] + [8] * 14 + [7]
    b = predict_prepared(inputs, FITTED).breakdown
    passes = sum(b[k] for k in ("gemm", "attention", "elementwise", "tp_comm", "cp_comm", "ep_comm", "overhead"))
    m = 2048 // 128
    assert b["logits"] == 0.0
    assert b["bubble"] == pytest.approx((16 - 1) / (8 * m) * passes, rel=1e-9)


def test_local_batch_runs_one_pipeline_schedule_per_local_batch(tmp_path):
    """A row stating NeMo AutoModel's local batch (``batch.lbs``) fills and drains its pipeline once per
    local batch, ``gbs / (dp x lbs)`` times a step (its GA): the bubble grows by that factor; a local
    batch that does not divide the global one is a one-line error naming the field."""
    row = (
        "{id: r, gpu: h100-sxm5-80gb, gpus: 64, precision: bf16, recompute: none, model: {layers: 32,"
        " hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, gated_mlp: true, vocab: 128256, seq: 8192},"
        " parallel: {tp: 1, pp: 4, vp: null, cp: 1, ep: 1, dp: 16}, batch: {gbs: 512, mbs: 1%s},"
        " result: {tflops_per_gpu: 400}, flops_convention: megatron_current, source: test}"
    )
    bubble = {}
    for name, lbs in (("one", ""), ("ga4", ", lbs: 8"), ("bad", ", lbs: 3")):
        f = tmp_path / f"{name}.yaml"
        f.write_text("rows:\n  - " + row % lbs + "\n")
        (r,) = load_rows(str(f))
        if name == "bad":
            with pytest.raises(ValueError, match=r"^--file: row r: batch\.lbs: 3 .*$"):
                row_inputs(r, "megatron_current")
            continue
        inputs = row_inputs(r, "megatron_current")
        bubble[name] = (inputs.features.pipeline_flushes, predict_prepared(inputs).breakdown["bubble"])
    assert bubble["one"][0] == 1 and bubble["ga4"][0] == 512 // (16 * 8)
    assert bubble["ga4"][1] == pytest.approx(4 * bubble["one"][1], rel=1e-12)
