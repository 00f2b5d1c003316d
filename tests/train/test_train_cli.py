"""``kilocard run``: the README demo end to end, and an invalid config that starts nothing."""

from __future__ import annotations

import json

import pytest

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
    repro = out[out.index("reproduction (kilocard report") :]
    assert "measured (median)" in repro and "predicted" in repro and "left out: warm-up 1, 2" in repro, repro


def test_report_of_a_finished_local_run(kilocard_run, capsys):
    """``kilocard report`` on a real run: the JSON keys a user scripts against, the medians from its records."""
    from kilocard.calibration.baselines import load_rows, row_run_config
    from kilocard.commands import main
    from kilocard.perf.predict import predict
    from kilocard.rundir.freeze import load_verified

    code, out, run_dir = kilocard_run("recipe=tiny_gpt", "trainer.train_iters=8", "checkpoint.save_interval=4")
    assert code == exitcodes.DONE, out[-3000:]
    assert main(["report", str(run_dir), "--format", "json", "--plot", str(run_dir / "r.png")]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["steps_used"] == [3, 5, 6, 7] and rep["excluded"] == {
        "1": "warm-up",
        "2": "warm-up",
        "4": "checkpoint",
        "8": "checkpoint",
    }
    recs = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    med = sorted(recs[s]["tflops_per_gpu"] for s in rep["steps_used"])
    assert rep["measured"]["tflops_per_gpu"] == (med[1] + med[2]) / 2
    assert (
        rep["predicted"]["tflops_per_gpu"] > 0 and rep["published"] is None and rep["convention"] == "megatron_current"
    )
    assert (run_dir / "r.png").stat().st_size > 10_000
    # the run as a site calibration row: the published format, its provenance, the config the run predicted
    site = kilocard_run.workdir / "site.yaml"
    assert main(["baselines", "--site", str(site), "--add", str(run_dir)]) == 0
    (row,) = load_rows(str(site))
    assert row.complete and row.raw["result"]["tflops_per_gpu"] == rep["measured"]["tflops_per_gpu"]
    cfg, sha = load_verified(run_dir)
    prov = row.raw["provenance"]
    assert prov["config_sha256"] == sha and prov["cpu_ranks"] is True and prov["run_dir"] == str(run_dir.resolve())
    assert predict(row_run_config(row)).step_time_s == pytest.approx(predict(cfg).step_time_s, rel=1e-12)
    assert main(["baselines", "--site", str(site), "--add", str(run_dir)]) == 2  # a run is added once
    assert "already holds this run as row" in capsys.readouterr().err


def test_invalid_config_starts_nothing(kilocard_run):
    """An invalid config exits 1 like ``validate`` and ``sbatch`` (one exit-code policy), starting nothing."""
    code, out, run_dir = kilocard_run("recipe=tiny_gpt", "parallel.tensor_model_parallel_size=3", "--nproc", "2")
    assert code == exits.INVALID
    assert run_dir is None and "nothing was started" in out and "tensor_model_parallel_size" in out
    assert not (kilocard_run.workdir / "runs").exists() or not any((kilocard_run.workdir / "runs").iterdir())
