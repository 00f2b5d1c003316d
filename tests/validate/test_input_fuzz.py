"""Hypothesis fuzzing of the input surface: composer, validator and batch-script renderer.

* The composer, given override strings made of real field names and arbitrary text, returns a
  config or raises ``ComposeError`` (the one-line error the CLI prints) — never anything else.
* The validator and renderer, given a composed Slurm config with arbitrary values (shell
  metacharacters, control characters, quotes, huge and negative numbers) set on launcher,
  cluster, checkpoint and trainer fields: ``validate`` never raises; a config that every check of
  ``kilocard sbatch`` accepts renders without error, and ``bash -n`` accepts the script.
"""

from __future__ import annotations

import copy
import functools
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from kilocard.base import shell
from kilocard.config.compose import ComposeError, compose, to_run_config
from kilocard.config.secrets import extract_secret_refs
from kilocard.launch.render import render_script
from kilocard.plan import build_plan
from kilocard.validate import validate

NASTY = " \t\n\r;|&$`'\"\\(){}[]<>*?!#~=,:%@/-._+0123456789abcXYZ\x00\x1b"
TEXT = st.text(alphabet=st.sampled_from(list(NASTY)), max_size=24)
TEXT_FIELDS = [
    "launcher.job_name",
    "launcher.run_name",
    "launcher.time",
    "launcher.dependency",
    "cluster.partition",
    "cluster.account",
    "cluster.qos",
    "cluster.mem_per_node",
    "cluster.venv",
    "cluster.container_image",
    "cluster.shared_fs",
    "checkpoint.save",
    "checkpoint.load",
]
INT_FIELDS = [
    "trainer.train_iters",
    "trainer.global_batch_size",
    "trainer.micro_batch_size",
    "cluster.nodes",
    "cluster.gpus_per_node",
    "launcher.signal_lead_s",
    "launcher.max_requeues",
    "launcher.master_port",
    "checkpoint.keep_last",
    "checkpoint.save_interval",
    "parallel.tensor_model_parallel_size",
]
FLOAT_FIELDS = ["optim.lr", "trainer.hang_timeout_s", "model.hidden_dropout", "cluster.fs_write_bandwidth_gbs"]

VALUES = st.one_of(
    st.tuples(st.sampled_from(TEXT_FIELDS), TEXT),
    st.tuples(st.sampled_from(INT_FIELDS), st.integers(-10, 100_000)),
    st.tuples(st.sampled_from(FLOAT_FIELDS), st.floats(-10, 10, allow_nan=False)),
    st.tuples(st.sampled_from(["launcher.env", "cluster.env"]), st.tuples(TEXT, TEXT)),
    st.tuples(st.just("launcher.extra_sbatch"), st.lists(TEXT, max_size=2)),
)

RUN_DIR = Path("/srv/shared/runs/fuzz-run")


@functools.lru_cache(maxsize=1)
def base_cfg():
    """tiny_gpt on two simulated Slurm nodes, composed once (Hydra composition is slow)."""
    return compose(
        [
            "recipe=tiny_gpt",
            "launcher=slurm",
            "cluster.nodes=2",
            "cluster.partition=local",
            "launcher.signal_lead_s=60",
            "launcher.time=00:30:00",
        ]
    )


def apply(cfg, field: str, value) -> bool:
    """Set one field the way a typed config allows; False when the type itself refuses it."""
    try:
        if field.endswith(".env"):
            name, text = value
            node = OmegaConf.select(cfg, field)
            node[name] = text
        else:
            OmegaConf.update(cfg, field, value, merge=False)
    except (OmegaConfBaseException, ValueError, TypeError):
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(VALUES, min_size=1, max_size=4))
def test_validator_and_renderer_never_crash_and_accepted_scripts_parse(changes):
    cfg = copy.deepcopy(base_cfg())
    if not all(apply(cfg, f, v) for f, v in changes):
        event("refused by the typed config")
        return
    run_cfg = to_run_config(cfg)
    report = validate(run_cfg)
    if not report.valid:
        for i in report.errors:
            assert i.field and i.message and i.hint
        event("refused by the validator")
        return
    try:
        script = render_script(run_cfg, build_plan(run_cfg), RUN_DIR)
    except shell.ShellValueError as e:
        pytest.fail(f"the validator accepted {changes!r} but the renderer refuses it: {e}")
    event("accepted and rendered")
    res = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, f"{changes!r}: bash -n: {res.stderr}"


OVERRIDE_TEXT = st.text(alphabet=st.sampled_from(list(NASTY.replace("\x00", ""))), max_size=12)


@settings(max_examples=25, deadline=None)
@given(
    overrides=st.lists(
        st.tuples(
            st.sampled_from(
                TEXT_FIELDS + INT_FIELDS + FLOAT_FIELDS + ["recipe", "+launcher.env.X", "trainer", "~cluster.env"]
            ),
            OVERRIDE_TEXT,
        ).map(lambda kv: f"{kv[0]}={kv[1]}"),
        min_size=1,
        max_size=3,
    )
)
def test_composer_returns_a_config_or_a_compose_error(overrides):
    try:
        to_run_config(compose(["recipe=tiny_gpt", *overrides]))
    except ComposeError as e:
        assert str(e).strip() and "Traceback" not in str(e)


SECRET_NAME, SECRET_VALUE = "KC_FUZZ_SECRET", "fuzz-s3cr3t-9f1"
SPACE = st.sampled_from(["", " ", "  "])
QUOTED_NAME = st.sampled_from([SECRET_NAME, f"'{SECRET_NAME}'", f'"{SECRET_NAME}"'])
RESOLVER = st.builds(
    lambda s1, name, s2, default: f"${{oc.env:{s1}{name}{s2}{default}}}",
    SPACE,
    QUOTED_NAME,
    SPACE,
    st.sampled_from(["", ",x", ", null"]),
)
SPELLING = st.one_of(
    RESOLVER,
    RESOLVER.map(lambda r: f"${{oc.decode:{r}}}"),
    st.tuples(st.sampled_from(["", "pre", "/a/"]), RESOLVER, st.sampled_from(["", "-post", "/b"])).map("".join),
)
SECRET_FIELDS = [
    f"launcher.env.{SECRET_NAME}",
    "launcher.env.OTHER",
    f"cluster.env.{SECRET_NAME}",
    "launcher.job_name",
    "launcher.run_name",
    "checkpoint.save",
    "cluster.venv",
    "data.tokenizer",
]


@settings(max_examples=150, deadline=None)
@given(field=st.sampled_from(SECRET_FIELDS), text=SPELLING)
def test_no_resolver_spelling_lets_the_environment_reach_the_config(field, text):
    """Whatever the spelling: refused (ComposeError naming the field), or the resolved config lacks the value."""
    cfg = copy.deepcopy(base_cfg())
    OmegaConf.update(cfg, field, text, merge=False, force_add=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_NAME, SECRET_VALUE)
        try:
            extract_secret_refs(cfg)
        except ComposeError as e:
            assert e.field == field, (e.field, field)
            event("refused")
            return
        event("became a secret name")
        resolved = OmegaConf.to_yaml(OmegaConf.to_container(cfg, resolve=True))
    assert SECRET_VALUE not in resolved, (field, text)
