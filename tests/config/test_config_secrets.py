"""No value of the process environment reaches the disk through any resolver spelling (issue 12, item 5).

``kilocard run`` and ``kilocard sbatch`` refuse every spelling but the canonical secret form before
anything is resolved or written: no run directory, and the value in no file under the test's
directory. The canonical ``launcher.env.NAME='${oc.env:NAME}'`` becomes a name in
``launcher.secret_env`` for both verbs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SHARED_SECRET
from kilocard.cli import main
from kilocard.config.compose import compose
from kilocard.config.explain import ComposeError
from kilocard.config.secrets import extract_secret_refs, interpolation_kinds

VALUE = "s3cr3t-v4lue-h1"
NAME = "KC_H1_SECRET"

SPELLINGS = [
    # override, the field the refusal names
    (f"+launcher.env.{NAME}='${{oc.env: {NAME}}}'", f"launcher.env.{NAME}"),
    (f"+launcher.env.{NAME}=\"${{oc.env:'{NAME}'}}\"", f"launcher.env.{NAME}"),
    (f"+launcher.env.{NAME}='${{oc.env:\"{NAME}\"}}'", f"launcher.env.{NAME}"),
    (f"+launcher.env.{NAME}='pre${{oc.env:{NAME}}}'", f"launcher.env.{NAME}"),
    (f"+cluster.env.{NAME}='${{oc.env: {NAME}}}'", f"cluster.env.{NAME}"),
    (f"+cluster.env.{NAME}='${{oc.decode:${{oc.env:{NAME}}}}}'", f"cluster.env.{NAME}"),
    (f"+launcher.env.OTHER='${{oc.env:{NAME}}}'", "launcher.env.OTHER"),
    (f"launcher.job_name='${{oc.env:{NAME}}}'", "launcher.job_name"),
    (f"launcher.job_name='${{oc.env: {NAME}}}'", "launcher.job_name"),
    (f"launcher.run_name='r${{oc.env:{NAME}}}'", "launcher.run_name"),
    (f"checkpoint.save='/ck/${{oc.env:{NAME},x}}'", "checkpoint.save"),
    (f"cluster.container_mounts=['${{oc.env:{NAME}}}:/x']", "cluster.container_mounts[0]"),
    # escaped: resolves to the text ${oc.env:...}, which the ranks resolved again from the frozen config
    # (and wrote into trainer_state.json)
    (f"model.name=\\${{oc.env:{NAME}}}", "model.name"),
    (f"+launcher.env.OTHER=\\${{oc.env:{NAME}}}", "launcher.env.OTHER"),
    (f"launcher.job_name=x\\${{oc.env:{NAME}}}", "launcher.job_name"),
]


@pytest.mark.parametrize(("override", "field"), SPELLINGS)
def test_every_other_spelling_is_refused_naming_the_field(override, field):
    cfg = compose(["recipe=tiny_gpt", override])
    with pytest.raises(ComposeError) as err:
        extract_secret_refs(cfg)
    assert err.value.field == field and "launcher.secret_env" in str(err.value)


@pytest.mark.parametrize("group", ["launcher", "cluster"])
def test_canonical_form_becomes_a_secret_name(group):
    cfg = compose(["recipe=tiny_gpt", f"+{group}.env.{NAME}='${{oc.env:{NAME}}}'"])
    assert extract_secret_refs(cfg) == [NAME]
    assert NAME not in cfg[group].env and list(cfg.launcher.secret_env) == [NAME]


def test_plain_values_and_node_interpolations_stay():
    cfg = compose(["recipe=tiny_gpt", "+launcher.env.NCCL_DEBUG=INFO", "checkpoint.save=/ck/${recipe.name}"])
    assert extract_secret_refs(cfg) == [] and cfg.checkpoint.save == "/ck/tiny_gpt"


@pytest.mark.parametrize(
    ("text", "kinds"),
    [("plain", set()), ("${a.b}", {"node"}), ("x${oc.env: A}", {"resolver"}), ("${oc.env:A", {"resolver"})],
)
def test_interpolations_are_found_with_omegaconfs_grammar(text, kinds):
    assert interpolation_kinds(text) == kinds


def files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.mark.parametrize("verb", [["run"], ["sbatch"]])
@pytest.mark.parametrize(("override", "field"), SPELLINGS)
def test_run_and_sbatch_write_nothing(verb, override, field, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(NAME, VALUE)
    monkeypatch.chdir(tmp_path)
    rc = main([*verb, "recipe=tiny_gpt", f"cluster.shared_fs={tmp_path}/runs", override])
    out = capsys.readouterr()
    assert rc == 2 and field in out.err and "Traceback" not in out.err, out
    assert not (tmp_path / "runs").exists()
    assert files_holding(tmp_path, VALUE.encode()) == []


@pytest.mark.integration  # sbatch builds the code snapshot's wheel
def test_sbatch_canonical_form_keeps_the_value_off_disk(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(NAME, VALUE)
    rc = main(
        ["sbatch", "recipe=tiny_gpt", f"cluster.shared_fs={tmp_path}", f"+cluster.env.{NAME}='${{oc.env:{NAME}}}'"]
    )
    assert rc == 0, capsys.readouterr().err
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert f"secret_env:\n  - {NAME}" in (run_dir / "config.yaml").read_text()
    assert files_holding(tmp_path, VALUE.encode()) == []


@pytest.mark.slow
def test_run_canonical_form_keeps_the_value_off_disk(finished_tiny_run):
    """``kilocard run`` used to freeze the resolved value into config.yaml; now only the name is written (the
    shared run reads ``SHARED_SECRET`` through ``+launcher.env.NAME='${oc.env:NAME}'``)."""
    name, value = SHARED_SECRET
    run_dir = finished_tiny_run.run_dir
    assert finished_tiny_run.code == 0 and run_dir is not None, finished_tiny_run.out
    assert f"secret_env:\n  - {name}" in (run_dir / "config.yaml").read_text()
    assert files_holding(finished_tiny_run.launcher.workdir, value.encode()) == []


@pytest.mark.integration  # writes a snapshot run directory with sbatch
def test_a_frozen_config_is_never_resolved_again(tmp_path, monkeypatch, capsys):
    """Resolve once, at freeze time: interpolation text in a frozen config.yaml (an old run, an edit with
    its hash redone) is refused where it is loaded, not resolved against the loading rank's environment."""
    import hashlib

    from kilocard.rundir.freeze import CONFIG_FILE, HASH_FILE, FrozenConfigError, load_verified

    monkeypatch.setenv(NAME, VALUE)
    assert main(["sbatch", "recipe=tiny_gpt", f"cluster.shared_fs={tmp_path}"]) == 0, capsys.readouterr().err
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    cfg = run_dir / CONFIG_FILE
    text = cfg.read_text().replace("name: tiny_gpt", f"name: ${{oc.env:{NAME}}}", 1)
    cfg.write_text(text)
    (run_dir / HASH_FILE).write_text(f"{hashlib.sha256(text.encode()).hexdigest()}  {CONFIG_FILE}\n")
    with pytest.raises(FrozenConfigError) as err:
        load_verified(run_dir)
    assert "recipe.name: " in str(err.value) and VALUE not in str(err.value)
