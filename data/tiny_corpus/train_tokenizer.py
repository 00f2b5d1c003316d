"""Train ``tokenizer.json``: a byte-level BPE tokenizer of the tiny corpus, with Hugging Face ``tokenizers``.

512 ids: the two special tokens ``<|endoftext|>`` (0, end of document) and ``<pad>`` (1), the 256
byte symbols, then merges learnt from ``tiny_corpus.jsonl``. Byte-level, so every text round-trips
exactly. Training is deterministic: the shipped file is what this script writes (a test checks it).

    python data/tiny_corpus/train_tokenizer.py             # rewrites data/tiny_corpus/tokenizer.json
    kilocard preprocess --input data/tiny_corpus/tiny_corpus.jsonl --output-prefix /tmp/tiny_bpe \\
        --tokenizer data/tiny_corpus/tokenizer.json
    kilocard run recipe=tiny_gpt data=tiny_corpus data.tokenizer=data/tiny_corpus/tokenizer.json \\
        'data.data_path=[/tmp/tiny_bpe_text_document]' model.vocab_size=512
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = Path(__file__).resolve().parent
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<pad>"]


def texts(corpus: Path = HERE / "tiny_corpus.jsonl") -> list[str]:
    """The ``"text"`` of every line of the corpus."""
    return [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


def train(
    documents: Iterable[str], vocab_size: int = VOCAB_SIZE, special_tokens: list[str] = SPECIAL_TOKENS
) -> Tokenizer:
    """A byte-level BPE ``Tokenizer`` trained on ``documents``, ``special_tokens`` first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(documents, trainer)
    return tok


def main() -> None:
    out = HERE / "tokenizer.json"
    tok = train(texts())
    tok.save(str(out))
    print(f"wrote {out}: {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    main()
