"""A byte-pair-encoding tokenizer trained on local text and saved as JSON (no download, no extra package).

Ids 0..255 are the UTF-8 bytes, 256 is end-of-document, 257 is padding (as in ``kilocard-bytes``),
and merge ``i`` of the file makes id ``258 + i``. Text is first cut into chunks (an optional space
and a run of word characters, an optional space and a run of punctuation, or a run of whitespace);
merges never cross a chunk, and the chunks concatenate back to the text, so decoding is exact.

Train one and use it (``model.vocab_size`` must cover ``258 + merges``)::

    python -m kilocard.data.bpe --input corpus.jsonl --output tok.json --merges 254
    kilocard preprocess --input corpus.jsonl --output-prefix data/c --tokenizer tok.json
    kilocard run ... data.tokenizer=tok.json data.data_path=[data/c_text_document] model.vocab_size=512
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy

from kilocard.data.byte_tokenizer import ByteTokenizer
from kilocard.data.documents import read_documents
from kilocard.data.errors import DataError

FORMAT = "kilocard-bpe"
CHUNK = re.compile(r" ?\w+| ?[^\w\s]+|\s+")
Pair = tuple[int, int]


def chunks(text: str) -> list[bytes]:
    """The pieces merges stay inside; ``b"".join(chunks(t)) == t.encode()``."""
    return [piece.encode("utf-8") for piece in CHUNK.findall(text)]


def _merge_word(word: tuple[int, ...], pair: Pair, new_id: int) -> tuple[int, ...]:
    out: list[int] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def train_merges(texts: Iterable[str], num_merges: int) -> list[Pair]:
    """Greedy BPE: repeatedly merge the most frequent adjacent pair (ties: the smallest pair)."""
    words: Counter = Counter(tuple(c) for text in texts for c in chunks(text))
    merges: list[Pair] = []
    for step in range(num_merges):
        pairs: Counter = Counter()
        for word, freq in words.items():
            for pair in zip(word, word[1:], strict=False):
                pairs[pair] += freq
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        new_id = ByteTokenizer.NUM_BYTES + 2 + step
        words = Counter({_merge_word(w, best, new_id): f for w, f in words.items()})
        merges.append(best)
    return merges


class BpeTokenizer(ByteTokenizer):
    """BPE over UTF-8 bytes, loaded from a ``kilocard-bpe`` JSON file."""

    def __init__(self, merges: Sequence[Pair], source: str = "") -> None:
        self.merges: list[Pair] = [(int(a), int(b)) for a, b in merges]
        self._rank: dict[Pair, int] = {pair: i for i, pair in enumerate(self.merges)}
        self._bytes: list[bytes] = [bytes([b]) for b in range(self.NUM_BYTES)] + [b"", b""]
        for a, b in self.merges:
            self._bytes.append(self._bytes[a] + self._bytes[b])
        self._cache: dict[bytes, list[int]] = {}
        super().__init__()
        digest = hashlib.sha256(json.dumps(self.merges).encode()).hexdigest()[:16]
        self.unique_identifiers = OrderedDict(
            [
                ("class", type(self).__name__),
                ("source", source),
                ("merges_sha256", digest),
                ("vocab_size", self.vocab_size),
            ]
        )

    @property
    def vocab_size(self) -> int:
        """Bytes + EOD + padding + one id per merge."""
        return self.NUM_BYTES + 2 + len(self.merges)

    def _encode_chunk(self, chunk: bytes) -> list[int]:
        if chunk not in self._cache:
            word: tuple[int, ...] = tuple(chunk)
            while len(word) > 1:
                ranked = [(self._rank[p], p) for p in zip(word, word[1:], strict=False) if p in self._rank]
                if not ranked:
                    break
                rank, pair = min(ranked)
                word = _merge_word(word, pair, self.NUM_BYTES + 2 + rank)
            self._cache[chunk] = list(word)
        return self._cache[chunk]

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` (no EOD; the preprocessor appends it)."""
        return [i for chunk in chunks(text) for i in self._encode_chunk(chunk)]

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; EOD and padding are dropped, broken UTF-8 is replaced."""
        flat = (int(i) for i in numpy.asarray(ids).reshape(-1))
        return b"".join(self._bytes[i] for i in flat if 0 <= i < self.vocab_size).decode("utf-8", errors="replace")

    @property
    def vocab(self) -> dict[str, int]:
        """Token text -> id: ``<0xNN>`` for bytes, the merged bytes (hex) for merges, and the specials."""
        table = super().vocab
        table.update({f"<{self._bytes[i].hex()}>": i for i in range(self.NUM_BYTES + 2, self.vocab_size)})
        return table

    def save(self, path: Path) -> None:
        """Write the ``kilocard-bpe`` JSON file."""
        path.write_text(json.dumps({"format": FORMAT, "version": 1, "merges": self.merges}) + "\n")

    @classmethod
    def load(cls, path: Path) -> BpeTokenizer:
        """Read a ``kilocard-bpe`` JSON file; anything else is a ``DataError`` naming the file."""
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise DataError(
                f"data.tokenizer: cannot read {path} as JSON ({err}); fix: train one with python -m kilocard.data.bpe"
            ) from err
        if not isinstance(spec, dict) or spec.get("format") != FORMAT or not isinstance(spec.get("merges"), list):
            raise DataError(
                f"data.tokenizer: {path} is not a {FORMAT} file; fix: train one with python -m kilocard.data.bpe"
            )
        merges = spec["merges"]
        for i, pair in enumerate(merges):
            limit = cls.NUM_BYTES + 2 + i
            ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) and 0 <= x < limit for x in pair)
            if not ok or cls.EOD_ID in pair or cls.PAD_ID in pair:
                raise DataError(
                    f"data.tokenizer: {path}: merge {i} {pair!r} is not a pair of earlier ids; fix: retrain the file"
                )
        return cls(merges, source=path.name)


def main(argv: Sequence[str] = ()) -> int:
    """``python -m kilocard.data.bpe --input X.jsonl --output tok.json --merges N``."""
    ap = argparse.ArgumentParser(prog="python -m kilocard.data.bpe", description="train a kilocard-bpe tokenizer")
    ap.add_argument("--input", required=True, help="JSONL file, one {'text': ...} per line")
    ap.add_argument("--output", required=True, help="tokenizer JSON to write")
    ap.add_argument("--merges", type=int, default=254, help="merges to learn (vocab = 258 + merges)")
    args = ap.parse_args(list(argv) or None)
    try:
        texts = [text for _, text in read_documents(Path(args.input))]
    except DataError as err:
        print(f"kilocard bpe: error: {err}", file=sys.stderr)
        return 2
    tok = BpeTokenizer(train_merges(texts, args.merges))
    tok.save(Path(args.output))
    print(f"wrote {args.output}: {len(tok.merges)} merges, vocab_size {tok.vocab_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
