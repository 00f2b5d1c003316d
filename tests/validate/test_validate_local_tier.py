"""The local (node-memory) checkpoint tier's rules: each flags its bad config and passes the fixed one,
and a real Hydra composition of the fields reaches the validator (``kilocard validate``)."""

from __future__ import annotations

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.layout import compute_layout
from kilocard.validate import ERROR, RULES, WARNING, validate
from kilocard.validate import checkpointing as ckr
from run_configs import cfg_of

C = "checkpoint."
ON = {C + "non_persistent_save_interval": 2, C + "save_interval": 10, "trainer.train_iters": 20}

CASES = [
    # rule, bad config, code, severity, the same config fixed
    (ckr.rule_local_interval, {**ON, C + "non_persistent_save_interval": 0}, "OUT_OF_RANGE", ERROR, ON),
    (ckr.rule_local_interval, {**ON, C + "non_persistent_save_interval": -3}, "OUT_OF_RANGE", ERROR, ON),
    (ckr.rule_local_interval, {**ON, C + "non_persistent_save_interval": 20}, "LOCAL_INTERVAL", WARNING, ON),
    (ckr.rule_local_interval, {**ON, C + "non_persistent_save_interval": 15}, "LOCAL_INTERVAL", WARNING, ON),
    (
        ckr.rule_local_interval,
        {**ON, C + "save_interval": 0, C + "non_persistent_save_interval": 20},
        "LOCAL_INTERVAL",
        WARNING,
        {**ON, C + "save_interval": 0, C + "non_persistent_save_interval": 19},
    ),
    (ckr.rule_local_type, {**ON, C + "non_persistent_ckpt_type": "global"}, "NON_PERSISTENT_TYPE", ERROR, ON),
    (ckr.rule_local_dir, {C + "non_persistent_local_ckpt_dir": "scratch/ckpt"}, "LOCAL_CKPT_DIR", ERROR, {}),
    (
        ckr.rule_local_dir,
        {"cluster.shared_fs": "/lustre/runs", C + "non_persistent_local_ckpt_dir": "/lustre/runs/../runs/local"},
        "LOCAL_CKPT_DIR",
        ERROR,
        {"cluster.shared_fs": "/lustre/runs", C + "non_persistent_local_ckpt_dir": "/lustre/runs-local"},
    ),
    (
        ckr.rule_local_dir,
        {C + "save": "/gpfs/ck", C + "non_persistent_local_ckpt_dir": "/gpfs/ck"},
        "LOCAL_CKPT_DIR",
        ERROR,
        {C + "save": "/gpfs/ck", C + "non_persistent_local_ckpt_dir": "/dev/shm/ck"},
    ),
]


def issues(rule, values):
    cfg = cfg_of(values)
    return list(rule(cfg, compute_layout(cfg)))


@pytest.mark.parametrize("rule,bad,code,severity,good", CASES, ids=[f"{c[0].__name__}-{c[2]}" for c in CASES])
def test_rule_flags_the_bad_config_and_passes_the_fixed_one(rule, bad, code, severity, good):
    found = issues(rule, bad)
    assert [(i.code, i.severity) for i in found] == [(code, severity)]
    field = found[0].field
    assert field.startswith(C) and field in found[0].message and found[0].hint
    assert issues(rule, good) == []


def test_every_local_tier_rule_is_covered_and_registered():
    assert set(ckr.RULES) == {c[0] for c in CASES}
    assert set(ckr.RULES) <= set(RULES)


def test_the_tier_off_is_silent_whatever_its_other_fields():
    off = {C + "non_persistent_ckpt_type": "in_memory", C + "non_persistent_save_interval": None}
    assert issues(ckr.rule_local_type, off) == [] and issues(ckr.rule_local_interval, off) == []


def test_composed_fields_reach_the_validator():
    """Megatron-LM's names compose through Hydra and the validator names the bad one."""
    cfg = to_run_config(compose(["recipe=tiny_gpt", "checkpoint.non_persistent_save_interval=0"]))
    [issue] = [i for i in validate(cfg).issues if i.field == "checkpoint.non_persistent_save_interval"]
    assert issue.code == "OUT_OF_RANGE" and issue.value == 0
    ok = to_run_config(
        compose(["recipe=tiny_gpt", "checkpoint.save_interval=10", "checkpoint.non_persistent_save_interval=2"])
    )
    assert not [i for i in validate(ok).issues if i.field.startswith("checkpoint.non_persistent")]
