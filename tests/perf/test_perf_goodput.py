"""Young/Daly checkpoint interval, expected loss, and the validator rule built on them."""

from __future__ import annotations

import math

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.perf.goodput import goodput, job_goodput, lost_fraction
from kilocard.validate.checkpointing import rule_checkpoint_interval


def test_llama3_rate_gives_its_job_mtbf():
    """419 interruptions in 54 days on 16,384 GPUs: one every 3.09 hours for the whole job."""
    g = goodput(16384, save_time_s=60.0)
    assert g.job_mtbf_s / 3600 == pytest.approx(54 * 24 / 419, rel=1e-9)
    assert g.optimal_interval_s == pytest.approx(math.sqrt(2 * 60.0 * g.job_mtbf_s))


def test_young_daly_interval_minimises_the_loss():
    g = goodput(4096, save_time_s=120.0)
    best = g.lost_fraction
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert g.lost_at(g.optimal_interval_s * factor) > best
    assert lost_fraction(g.optimal_interval_s, 120.0, g.job_mtbf_s, restart_s=600) > best


def test_fewer_gpus_fail_less_often():
    assert goodput(1024, 60).job_mtbf_s == pytest.approx(16 * goodput(16384, 60).job_mtbf_s)
    assert goodput(1024, 60).lost_fraction < goodput(16384, 60).lost_fraction


def test_bad_input_names_the_values():
    with pytest.raises(ValueError, match="num_gpus"):
        goodput(0, 60)


def test_rule_warns_far_from_optimum_and_not_near_it():
    base = ["recipe=llama31_405b", "checkpoint.expected_save_time_s=60"]
    cfg = to_run_config(compose(base + ["checkpoint.save_interval=5000"]))
    issues = list(rule_checkpoint_interval(cfg, None))
    assert [i.code for i in issues] == ["CHECKPOINT_INTERVAL"]
    assert issues[0].field == "checkpoint.save_interval" and "save_interval=" in issues[0].hint
    from kilocard.perf.predict import predict

    good = round(job_goodput(cfg).optimal_interval_s / predict(cfg).step_time_s)
    cfg = to_run_config(compose(base + [f"checkpoint.save_interval={good}"]))
    assert list(rule_checkpoint_interval(cfg, None)) == []


def test_rule_is_silent_on_cpu_ranks():
    assert list(rule_checkpoint_interval(to_run_config(compose(["recipe=tiny_gpt"])), None)) == []
