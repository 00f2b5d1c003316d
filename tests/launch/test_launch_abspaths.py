"""The frozen config holds absolute paths, resolved against the cwd of the command that wrote the run dir."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from kilocard.config.compose import compose
from kilocard.launch.rundir import create_run_dir
from kilocard.paths import data_dir
from kilocard.rundir.freeze import CONFIG_FILE


def _frozen(run_dir: Path):
    return OmegaConf.load(run_dir / CONFIG_FILE)


def test_relative_paths_are_frozen_absolute_against_the_cwd(tmp_path, monkeypatch):
    """checkpoint.save/load, the cache, shared_fs and venv: relative and ``~`` values become absolute."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    overrides = [
        "recipe=tiny_gpt",
        "checkpoint.save=ckrel",
        "checkpoint.load=../old/ck",
        "data.path_to_cache=cache/idx",
        "cluster.shared_fs=runs",
        "cluster.venv='~/venv'",
    ]
    run_dir = create_run_dir(compose(overrides), overrides)
    frozen = _frozen(tmp_path / run_dir)
    assert frozen.checkpoint.save == str(tmp_path / "ckrel")
    assert frozen.checkpoint.load == str(tmp_path.parent / "old" / "ck")
    assert frozen.data.path_to_cache == str(tmp_path / "cache" / "idx")
    assert frozen.cluster.shared_fs == str(tmp_path / "runs")
    assert frozen.cluster.venv == str(tmp_path / "home" / "venv")
    assert run_dir.parent == tmp_path / "runs", "under the one runs root (kilocard.launch.rundir.runs_root)"


def test_data_prefixes_follow_the_trainers_lookup_cwd_then_shipped_root(tmp_path, monkeypatch):
    """A prefix under the cwd wins; else the shipped one; weights stay numbers; unset fields stay unset."""
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "mine" / "corpus_text_document"
    local.parent.mkdir()
    for ext in (".bin", ".idx"):
        Path(f"{local}{ext}").write_bytes(b"")
    shipped = "data/tiny_corpus/tiny_corpus_text_document"
    overrides = [
        "recipe=tiny_gpt",
        "data=tiny_corpus",
        f"data.data_path=[0.3,mine/corpus_text_document,0.7,{shipped}]",
        "cluster.shared_fs=runs",
    ]
    frozen = _frozen(tmp_path / create_run_dir(compose(overrides), overrides))
    root = data_dir("conf").parent
    assert list(frozen.data.data_path) == ["0.3", str(local), "0.7", str(root / shipped)]
    assert frozen.checkpoint.save is None and frozen.data.tokenizer == "kilocard-bytes"
