"""The local-file BPE tokenizer: exact round trip, fewer tokens than bytes, and the whole data path with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from kilocard.cli import main
from kilocard.config.compose import compose, to_run_config
from kilocard.data.bpe import BpeTokenizer, chunks, train_merges
from kilocard.data.errors import DataError
from kilocard.data.iterator import build_train_iterator
from kilocard.data.tokenizer import get_tokenizer
from kilocard.paths import data_dir

PASSAGES = (data_dir("conf").parent / "data" / "tiny_corpus" / "passages.txt").read_text().split("\n\n")
SAMPLE = "Zoë's café, at 5 o'clock:  the   river rose!\n\tÜber-ñ 日本語"


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe") / "tok.json"
    BpeTokenizer(train_merges(PASSAGES, 60)).save(path)
    return path


def test_chunks_concatenate_back_to_the_text() -> None:
    assert b"".join(chunks(SAMPLE)) == SAMPLE.encode("utf-8")


def test_round_trip_is_exact_and_shorter_than_bytes(bpe_file: Path) -> None:
    tok = get_tokenizer(str(bpe_file))
    assert isinstance(tok, BpeTokenizer) and tok.vocab_size == 258 + 60
    for text in [SAMPLE, *PASSAGES[:5]]:
        assert tok.detokenize(tok.tokenize(text) + [tok.eod]) == text
    ids = tok.tokenize(PASSAGES[0])
    assert len(ids) < 0.8 * len(PASSAGES[0].encode())
    assert max(ids) < tok.vocab_size and tok.eod not in ids


def test_trained_file_drives_preprocess_and_the_iterator(bpe_file: Path, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": p}) + "\n" for p in PASSAGES))
    assert (
        main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "b"), "--tokenizer", str(bpe_file)])
        == 0
    )
    cfg = to_run_config(
        compose(
            [
                "recipe=tiny_gpt",
                "data=tiny_corpus",
                f"data.tokenizer={bpe_file}",
                f"data.data_path=[{tmp_path / 'b_text_document'}]",
                "model.vocab_size=318",
                "model.seq_length=16",
            ]
        )
    )
    batch = next(build_train_iterator(cfg, dp_rank=0, dp_size=1, cache_dir=str(tmp_path / "cache")))
    assert batch["tokens"].shape == (2, 16) and int(batch["tokens"].max()) < 318
    assert torch.equal(batch["labels"][:, :-1], batch["tokens"][:, 1:])
    with pytest.raises(DataError, match="model.vocab_size: 258 is smaller than tokenizer"):
        build_train_iterator(
            to_run_config(compose(["recipe=tiny_gpt", "data=tiny_corpus", f"data.tokenizer={bpe_file}"])),
            dp_rank=0,
            dp_size=1,
            cache_dir=str(tmp_path / "cache"),
        )


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "cannot read"),
        ('{"format": "other"}', "is not a kilocard-bpe file"),
        ('{"format": "kilocard-bpe", "merges": [[1, 999]]}', "merge 0 [1, 999] is not a pair of earlier ids"),
    ],
)
def test_bad_tokenizer_file_is_one_data_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "tok.json"
    path.write_text(content)
    with pytest.raises(DataError, match=re.escape(message)) as err:
        get_tokenizer(str(path))
    assert str(path) in str(err.value) and "fix:" in str(err.value)
