"""Published rows: the loader's checks, the policy for unstated facts, excluded rows, and the shipped file."""

from __future__ import annotations

import pytest

from kilocard.calibration.baselines import (
    compare_all,
    error_stats,
    flops_per_token,
    load_rows,
    published,
    row_run_config,
)
from kilocard.calibration.unstated import DEFAULTS, recompute_of_modules
from kilocard.cli import main
from kilocard.perf.flops import flops_per_iteration

TINY = (
    "{id: %s, gpu: h100-sxm5-80gb, gpus: 8, precision: bf16,"
    " model: {layers: 4, hidden: 512, heads: 8, kv_heads: null, ffn: 2048, gated_mlp: false, vocab: 1024, seq: 1024},"
    " parallel: {tp: 1, pp: 2, cp: 1, ep: 1, dp: 4}, batch: {gbs: 64}, flops_convention: six_n%s}"
)


def rows_file(tmp_path, *rows: str):
    f = tmp_path / "rows.yaml"
    f.write_text("rows:\n" + "".join(f"  - {r}\n" for r in rows))
    return str(f)


def tiny(row_id: str, extra: str) -> str:
    return TINY % (row_id, extra)


def test_row_without_source_is_rejected_in_one_line(tmp_path, capsys):
    f = rows_file(tmp_path, tiny("nosrc", ", recompute: none, batch: {gbs: 64, mbs: 1}, result: {mfu: 0.4}"))
    with pytest.raises(ValueError, match=r"row nosrc of rows.yaml has no 'source'"):
        load_rows(f)
    assert main(["baselines", "--file", f]) == 2
    err = capsys.readouterr().err
    assert "nosrc" in err and "source" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unstated_facts_are_filled_by_the_policy_and_the_row_is_scored(tmp_path):
    f = rows_file(
        tmp_path,
        tiny("filled", ", unstated: [batch.mbs, recompute, parallel.vp], result: {mfu: 0.4}, source: s1"),
        tiny(
            "stated",
            ", recompute: none, batch: {gbs: 64, mbs: 1}, parallel: {tp: 1, pp: 2, vp: null, cp: 1,"
            " ep: 1, dp: 4}, result: {mfu: 0.4}, source: s2",
        ),
    )
    filled, stated = load_rows(f)
    assert filled.complete and filled.filled == {"batch.mbs": 1, "recompute": "none", "parallel.vp": None}
    assert filled.raw["batch"]["mbs"] == DEFAULTS["batch.mbs"] and filled.raw["recompute"] == DEFAULTS["recompute"]
    assert stated.filled == {}
    # The filled row predicts exactly what the row stating the policy's values predicts.
    a, b = compare_all(f, recipes={})
    assert a.rel_error is not None and a.rel_error == pytest.approx(b.rel_error, rel=1e-12)


def test_without_the_policy_an_unstated_fact_leaves_the_row_unscored(tmp_path):
    f = rows_file(tmp_path, tiny("gap", ", recompute: none, result: {mfu: 0.4}, source: s"))
    (row,) = load_rows(f)
    assert not row.complete and row.missing == ["batch.mbs"]
    assert compare_all(f, recipes={})[0].rel_error is None


def test_recipe_value_for_an_unstated_fact_needs_its_citation(tmp_path):
    bad = tiny(
        "uncited", ", recompute: full, unstated: [recompute], batch: {gbs: 64, mbs: 1}, result: {mfu: 0.4}, source: s"
    )
    with pytest.raises(ValueError, match=r"uncited.*unstated field recompute has the value 'full' but no filled_from"):
        load_rows(rows_file(tmp_path, bad))
    cited = bad.replace("source: s", "filled_from: 'recipe x.py', source: s")
    (row,) = load_rows(rows_file(tmp_path, cited))
    assert row.complete and row.raw["recompute"] == "full" and row.filled == {}


def test_interleaving_stated_without_depth_is_not_filled_as_not_interleaved(tmp_path):
    # The source states an interleaved schedule but not its depth: the not-interleaved default would
    # contradict it, so the depth stays missing (listed, not scored) unless a cited value fills it.
    marked = tiny(
        "interleaved",
        ", recompute: none, unstated: [parallel.vp], batch: {gbs: 64, mbs: 1},"
        " parallel: {tp: 1, pp: 2, vp: interleaved, cp: 1, ep: 1, dp: 4}, result: {mfu: 0.4}, source: s",
    )
    (row,) = load_rows(rows_file(tmp_path, marked))
    assert not row.complete and row.missing == ["parallel.vp"] and row.filled == {}
    cited = marked.replace("vp: interleaved", "vp: 2").replace("source: s", "filled_from: 'recipe y.py', source: s")
    (row,) = load_rows(rows_file(tmp_path, cited))
    assert row.complete and row.raw["parallel"]["vp"] == 2


