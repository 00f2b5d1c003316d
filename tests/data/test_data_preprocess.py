"""``kilocard preprocess``: JSONL -> Megatron-Core .bin/.idx, read back with Megatron-Core's IndexedDataset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from kilocard.cli import main
from kilocard.data.byte_tokenizer import ByteTokenizer
from kilocard.data.tokenizer import get_tokenizer
from kilocard.paths import data_dir

pytestmark = pytest.mark.integration  # writes and reads Megatron-Core's indexed dataset

TEXTS = ["The river rose in the night.", "Zoë's café serves crème brûlée — 5 €.", "", "line one\nline two\ttab"]
CORPUS = data_dir("conf").parent / "data" / "tiny_corpus"


def _write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_round_trip_detokenizes_to_the_input_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", [json.dumps({"text": t, "id": i}) for i, t in enumerate(TEXTS)] + ["  "])
    assert main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "out")]) == 0
    assert "4 documents" in capsys.readouterr().out
    ds = IndexedDataset(str(tmp_path / "out_text_document"))
    tok = get_tokenizer("kilocard-bytes")
    assert len(ds) == len(TEXTS)
    for text, ids in zip(TEXTS, (ds[i] for i in range(len(ds))), strict=False):
        assert int(ids[-1]) == tok.eod  # one EOD closes every document
        assert tok.detokenize(ids) == text
        assert int(ids.max()) < tok.vocab_size


def test_byte_tokenizer_matches_what_gpt_dataset_needs() -> None:
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.eod, tok.pad) == (258, 256, 257)
    assert tok.tokenize("A é") == [65, 32, 0xC3, 0xA9]
    assert tok.detokenize([72, 105, tok.eod, tok.pad]) == "Hi"
    assert tok.inv_vocab[tok.eod] == "<eod>" and len(tok.vocab) == tok.vocab_size


def test_shipped_corpus_bin_idx_are_built_from_its_jsonl(tmp_path: Path) -> None:
    """The committed .bin/.idx must be exactly what `kilocard preprocess` makes of the committed JSONL."""
    assert (
        main(["preprocess", "--input", str(CORPUS / "tiny_corpus.jsonl"), "--output-prefix", str(tmp_path / "c")]) == 0
    )
    for ext in ("bin", "idx", "meta.json"):  # the record of what made it too
        built = (tmp_path / f"c_text_document.{ext}").read_bytes()
        assert built == (CORPUS / f"tiny_corpus_text_document.{ext}").read_bytes(), ext
    assert len(IndexedDataset(str(CORPUS / "tiny_corpus_text_document"))) >= 500


@pytest.mark.parametrize(
    "lines, expected",
    [
        (['{"text": "ok"}', '{"text": "unterminated'], ":2: not valid JSON"),
        (['{"text": "ok"}', "", '{"body": "no text key"}'], ':3: no "text" key'),
        (['{"text": 42}'], ':1: "text" is a int, not a string'),
        (['["text"]'], ':1: no "text" key'),
        (["", "   "], "no documents"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_output(
    tmp_path: Path, capsys: pytest.CaptureFixture, lines: list, expected: str
) -> None:
    src = _write_jsonl(tmp_path / "bad.jsonl", lines)
    assert main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(src) in err and expected in err and "fix:" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]  # nothing half-written


def test_missing_input_and_unknown_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nope.jsonl"
    assert main(["preprocess", "--input", str(missing), "--output-prefix", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err
    src = _write_jsonl(tmp_path / "in.jsonl", ['{"text": "x"}'])
    assert main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "o"), "--tokenizer", "gpt9"]) == 2
    assert "unknown tokenizer 'gpt9'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_failed_rerun_keeps_the_previous_output(tmp_path: Path) -> None:
    good = _write_jsonl(tmp_path / "good.jsonl", ['{"text": "kept"}'])
    assert main(["preprocess", "--input", str(good), "--output-prefix", str(tmp_path / "o")]) == 0
    bad = _write_jsonl(tmp_path / "bad.jsonl", ['{"text": "new"}', "not json"])
    assert main(["preprocess", "--input", str(bad), "--output-prefix", str(tmp_path / "o")]) == 2
    ds = IndexedDataset(str(tmp_path / "o_text_document"))
    assert len(ds) == 1 and ByteTokenizer().detokenize(ds[0]) == "kept"
