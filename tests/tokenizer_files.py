"""Tokenizer files of each kind, built locally for tests (nothing downloaded).

- ``hf_tokenizer_json``: a byte-level BPE ``tokenizer.json`` trained with Hugging Face ``tokenizers``
  (the shipped tiny-corpus recipe, ``data/tiny_corpus/train_tokenizer.py``, on other text and size);
- ``sentencepiece_model``: a BPE model from SentencePiece's own trainer, with byte fallback;
- ``tiktoken_file``: a tiktoken BPE file (Llama 3's ``tokenizer.model`` format) from a small
  mergeable-ranks dict: the 256 bytes, then ``MERGES`` (each the join of two earlier tokens).
"""

from __future__ import annotations

import base64
import importlib.util
import io
from pathlib import Path
from types import ModuleType

from kilocard.paths import data_dir

CORPUS_DIR = data_dir("conf").parent / "data" / "tiny_corpus"
MERGES = [b"th", b"the", b" the", b"er", b"in", b" a", b"an", b" an", b"nd", b" and", b"ing", b" in", b"ed", b"on"]
PASSAGES = [p.strip() for p in (CORPUS_DIR / "passages.txt").read_text(encoding="utf-8").split("\n\n") if p.strip()]


def train_tokenizer_script() -> ModuleType:
    """``data/tiny_corpus/train_tokenizer.py`` as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("train_tokenizer", CORPUS_DIR / "train_tokenizer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_tokenizer_json(folder: Path, vocab_size: int = 400) -> Path:
    """A ``tokenizer.json`` with ``<|endoftext|>`` (0) and ``<pad>`` (1), trained on the passages."""
    path = folder / "tokenizer.json"
    train_tokenizer_script().train(PASSAGES, vocab_size).save(str(path))
    return path


def sentencepiece_model(folder: Path, vocab_size: int = 400) -> Path:
    """A SentencePiece BPE model (ids: <unk> 0, <s> 1, </s> 2, no padding) trained on the passages."""
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(PASSAGES),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    path = folder / "tokenizer.model"
    path.write_bytes(model.getvalue())
    return path


def tiktoken_file(folder: Path) -> Path:
    """A tiktoken BPE file: ``base64(token) rank`` per line, the 256 bytes first, then ``MERGES``."""
    ranks = {bytes([b]): b for b in range(256)}
    for token in MERGES:
        assert any(token[:i] in ranks and token[i:] in ranks for i in range(1, len(token))), token
        ranks[token] = len(ranks)
    path = folder / "tokenizer.model"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return path
