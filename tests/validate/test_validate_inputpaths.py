"""Inputs checked before submit: blend weights pair with prefixes, ``checkpoint.load`` exists, path checks can be off.

The rules run on the typed schema directly; the verbs (``validate``, ``run``, ``sbatch``) run through
``kilocard.cli.main`` with real Hydra composition, the same code path as the console command.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.config.schema import RunConfig
from kilocard.validate.inputpaths import blend_issues, input_path_issues

PREFIX = "data/tiny_corpus/tiny_corpus_text_document"


def config(data_path: list[str] | None = None, load: str | None = None, check_paths: bool = True) -> RunConfig:
    rc = RunConfig()
    if data_path is not None:
        rc.data.type, rc.data.data_path = "indexed", data_path
    rc.checkpoint.load = load
    rc.cluster.check_paths = check_paths
    return rc


def codes(rc: RunConfig, skip: bool = False) -> list[tuple[str, str, str]]:
    return [(i.severity, i.code, i.field) for i in input_path_issues(rc, skip)]


@pytest.mark.parametrize(
    "data_path",
    [
        [PREFIX],
        [PREFIX, "other/prefix"],
        ["0.3", PREFIX, "0.7", "other/prefix"],
        ["0", PREFIX, "1e-3", "other/prefix"],
        ["1", PREFIX],
    ],
)
def test_good_blends_pass(data_path: list[str]) -> None:
    assert blend_issues(config(data_path).data) == []  # the prefixes' files are validate.paths' concern


@pytest.mark.parametrize(
    "data_path, code, words",
    [
        (["0.3", PREFIX, "0.7"], "DATA_BLEND_PAIRS", "3 entries"),
        ([PREFIX, "0.5"], "DATA_BLEND_PAIRS", "mixes prefixes with weights ['0.5']"),
        (["0.5", "0.5", PREFIX, "x"], "DATA_BLEND_PAIRS", "pair ('0.5', '0.5')"),
        (["0.5", PREFIX, "x", "y"], "DATA_BLEND_PAIRS", "pair ('x', 'y')"),
        (["0", PREFIX, "0", "other"], "DATA_BLEND_WEIGHTS", "sum to 0.0, not above 0"),
        (["-1", PREFIX, "2", "other"], "DATA_BLEND_WEIGHTS", "[-1.0] are not finite numbers >= 0"),
        (["nan", PREFIX], "DATA_BLEND_WEIGHTS", "not finite"),
        (["inf", PREFIX, "1", "other"], "DATA_BLEND_WEIGHTS", "not finite"),
    ],
)
def test_bad_blends_are_errors_naming_the_field(data_path: list[str], code: str, words: str) -> None:
    [issue] = input_path_issues(config(data_path))
    assert (issue.severity, issue.code, issue.field, issue.value) == ("error", code, "data.data_path", data_path)
    assert words in issue.message and "[w1,p1,w2,p2]" in issue.hint


def test_blend_of_mock_data_is_not_read() -> None:
    rc = config()
    rc.data.data_path = ["0", "x"]  # data.type=mock: Megatron's MockGPTDataset ignores data_path
    assert codes(rc) == []


def test_missing_checkpoint_load_is_an_error(tmp_path: Path) -> None:
    [issue] = input_path_issues(config(load=str(tmp_path / "absent")))
    assert (issue.severity, issue.code, issue.field) == ("error", "CHECKPOINT_LOAD_MISSING", "checkpoint.load")
    assert f"{tmp_path / 'absent'} does not exist" in issue.message and "--skip-path-checks" in issue.hint
    (tmp_path / "file").write_text("")
    [issue] = input_path_issues(config(load=str(tmp_path / "file")))
    assert "is not a directory" in issue.message


def test_existing_checkpoint_load_passes_relative_to_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert codes(config(load="ckpt")) == []
    assert codes(config(load=str(tmp_path / "ckpt"))) == []


@pytest.mark.parametrize("skip, check_paths, why", [(True, True, "--skip-path-checks"), (False, False, "check_paths")])
def test_path_checks_off_say_so(skip: bool, check_paths: bool, why: str, tmp_path: Path) -> None:
    absent = str(tmp_path / "absent")
    [issue] = input_path_issues(config(load=absent, check_paths=check_paths), skip)
    assert (issue.severity, issue.code) == ("warning", "PATHS_NOT_CHECKED")
    assert why in issue.message and f"checkpoint.load={absent!r}" in issue.message
    # the blend is checked either way: it needs no filesystem
    blend = config(["0", PREFIX], load=absent, check_paths=check_paths)
    assert [i.code for i in input_path_issues(blend, skip)] == ["DATA_BLEND_WEIGHTS", "PATHS_NOT_CHECKED"]


def test_nothing_to_check_says_nothing() -> None:
    assert codes(config(), skip=True) == []


def test_validate_cli_rejects_missing_load_and_skip_flag_allows_it(tmp_path: Path, capsys) -> None:
    absent = tmp_path / "absent"
    assert main(["validate", "recipe=tiny_gpt", f"checkpoint.load={absent}"]) == 1
    out = capsys.readouterr().out
    assert "ERROR CHECKPOINT_LOAD_MISSING: checkpoint.load" in out and str(absent) in out
    skipped = ["validate", "--skip-path-checks", "recipe=tiny_gpt", f"checkpoint.load={absent}", "--format=json"]
    assert main(skipped) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(i["code"], i["value"]) for i in report["issues"]] == [("PATHS_NOT_CHECKED", "--skip-path-checks")]
    assert main(["validate", "recipe=tiny_gpt", f"checkpoint.load={absent}", "cluster.check_paths=false"]) == 0
    assert "WARNING PATHS_NOT_CHECKED: cluster.check_paths" in capsys.readouterr().out


def test_validate_cli_rejects_zero_blend(capsys) -> None:
    assert main(["validate", "data=tiny_corpus", f"data.data_path=[0,{PREFIX}]"]) == 1
    assert "ERROR DATA_BLEND_WEIGHTS: data.data_path" in capsys.readouterr().out


def test_sbatch_writes_nothing_for_a_missing_load(tmp_path: Path, capsys) -> None:
    runs, absent = tmp_path / "runs", tmp_path / "absent"
    args = ["sbatch", "recipe=tiny_gpt", f"cluster.shared_fs={runs}", f"checkpoint.load={absent}"]
    assert main(args) == 1
    assert "ERROR CHECKPOINT_LOAD_MISSING: checkpoint.load" in capsys.readouterr().err
    assert not runs.exists()
    assert main([*args, "--skip-path-checks"]) == 0
    assert "WARNING PATHS_NOT_CHECKED: cluster.check_paths" in capsys.readouterr().err
    assert len(list(runs.iterdir())) == 1


def test_run_starts_nothing_for_a_missing_load(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    assert (
        main(["run", "recipe=tiny_gpt", f"cluster.shared_fs={runs}", f"checkpoint.load={tmp_path / 'no'}"]) == 1
    )  # invalid config
    err = capsys.readouterr().err
    assert "nothing was started" in err and "checkpoint.load" in err and "does not exist" in err
    assert not runs.exists()
