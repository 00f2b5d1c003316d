"""Real tokenizers from local files: Hugging Face ``tokenizer.json``, SentencePiece, tiktoken (Llama 3 format).

Each kind is built here (``tokenizer_files``) and used through ``get_tokenizer``: exact round trip,
the ids Megatron-Core's datasets need, ``kilocard preprocess`` end to end (any worker count) read
back by Megatron-Core's ``IndexedDataset``, and one clear error line for each bad file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy
import pytest
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset

from kilocard.cli import main
from kilocard.config.compose import compose, to_run_config
from kilocard.data.errors import DataError
from kilocard.data.iterator import build_train_iterator
from kilocard.data.tiktoken_tokenizer import NUM_SPECIAL_TOKENS
from kilocard.data.tokenizer import get_tokenizer, tokenizer_type
from tokenizer_files import (
    CORPUS_DIR,
    PASSAGES,
    hf_tokenizer_json,
    sentencepiece_model,
    tiktoken_file,
    train_tokenizer_script,
)

pytestmark = pytest.mark.integration  # preprocessing and the iterator: Megatron-Core's indexed dataset and torch

SAMPLE = "Zoë's café,  at 5 o'clock:\n\tÜber-ñ 日本語 the end"
FORGED = "a document that mentions <|endoftext|> and <|end_of_text|> and </s>"
BUILDERS = {
    "HuggingFaceTokenizer": hf_tokenizer_json,
    "SentencePieceTokenizer": sentencepiece_model,
    "TikTokenizer": tiktoken_file,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tokenizer file of each kind, keyed by Megatron-LM's ``--tokenizer-type`` name."""
    return {kind: build(tmp_path_factory.mktemp(kind)) for kind, build in BUILDERS.items()}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_each_kind_is_recognised_and_round_trips_exactly(files: dict[str, Path], kind: str) -> None:
    assert tokenizer_type(files[kind]) == kind
    tok = get_tokenizer(str(files[kind]))
    for text in [SAMPLE, FORGED, *PASSAGES[:5]]:
        ids = tok.tokenize(text)
        assert tok.detokenize(ids + [tok.eod]) == text  # the EOD the preprocessor appends is dropped
        assert max(ids) < tok.vocab_size and tok.eod not in ids  # special-token text is plain text
    assert len(tok.tokenize(PASSAGES[0])) < len(PASSAGES[0].encode())  # merges, not bytes
    assert 0 <= tok.eod < tok.vocab_size and tok.unique_identifiers  # what GPTDataset uses


def test_tiktoken_file_gets_llama3s_special_tokens_after_its_ranks(files: dict[str, Path]) -> None:
    tok = get_tokenizer(str(files["TikTokenizer"]))
    ranks = len(files["TikTokenizer"].read_text().splitlines())
    assert tok.vocab_size == ranks + NUM_SPECIAL_TOKENS  # Llama 3: 128,000 + 256 = 128,256
    assert (tok.vocab["<|begin_of_text|>"], tok.eod, tok.pad) == (ranks, ranks + 1, -1)
    assert tok.tokenize(" the and") == [tok.vocab[" the"], tok.vocab[" and"]]


def test_sentencepiece_goes_through_megatron_cores_tokenizer(files: dict[str, Path]) -> None:
    tok = get_tokenizer(str(files["SentencePieceTokenizer"]))
    assert type(tok).__module__.startswith("megatron.core.tokenizers")
    assert (tok.vocab_size, tok.eod, tok.pad) == (400, 2, -1)  # </s>; no padding piece


