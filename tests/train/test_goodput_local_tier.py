"""``kilocard goodput`` with the local (node-memory) tier, on hand-written records (a real frozen tiny_gpt
config beside them): local saves count under ``checkpoint_s.local`` only, the Young/Daly prediction uses the
persistent saves, and a fault resumed from a local step says so."""

from __future__ import annotations

import json

import pytest

from kilocard.commands import main
from kilocard.config.compose import compose
from kilocard.rundir import events
from kilocard.rundir.freeze import write_frozen
from kilocard.rundir.goodput_report import report
from kilocard.rundir.names import METRICS_FILE


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with tiny_gpt's frozen config (persistent every 10 steps, local every 2)."""
    cfg = compose(["recipe=tiny_gpt", "checkpoint.save_interval=10", "checkpoint.non_persistent_save_interval=2"])
    write_frozen(cfg, tmp_path)
    evts = [
        {"event": "start", "time": 10.0, "world_size": 2},
        {"event": "resume", "time": 10.5, "step": 0, "tier": None, "superseded_step": None, "superseded_time": None},
        {"event": "commit", "time": 12.6, "step": 2, "seconds": 0.02, "tier": events.LOCAL},
        {"event": "commit", "time": 14.6, "step": 4, "seconds": 0.04, "tier": events.LOCAL},
        {"event": "commit", "time": 16.6, "step": 6, "seconds": 0.03, "tier": events.LOCAL},
        {"event": "exit", "time": 17.8, "code": 76},
        {"event": "start", "time": 20.0, "world_size": 2},
        {
            "event": "resume",
            "time": 24.0,
            "step": 6,
            "tier": events.LOCAL,
            "superseded_step": 7,
            "superseded_time": 17.5,
        },
        {"event": "commit", "time": 30.2, "step": 10, "seconds": 0.5, "tier": events.PERSISTENT},
        {"event": "exit", "time": 31.0, "code": 0},
    ]
    for e in evts:
        events.append(tmp_path, e.pop("event"), when=e.pop("time"), **e)
    steps = [(s, 10.5 + s) for s in range(1, 7)] + [(s, 19.0 + s) for s in range(7, 11)]
    (tmp_path / METRICS_FILE).write_text(
        "".join(json.dumps({"step": s, "time": t, "step_time_s": 1.0}) + "\n" for s, t in steps)
    )
    return tmp_path


def test_local_saves_are_their_own_tier_and_the_fault_resumed_from_local_step_6(run_dir):
    r = report(run_dir)
    assert r.checkpoint_local_s == pytest.approx(0.09) and r.checkpoint_persistent_s == 0.5
    assert r.median_local_save_s == 0.03 and r.median_save_s == 0.5  # Young/Daly: the persistent saves only
    assert r.to_json()["checkpoint_s"] == {"local": pytest.approx(0.09), "persistent": 0.5}
    [f] = r.faults
    assert (f.step, f.kind, f.resumed_step, f.resumed_tier, f.steps_recomputed) == (7, "rank_lost", 6, "local", 1)
    assert f.seconds_lost == pytest.approx(
        25.0 - 16.6
    )  # from the local commit of step 6 to the start of the new step 7
    assert set(f.to_json()) == {
        "step",
        "kind",
        "seconds_to_detect",
        "seconds_to_resume",
        "steps_recomputed",
        "seconds_lost",
    }


def test_text_report_names_the_local_tier(run_dir, capsys):
    assert main(["goodput", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "resumed from local step 6 in" in out and "1 step(s) recomputed" in out
    assert "median save 30 ms" in out
