"""A missing data prefix is refused before launch (issue 12, item 13): ``check_paths`` and the verbs that call it."""

from __future__ import annotations

import pytest

from kilocard.cli import main
from kilocard.validate.paths import check_paths
from run_configs import cfg_of

SHIPPED = "data/tiny_corpus/tiny_corpus_text_document"  # relative: found under kilocard's shipped root


def indexed(data_path):
    return cfg_of({"data.type": "indexed", "data.data_path": data_path})


@pytest.fixture
def prefixes(tmp_path):
    """``full`` has .bin and .idx; ``half`` only .bin; ``gone`` nothing."""
    (tmp_path / "full.bin").write_bytes(b"")
    (tmp_path / "full.idx").write_bytes(b"")
    (tmp_path / "half.bin").write_bytes(b"")
    return {name: str(tmp_path / name) for name in ("full", "half", "gone")}


def test_existing_prefixes_pass(prefixes):
    assert check_paths(indexed([prefixes["full"]])) == []
    assert check_paths(indexed([SHIPPED])) == []
    assert check_paths(indexed(["0.3", prefixes["full"], "0.7", SHIPPED])) == []


def test_mock_data_reads_no_file():
    assert check_paths(cfg_of({"data.type": "mock", "data.data_path": ["/nowhere/x"]})) == []


def test_every_missing_prefix_is_named_by_its_place(prefixes):
    issues = check_paths(indexed([prefixes["full"], prefixes["half"], prefixes["gone"]]))
    assert [(i.code, i.field, i.value) for i in issues] == [
        ("DATA_PATH", "data.data_path[1]", prefixes["half"]),
        ("DATA_PATH", "data.data_path[2]", prefixes["gone"]),
    ]
    assert "kilocard preprocess" in issues[0].hint and ".bin/.idx" in issues[0].message


def test_weighted_blend_names_the_prefix_not_the_weight(prefixes):
    issues = check_paths(indexed(["0.5", prefixes["full"], "0.5", prefixes["gone"]]))
    assert [i.field for i in issues] == ["data.data_path[3]"]


def test_malformed_blend_is_one_issue():
    issues = check_paths(indexed(["0.5", SHIPPED, "0.5"]))
    assert [(i.code, i.field) for i in issues] == [("DATA_PATH", "data.data_path")]
    assert "odd number" in issues[0].message


@pytest.mark.parametrize("verb", [["validate"], ["sbatch"], ["run"]])
def test_verbs_refuse_a_missing_prefix_before_writing(verb, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    rc = main(
        [*verb, "recipe=tiny_gpt", "data=tiny_corpus", "data.data_path=[missing/prefix]", f"cluster.shared_fs={runs}"]
    )
    err = capsys.readouterr()
    text = err.out + err.err
    assert rc not in (0, None) and "data.data_path[0]" in text and "Traceback" not in text, text
    assert not runs.exists() or list(runs.iterdir()) == []