def test_hugging_face_eod_comes_from_tokenizer_config_when_present(tmp_path: Path) -> None:
    path = hf_tokenizer_json(tmp_path)
    assert get_tokenizer(str(tmp_path)).path == str(path)  # a model folder means its tokenizer.json
    assert (get_tokenizer(str(path)).eod, get_tokenizer(str(path)).pad) == (0, 1)  # <|endoftext|>, <pad>
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<pad>"}}))
    tok = get_tokenizer(str(path))
    assert (tok.eod, tok.pad) == (1, -1)  # a padding token equal to the EOD is no padding token


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_preprocess_writes_what_indexed_dataset_reads_back_with_any_worker_count(
    files: dict[str, Path], kind: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    texts = PASSAGES * 3  # 3 batches of lines for the workers
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    outputs = []
    for workers in (1, 2):
        prefix = tmp_path / f"w{workers}"
        argv = ["preprocess", "--input", str(src), "--output-prefix", str(prefix), "--tokenizer", str(files[kind])]
        assert main([*argv, "--workers", str(workers)]) == 0
        assert re.search(
            rf"{len(texts)} documents, \d+ tokens .* documents/s with {workers} worker", capsys.readouterr().out
        )
        outputs.append([Path(f"{prefix}_text_document.{ext}").read_bytes() for ext in ("bin", "idx")])
    assert outputs[0] == outputs[1]
    tok = get_tokenizer(str(files[kind]))
    ds = IndexedDataset(str(tmp_path / "w2_text_document"))
    assert len(ds) == len(texts)
    for text, ids in zip(texts, (ds[i] for i in range(len(ds))), strict=True):
        assert int(ids[-1]) == tok.eod and tok.detokenize(ids) == text


def test_bad_worker_count_is_one_line_and_no_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "x"}\n')
    assert main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "o"), "--workers", "0"]) == 2
    assert "--workers: 0 is not a process count" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_bad_line_seen_by_a_worker_names_the_line_and_leaves_no_output(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in PASSAGES * 3) + "{broken\n")
    bad_line = len(PASSAGES) * 3 + 1
    argv = ["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "o"), "--workers", "2"]
    assert main([*argv, "--tokenizer", str(files["HuggingFaceTokenizer"])]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{src}:{bad_line}: not valid JSON" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("garbage.bin", b"\x00\x01 not a tokenizer", "is not a Hugging Face tokenizer.json, a SentencePiece model or"),
        ("tokenizer.json", b'{"version": "1.0", "model": 42}', "is not a Hugging Face tokenizer.json ("),
        ("tokenizer.model", b"IQ== 0\nnot-base64!! x\n", "tokenizer.model:2 is not 'BASE64_TOKEN RANK'"),
        ("tokenizer.model", b"IQ== 0\n", "is not a byte-level BPE file (byte 0x00 has no rank)"),
        ("tokenizer.model", b"\x0a\x05junk", "is not a SentencePiece model"),
    ],
)
def test_bad_tokenizer_file_is_one_data_error(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as err:
        get_tokenizer(str(path))
    text = str(err.value)
    assert text.startswith("data.tokenizer: ") and str(path) in text and message in text
    assert "fix: " in text and "\n" not in text


def test_hugging_face_file_without_an_end_of_document_token_is_refused(tmp_path: Path) -> None:
    spec = json.loads(hf_tokenizer_json(tmp_path).read_text())
    spec["added_tokens"] = []
    spec["model"]["vocab"] = {t: i for t, i in spec["model"]["vocab"].items() if not t.startswith("<")}
    path = tmp_path / "no_eod.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(DataError, match="defines none of <\\|end_of_text\\|>, <\\|endoftext\\|>, </s>"):
        get_tokenizer(str(path))


def test_shipped_tiny_corpus_tokenizer_is_what_its_script_trains() -> None:
    script = train_tokenizer_script()
    retrained = json.loads(script.train(script.texts()).to_str())
    assert retrained == json.loads((CORPUS_DIR / "tokenizer.json").read_text())
    tok = get_tokenizer("data/tiny_corpus/tokenizer.json")  # relative: found under the shipped root
    assert (tok.vocab_size, tok.eod, tok.pad) == (512, 0, 1)


def test_shipped_tokenizer_drives_the_trainers_iterator(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": p}) + "\n" for p in PASSAGES))
    shipped = "data/tiny_corpus/tokenizer.json"
    assert (
        main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "b"), "--tokenizer", shipped]) == 0
    )
    overrides = ["recipe=tiny_gpt", "data=tiny_corpus", f"data.tokenizer={shipped}", "model.seq_length=16"]
    overrides.append(f"data.data_path=[{tmp_path / 'b_text_document'}]")
    cfg = to_run_config(compose([*overrides, "model.vocab_size=512"]))
    batch = next(build_train_iterator(cfg, dp_rank=0, dp_size=1, cache_dir=str(tmp_path / "cache")))
    assert batch["tokens"].shape == (2, 16) and int(batch["tokens"].max()) < 512
    assert torch.equal(batch["labels"][:, :-1], batch["tokens"][:, 1:])
    text = get_tokenizer(shipped).detokenize(numpy.asarray(batch["tokens"][0]))
    assert sum(ch.isalpha() or ch in " .,\n'\"" for ch in text) >= 0.9 * len(text)
    with pytest.raises(DataError, match=re.escape("model.vocab_size: 258 (padded to 384) is smaller than tokenizer")):
        build_train_iterator(to_run_config(compose(overrides)), dp_rank=0, dp_size=1, cache_dir=str(tmp_path / "c"))


def test_iterator_accepts_a_vocabulary_that_padding_covers(tmp_path: Path) -> None:
    """257 pads to 384 >= the 258 byte ids: what the validator accepts, the trainer's iterator accepts."""
    cfg = to_run_config(compose(["recipe=tiny_gpt", "data=tiny_corpus", "model.vocab_size=257"]))
    assert next(build_train_iterator(cfg, dp_rank=0, dp_size=1, cache_dir=str(tmp_path)))["tokens"].shape == (
        2,
        cfg.model.seq_length,
    )
