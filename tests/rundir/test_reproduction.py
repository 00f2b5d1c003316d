"""The reproduction report: steady-state steps, one FLOPs convention, measured / predicted / published."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bad_files import SECRET, finishes, make
from kilocard.commands import main
from kilocard.config.compose import compose, to_run_config
from kilocard.perf.flops import flops_per_iteration
from kilocard.perf.predict import predict
from kilocard.rundir.freeze import write_frozen
from kilocard.rundir.reproduction import NotSteady, excluded_steps, reproduction


@pytest.fixture(scope="module")
def tiny():
    return to_run_config(compose(["recipe=tiny_gpt"]))


@pytest.fixture(scope="module")
def sc21():
    return to_run_config(compose(["recipe=sc21_1_7b"]))


def _records(n: int, tflops=lambda s: 1.0 + s / 100) -> list[dict]:
    return [{"step": s, "step_time_s": 0.5, "tflops_per_gpu": tflops(s), "loss": 5.0} for s in range(1, n + 1)]


def test_warm_up_after_every_launch_checkpoints_and_last_step_are_left_out(tiny):
    cfg = dataclasses.replace(
        tiny,
        checkpoint=dataclasses.replace(tiny.checkpoint, save_interval=5, non_persistent_save_interval=None),
        trainer=dataclasses.replace(tiny.trainer, train_iters=12),
    )
    out = excluded_steps(cfg, range(1, 13), resumed_at=[0, 7])
    assert out == {
        1: "warm-up",
        2: "warm-up",
        5: "checkpoint",
        8: "warm-up",
        9: "warm-up",
        10: "checkpoint",
        12: "checkpoint",
    }


def test_measured_is_the_median_of_steady_steps_and_eval_records_are_not_steps(tiny):
    cfg = dataclasses.replace(tiny, checkpoint=dataclasses.replace(tiny.checkpoint, save_interval=None))
    recs = _records(cfg.trainer.train_iters)
    recs.insert(5, {"step": 5, "split": "valid", "loss": 4.0})
    rep = reproduction(cfg, recs)
    steady = [r for r in recs if "split" not in r and r["step"] not in (1, 2, cfg.trainer.train_iters)]
    assert rep.steps_used == [r["step"] for r in steady]
    assert rep.measured.tflops_per_gpu == pytest.approx(sorted(r["tflops_per_gpu"] for r in steady)[len(steady) // 2])
    pred = predict(cfg, rep.convention)
    assert rep.predicted is not None and rep.predicted.tflops_per_gpu == pytest.approx(pred.tflops_per_gpu)
    assert rep.ratio(rep.predicted) == pytest.approx(rep.measured.tflops_per_gpu / pred.tflops_per_gpu)
    assert rep.published is None and rep.to_json()["published"] is None
    assert set(rep.breakdown_s) == set(pred.breakdown)


def test_published_figure_and_measured_share_the_recipes_flops_convention(sc21):
    """SC21's rows count FLOPs their own way: the measured figure (recorded in the run's convention) is
    converted, so measured / published compares like with like."""
    recs = _records(10, tflops=lambda s: 100.0)
    rep = reproduction(sc21, recs)
    scale = flops_per_iteration(sc21, "megatron_sc21") / flops_per_iteration(sc21, "megatron_current")
    assert rep.convention == "megatron_sc21" and scale != pytest.approx(1.0)
    assert rep.measured.tflops_per_gpu == pytest.approx(100.0 * scale)
    assert rep.published is not None and rep.published.tflops_per_gpu == 137.0 and rep.published.mfu == 0.44
    assert rep.ratio(rep.published) == pytest.approx(100.0 * scale / 137.0)
    assert rep.to_json()["baseline_id"] == "sc21-1.7b"


def test_a_run_without_steady_state_says_how_many_steps_it_had(tiny):
    with pytest.raises(NotSteady, match=r"2 steady-state step\(s\) of 4 recorded"):
        reproduction(tiny, _records(4), resumed_at=[0])


def test_report_verb_on_a_run_directory(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    composed = compose(["recipe=sc21_1_7b"])
    write_frozen(composed, run)
    sc21_cfg = to_run_config(composed)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(10)))
    png = tmp_path / "r.png"
    assert main(["report", str(run), "--format", "json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"measured", "predicted", "published", "convention", "steps_used"}
    assert out["published"]["tflops_per_gpu"] == sc21_cfg.recipe.baseline_tflops_per_gpu
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["report", str(run)]) == 0
    text = capsys.readouterr().out
    assert "published (sc21-1.7b)" in text and "left out: warm-up 1, 2" in text and "predicted by component" in text


def test_report_verb_refuses_what_is_not_a_finished_run(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_run_that_never_reached_steady_state_is_not_a_site_row(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    write_frozen(compose(["recipe=tiny_gpt"]), run)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(3)))
    site = tmp_path / "site.yaml"
    assert main(["baselines", "--site", str(site), "--add", str(run)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("kilocard baselines: error: --add:") and "did not reach steady state" in err
    assert len(err.splitlines()) == 1 and not site.exists()
    assert main(["baselines", "--add", str(run)]) == 2  # --add needs --site


@pytest.mark.parametrize("kind", ["fifo", "dir", "latin1", "netrc"])
def test_a_site_file_that_is_no_regular_yaml_is_one_line_and_left_alone(kind, tmp_path, capsys):
    """``baselines --site FIFO --add RUN_DIR`` with a finished run: the site file is read by the one safe
    reader (a FIFO used to block ``yaml.safe_load`` forever), refused in one line (exit 2), never echoed,
    never replaced."""
    run = tmp_path / "run"
    run.mkdir()
    write_frozen(compose(["recipe=tiny_gpt"]), run)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(10)))
    site = make(kind, tmp_path / "site.yaml")
    before = site.lstat()
    out = finishes(lambda: main(["baselines", "--site", str(site), "--add", str(run)]), seconds=60)
    assert out.get("value") == 2, out
    err = capsys.readouterr().err
    assert err.startswith(f"kilocard baselines: error: --site: {site}") and len(err.strip().splitlines()) == 1, err
    assert SECRET not in err
    assert (site.lstat().st_ino, site.lstat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert not list(tmp_path.glob(".site.yaml.tmp-*"))
