"""The model error `kilocard plan` states: the held-out error of the published rows most like the run,
each row predicted by its own source's stored fold fit (a fit that never saw that source)."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from kilocard.calibration.baselines import baselines_file, load_rows
from kilocard.calibration.crossval import FoldFit, folds_file, load_fold_fits, source_group
from kilocard.calibration.fit import targets
from kilocard.calibration.trust import (
    MIN_ROWS,
    band,
    by_kind,
    by_kind_lines,
    error_band,
    model_error,
    run_traits,
    scale_class,
    stored_held_out,
    traits,
)
from kilocard.cli import main
from kilocard.config.compose import compose, to_run_config

FIX = "scripts/fit_perf_model.py --folds"


@pytest.fixture(scope="module")
def shipped():
    rows = load_rows()
    return targets(rows), load_fold_fits(baselines_file())


def test_every_scored_row_gets_its_own_sources_held_out_error(shipped):
    """The shipped fold fits cover every scored row, and none was trained on the rows it predicts."""
    scored, folds = shipped
    held = stored_held_out(scored, folds)
    assert {t.row.id for t, _ in held} == {t.row.id for t in scored} and len(scored) >= 40
    for t, _ in held:
        assert t.row.id not in folds[source_group(t.row)].trained_on


def test_a_fold_trained_on_its_own_rows_is_not_used(shipped):
    """A stale fold fit (one that saw the rows it would predict) gives no held-out error: those rows drop."""
    scored, folds = shipped
    group = source_group(scored[0].row)
    own = {t.row.id for t in scored if source_group(t.row) == group}
    stale = {**folds, group: FoldFit(folds[group].trained_on | own, folds[group].values)}
    ids = {t.row.id for t, _ in stored_held_out(scored, stale)}
    assert ids == {t.row.id for t in scored} - own


def test_band_widens_until_enough_rows_share_the_traits():
    """Width goes first, then the GPU family; dense/MoE is kept to the last (MoE rows are the far-off ones)."""
    errors = [(("hopper", "MoE", "8-bit"), 0.10, "a", 64)] * 3 + [(("hopper", "MoE", "16-bit"), -0.02, "b", 64)] * 4
    errors += [(("ampere", "dense", "16-bit"), 0.01, s, 8) for s in "cdefg"]
    errors += [(("blackwell", "MoE", "8-bit"), 0.3, "h", 512)]
    exact = band(("ampere", "dense", "16-bit"), errors, "f")
    assert (exact.kept, exact.rows, exact.mean_abs) == ((0, 1, 2), MIN_ROWS, pytest.approx(0.01))
    wide = band(("hopper", "MoE", "8-bit"), errors, "f")
    assert (wide.kept, wide.rows, wide.max_abs) == ((0, 1), 7, pytest.approx(0.10))
    assert "from 2 sources like this run (hopper, MoE; fewer than 5 are also 8-bit)" in wide.summary()
    assert "(only 2 sources: the spread is known from few setups)" in wide.summary()
    assert "only" not in exact.summary().split(";")[0] and exact.sources == 5
    # an MoE run on Ampere: no Ampere MoE row, so every MoE row, never Ampere's dense ones
    moe = band(("ampere", "MoE", "16-bit"), errors, "f")
    assert (moe.kept, moe.rows, moe.max_abs) == ((1,), 8, pytest.approx(0.3))
    assert "(MoE; fewer than 5 are also ampere, 16-bit)" in moe.summary()
    none = band(("cpu", "dense", "32-bit"), errors, "f")
    assert (none.kept, none.rows, none.family_rows, none.all_rows) == ((1,), MIN_ROWS, 0, len(errors))
    assert none.summary().startswith(
        "no published row ran on cpu; 5 dense rows from 5 sources on other GPUs: mean 1.0%"
    )
    assert none.to_json()["family_rows"] == 0
    assert band(("hopper", "dense", "16-bit"), [], "f") is None


def test_band_quotes_the_rows_of_the_runs_gpu_count_class():
    """Error grows with scale: a band for a run on N GPUs adds the rows of N's class (up to 128, 129 to
    1,024, more), whatever their traits, and says when fewer than MIN_SOURCES sources stand behind them."""
    assert [scale_class(n) for n in (1, 128, 129, 1024, 1025, 16384)] == [
        "up to 128 GPUs", "up to 128 GPUs", "129 to 1,024 GPUs", "129 to 1,024 GPUs",
        "more than 1,024 GPUs", "more than 1,024 GPUs",
    ]  # fmt: skip
    errors = [(("hopper", "dense", "16-bit"), 0.02, s, 64) for s in "abc"]
    errors += [(("hopper", "dense", "16-bit"), -0.08, "d", 2048), (("ampere", "dense", "16-bit"), 0.12, "e", 3072)]
    small = band(("hopper", "dense", "16-bit"), errors, "f", gpus=96).scale
    assert (small.rows, small.sources, small.max_abs) == (3, 3, pytest.approx(0.02))
    assert "only" not in small.summary()
    large = band(("hopper", "dense", "16-bit"), errors, "f", gpus=6144).scale
    assert (large.scale, large.rows, large.mean_abs, large.max_abs) == (
        "more than 1,024 GPUs",
        2,
        pytest.approx(0.10),
        pytest.approx(0.12),
    )
    assert large.summary().endswith("(only 2 sources: the spread is known from few setups)")
    assert large.to_json()["rows"] == 2
    assert band(("hopper", "dense", "16-bit"), errors, "f", gpus=512).scale is None  # no row at that scale
    assert band(("hopper", "dense", "16-bit"), errors, "f").scale is None  # no GPU count given


def test_a_runs_traits_follow_its_gpu_experts_and_gemm_dtype():
    def of(*overrides):
        return run_traits(to_run_config(compose(list(overrides))))

    assert of("recipe=tiny_gpt") == ("cpu", "dense", "32-bit")
    assert of("recipe=llama3_70b") == ("hopper", "dense", "16-bit")
    assert of("recipe=bridge_llama3_8b_fp8", "cluster.gpu=b200-sxm-180gb") == ("blackwell", "dense", "8-bit")
    assert of("recipe=mixtral_8x7b", "cluster.gpu=a100-sxm4-80gb") == ("ampere", "MoE", "16-bit")


def test_plan_states_the_error_of_rows_like_the_run(shipped, capsys):
    """Llama 3 70B on H100 in bf16: the band is the held-out error of the Hopper dense 16-bit rows."""
    scored, folds = shipped
    errs = [abs(e) for t, e in stored_held_out(scored, folds) if traits(t.inputs) == ("hopper", "dense", "16-bit")]
    assert len(errs) >= MIN_ROWS
    assert main(["plan", "recipe=llama3_70b", "--top", "2", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)["model_error"]
    assert got["traits"] == ["hopper", "dense", "16-bit"] and got["rows"] == len(errs)
    assert got["cv_mean_abs_rel_error"] == pytest.approx(sum(errs) / len(errs))
    assert got["cv_max_abs_rel_error"] == pytest.approx(max(errs)) and got["all_rows"] == len(scored)
    ranked = sorted(errs)
    assert got["cv_q90_abs_rel_error"] == pytest.approx(ranked[math.ceil(0.9 * len(ranked)) - 1])
    assert 1 < got["sources"] < got["rows"]
    assert main(["plan", "recipe=llama3_70b", "--top", "2"]) == 0
    text = capsys.readouterr().out
    mean = sum(errs) / len(errs)
    line = f"  {len(errs)} published rows from {got['sources']} sources like this run (hopper, dense, 16-bit): "
    assert line + f"mean {mean:.1%}, 90% within {got['cv_q90_abs_rel_error']:.1%}" in text


def test_without_stored_fold_fits_the_error_is_unknown_and_a_broken_file_is_one_line(tmp_path):
    bare, broken = tmp_path / "rows.yaml", tmp_path / "broken.yaml"
    for copy in (bare, broken):
        shutil.copy(baselines_file(), copy)
    assert error_band(("hopper", "dense", "16-bit"), str(bare)) is None
    folds_file(broken).write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.folds\.json: not a fold-fits file .*fit_perf_model\.py"):
        error_band(("hopper", "dense", "16-bit"), str(broken))
    cfg = to_run_config(compose(["recipe=llama3_70b"]))
    assert model_error(cfg, str(broken))[0] is None and "not a fold-fits file" in model_error(cfg, str(broken))[1]
    assert model_error(cfg, str(bare)) == (None, f"the baselines have no stored fold fits ({FIX})")


def _stale_copy(tmp_path, name, edit):
    """A copy of the shipped rows with its fold fits edited by ``edit(doc)``."""
    rows = tmp_path / f"{name}.yaml"
    shutil.copy(baselines_file(), rows)
    doc = json.loads(folds_file(baselines_file()).read_text())
    edit(doc)
    folds_file(rows).write_text(json.dumps(doc))
    return str(rows)


@pytest.mark.parametrize(
    "name,edit,message",
    [
        ("missing", lambda d: d["folds"].pop("SC21 Table 1"), "no stored fold fit for source 'SC21 Table 1'"),
        ("renamed", lambda d: d["folds"]["SC21 Table 1"]["values"].update(extra=1.0), "other parameters"),
        (
            "changed",
            lambda d: d["folds"]["SC21 Table 1"]["values"].update({"network.nvlink_efficiency": 0.5}),
            "the model changed since it was fitted",
        ),
    ],
)
def test_fold_fits_of_another_model_or_other_rows_are_refused(tmp_path, name, edit, message):
    """A folds file that does not match the rows or the model is refused by name, never quoted: a source
    without a fit, other parameter names, or values that no longer give their stored training loss."""
    with pytest.raises(ValueError, match=rf"{name}\.folds\.json: .*{re.escape(message)}.*--folds"):
        error_band(("hopper", "dense", "16-bit"), _stale_copy(tmp_path, name, edit))


def test_by_kind_groups_rows_by_their_traits():
    dense, moe = ("hopper", "dense", "8-bit"), ("hopper", "MoE", "8-bit")
    kinds = by_kind([(dense, 0.02, -0.04), (dense, -0.01, None), (moe, 0.10, 0.20)])
    assert [k.traits for k in kinds] == [dense, moe]
    assert (kinds[0].rows, kinds[0].mean_abs, kinds[0].max_abs) == (2, pytest.approx(0.015), pytest.approx(0.02))
    assert (kinds[0].cv_mean_abs, kinds[0].cv_max_abs) == (pytest.approx(0.04), pytest.approx(0.04))
    (line,) = [x for x in by_kind_lines(kinds) if "hopper, MoE, 8-bit" in x]
    assert line.split()[3:] == ["1", "10.0%", "/", "10.0%", "20.0%", "/", "20.0%"]