def test_unknown_unstated_field_is_rejected(tmp_path):
    f = rows_file(tmp_path, tiny("typo", ", unstated: [batch.msb], recompute: none, result: {mfu: 0.4}, source: s"))
    with pytest.raises(ValueError, match=r"typo.*unstated: \['batch.msb'\] must be a list of field names"):
        load_rows(f)


def test_recompute_modules_map_as_megatron_core_runs_them():
    # Megatron-Core reruns `mlp` only in layers that are not MoE layers (TransformerLayer: recompute_mlp
    # only when not is_moe_layer), so on an MoE model it leaves the attention core and the experts alone.
    assert recompute_of_modules(["mla_up_proj", "mlp"], moe=True) == "none"
    assert recompute_of_modules(["mlp"], moe=True) == "none"
    assert recompute_of_modules(["mlp"], moe=False) == "selective"
    assert recompute_of_modules(["core_attn"], moe=True) == "selective"
    assert recompute_of_modules(["moe"], moe=True) == "selective"
    assert recompute_of_modules(["layernorm", "moe_act"], moe=True) == "none"
    with pytest.raises(ValueError, match=r"\['attn'\] are not Megatron-Core module names"):
        recompute_of_modules(["attn"], moe=False)


def test_recompute_contradicting_its_recompute_modules_is_rejected_in_one_line(tmp_path, capsys):
    moe = TINY.replace("seq: 1024}", "seq: 1024, experts: 8, topk: 2, moe_ffn: 512, dense_layers: 1}")
    f = rows_file(
        tmp_path,
        moe
        % (
            "mlpmoe",
            ", recompute: selective, recompute_modules: [mla_up_proj, mlp], batch: {gbs: 64, mbs: 1},"
            " result: {mfu: 0.4}, source: s",
        ),
    )
    with pytest.raises(ValueError, match=r"row mlpmoe of rows.yaml: recompute: 'selective' .* write recompute: none"):
        load_rows(f)
    assert main(["baselines", "--file", f]) == 2
    err = capsys.readouterr().err
    assert "mlpmoe" in err and "recompute_modules" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_shipped_recompute_matches_the_recipes_recompute_modules(shipped):
    # Every shipped row with a recipe's recompute_modules runs the recompute Megatron-Core gives it (the
    # 26.04.01 DeepSeek-V3 rows' [mlp] / [mla_up_proj, mlp] reach only the 3 dense layers: none).
    with_modules = [r for r in shipped if r.raw.get("recompute_modules") is not None]
    assert len(with_modules) >= 8
    for r in with_modules:
        moe = bool(r.raw["model"].get("experts"))
        assert r.raw["recompute"] == recompute_of_modules(r.raw["recompute_modules"], moe), r.id


def test_excluded_rows_are_listed_with_their_reason_and_kept_out_of_scoring(tmp_path):
    f = rows_file(
        tmp_path,
        tiny("kept", ", recompute: none, batch: {gbs: 64, mbs: 1}, result: {mfu: 0.4}, source: s1"),
        tiny("out", ", recompute: none, batch: {gbs: 64, mbs: 1}, result: {mfu: 0.9}, excluded: 'odd GPU', source: s2"),
    )
    kept, out = load_rows(f)
    assert kept.complete and not out.complete and out.excluded == "odd GPU"
    comps = compare_all(f, recipes={})
    assert comps[1].rel_error is None and comps[1].note == "odd GPU"
    assert error_stats(comps)["rows_included"] == 1
    assert error_stats(comps)["mean_abs_rel_error"] == pytest.approx(abs(comps[0].rel_error))


def test_tokens_per_second_rows_are_scored_in_their_own_convention(tmp_path):
    f = rows_file(
        tmp_path,
        tiny("tok", ", recompute: none, batch: {gbs: 64, mbs: 1}, result: {tokens_per_s_per_gpu: 100000}, source: s"),
    )
    (row,) = load_rows(f)
    tf, mfu, peak = published(row)
    # six_n written out: 6·N·T + 12·L·H·Q·s·T, N without the input embedding (4 layers of 12·h² + the output layer).
    h, layers, vocab, seq = 512, 4, 1024, 1024
    n = layers * 12 * h * h + vocab * h
    per_token = 6 * n + 12 * layers * h * seq
    assert flops_per_token(row_run_config(row), "six_n") == pytest.approx(per_token, rel=0.01)
    assert tf == pytest.approx(1.0e5 * per_token / 1e12, rel=0.01) and mfu == pytest.approx(tf / peak)
    assert compare_all(f, recipes={})[0].rel_error is not None


@pytest.fixture(scope="module")
def shipped():
    return load_rows()


