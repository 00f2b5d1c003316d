"""`kilocard baselines`' scaling-series check: MFU change from the smallest to the largest GPU count."""

from __future__ import annotations

import json

import pytest
import yaml

from kilocard.calibration.baselines import compare_all, load_rows
from kilocard.calibration.series import TOLERANCE, SeriesCheck, series_checks
from kilocard.cli import main
from kilocard.paths import data_dir


@pytest.fixture
def tagged(tmp_path):
    """SC21 Table 1 (a weak-scaling series, 32 -> 3072 GPUs) tagged as a series, and one row of a series
    with a single GPU count (no change to check), as written in the shipped file."""
    doc = yaml.safe_load((data_dir("baselines") / "published.yaml").read_text())
    rows = [r for r in doc["rows"] if r["id"].startswith("sc21-") or r["id"] == "bridge-llama3-8b-fp8"]
    for r in rows:
        r["series"] = "lonely" if r["id"] == "bridge-llama3-8b-fp8" else "sc21-weak"
    f = tmp_path / "series.yaml"
    f.write_text(yaml.safe_dump({"rows": rows}))
    return f


def test_series_change_runs_from_smallest_to_largest_gpu_count(tagged):
    comps = {c.id: c for c in compare_all(str(tagged), recipes={})}
    (check,) = series_checks(load_rows(str(tagged)), list(comps.values()))
    assert check.name == "sc21-weak" and check.gpus == (32, 3072)
    assert check.published_mfu_change == pytest.approx(0.52 - 0.44)
    predicted = comps["sc21-1t"].predicted_mfu - comps["sc21-1.7b"].predicted_mfu
    assert check.predicted_mfu_change == pytest.approx(predicted)
    assert check.ok == (abs(predicted - 0.08) <= TOLERANCE)
    assert check.cv_predicted_mfu_change is None and check.cv_ok is None  # not cross-validated here


def test_ok_is_within_three_mfu_points():
    close = SeriesCheck(
        "s", (8, 64), published_mfu_change=-0.05, predicted_mfu_change=-0.079, cv_predicted_mfu_change=-0.09
    )
    assert close.ok and not close.cv_ok


def test_command_reports_series_in_text_and_json(tagged, capsys):
    assert main(["baselines", "--file", str(tagged), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (entry,) = doc["series"]
    assert set(entry) >= {"name", "published_mfu_change", "predicted_mfu_change", "ok"}
    rows = {r["id"]: r for r in doc["rows"]}
    held = [rows[i]["published_mfu"] * (1 + rows[i]["cv_rel_error"]) for i in ("sc21-1.7b", "sc21-1t")]
    assert entry["cv_predicted_mfu_change"] == pytest.approx(held[1] - held[0])
    assert main(["baselines", "--file", str(tagged)]) == 0
    out = capsys.readouterr().out
    assert "series sc21-weak (32 -> 3072 GPUs): MFU change published +8.0 points" in out
    assert "scaling series (ok: predicted MFU change within 3 points of the published one): " in out
    assert out.count("within 3 points") == 1, "the tolerance is stated once, not after every series"
    assert "lonely" not in out