def test_shipped_rows_reach_the_issue_16_spread(shipped):
    """>= 40 scored rows over H100/H200/B200/GB200, BF16 and FP8, dense and MoE, two or more scaling series."""
    scored = [r for r in shipped if r.complete]
    assert len(scored) >= 40
    assert {"h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72"} <= {r.raw["gpu"] for r in scored}
    assert {"bf16", "fp8"} <= {r.raw["precision"] for r in scored}
    assert any(r.raw["model"].get("experts") for r in scored) and any(not r.raw["model"].get("experts") for r in scored)
    series: dict[str, set[int]] = {}
    for r in scored:
        if r.series:
            series.setdefault(r.series, set()).add(int(r.raw["gpus"]))
    assert sum(len(gpus) >= 2 for gpus in series.values()) >= 2


def test_shipped_layouts_multiply_to_the_gpu_count(shipped):
    bad = [
        r.id
        for r in shipped
        if r.complete and (p := r.raw["parallel"])["tp"] * p["pp"] * (p.get("cp") or 1) * p["dp"] != r.raw["gpus"]
    ]
    assert not bad


def test_shipped_model_shapes_reproduce_the_published_flops_per_token(shipped):
    """Where a row publishes both TFLOP/s and tokens/s, their ratio is the FLOPs per token of the source's
    count: kilocard's count of the row's shape in the row's convention must agree (a transcription check)."""
    off = {}
    for r in shipped:
        res = r.raw.get("result") or {}
        if r.complete and res.get("tflops_per_gpu") and res.get("tokens_per_s_per_gpu"):
            ratio = res["tflops_per_gpu"] * 1e12 / res["tokens_per_s_per_gpu"]
            mine = flops_per_token(row_run_config(r), r.raw["flops_convention"])
            if abs(ratio / mine - 1) > 0.03:
                off[r.id] = round(ratio / mine, 3)
    assert not off


def test_non_numeric_published_figure_is_rejected(tmp_path):
    f = rows_file(
        tmp_path,
        tiny("str", ", recompute: none, batch: {gbs: 64, mbs: 1}, result: {tokens_per_s_per_gpu: 1e5}, source: s"),
    )
    with pytest.raises(ValueError, match=r"str.*result.tokens_per_s_per_gpu = '1e5' is not a number"):
        load_rows(f)


def test_step_time_rows_are_scored_in_their_own_convention(tmp_path):
    """A source that publishes only the iteration time: TFLOP/s per GPU is the convention's FLOPs per
    iteration over that time and the GPU count."""
    f = rows_file(
        tmp_path,
        tiny("step", ", recompute: none, batch: {gbs: 64, mbs: 1}, result: {step_time_s: 2.0}, source: s"),
    )
    (row,) = load_rows(f)
    assert row.complete
    tf, mfu, peak = published(row)
    # six_n written out per token (as above) times the 64 × 1024 tokens of the step, over 2 s and 8 GPUs.
    h, layers, vocab, seq = 512, 4, 1024, 1024
    per_token = 6 * (layers * 12 * h * h + vocab * h) + 12 * layers * h * seq
    assert tf == pytest.approx(per_token * 64 * seq / (2.0 * 8) / 1e12, rel=0.01) and mfu == pytest.approx(tf / peak)
    assert compare_all(f, recipes={})[0].rel_error is not None


def test_software_override_reaches_the_precision_config(tmp_path):
    f = rows_file(
        tmp_path,
        tiny(
            "sw",
            ", recompute: none, batch: {gbs: 64, mbs: 1}, software: {grad_reduce_in_fp32: false,"
            " hidden_dropout: 0.1, overlap_grad_reduce: false}, result: {mfu: 0.4}, source: s",
        ),
    )
    cfg = row_run_config(load_rows(f)[0])
    assert cfg.precision.grad_reduce_in_fp32 is False and cfg.precision.bf16
    assert cfg.model.hidden_dropout == 0.1 and cfg.parallel.overlap_grad_reduce is False


def test_shipped_step_times_reproduce_the_published_mfu(shipped):
    """Where a row publishes both MFU (in its own convention) and the step time, MFU × peak × time × GPUs is
    the source's FLOPs per iteration: kilocard's count of the row's shape in the row's convention must agree
    (Korthikanti et al.'s Appendix A eq. 7 is megatron_legacy for a GPT with a 4h MLP)."""
    off, checked = {}, 0
    for r in shipped:
        res = r.raw.get("result") or {}
        if r.complete and res.get("mfu") and res.get("step_time_s"):
            _, mfu, peak = published(r)
            theirs = mfu * peak * 1e12 * res["step_time_s"] * r.raw["gpus"]
            mine = flops_per_iteration(row_run_config(r), r.raw["flops_convention"])
            checked += 1
            if abs(theirs / mine - 1) > 0.03:
                off[r.id] = round(theirs / mine, 3)
    assert checked >= 5 and not off
