"""``TikTokenizer``: a tiktoken BPE file as Llama 3 ships it (``original/tokenizer.model``), read with tiktoken.

Each line of the file is a base64 token and its rank; the ranks are the ids. Llama 3 adds 256
special tokens after them (``<|begin_of_text|>``, ``<|end_of_text|>``, ..., reserved ones), so its
128,000 ranks make the 128,256-id vocabulary, and it cuts text with its own regular expression
before merging. A document ends with ``<|end_of_text|>``; there is no padding token (-1,
Megatron-Core's "none"). Special-token text inside a document is encoded as plain text, as Meta's
reference tokenizer does by default, so a document cannot forge an end of document.

Megatron-Core's ``TikTokenTokenizer`` does not serve here: it reads another file format (a JSON list
of ranks) and puts its 1000 special tokens first, which would shift every Llama 3 id.
``tiktoken`` is an optional dependency (``pip install 'kilocard[tokenizers]'``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from pathlib import Path

import numpy

from kilocard.base.safe_read import open_regular
from kilocard.data.errors import DataError
from kilocard.data.file_tokenizer import FileTokenizer

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NUM_SPECIAL_TOKENS = 256
_NAMED = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
]
SPECIAL_TOKENS = _NAMED + [f"<|reserved_special_token_{2 + i}|>" for i in range(NUM_SPECIAL_TOKENS - len(_NAMED))]
"""Llama 3.1's special tokens, in id order after the ranks."""
EOD_TOKEN = "<|end_of_text|>"
NO_PAD = -1


def read_ranks(path: Path) -> dict[bytes, int]:
    """Token bytes -> rank from a tiktoken BPE file; every one of the 256 bytes must have a rank."""
    ranks: dict[bytes, int] = {}
    with open_regular(path) as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except (ValueError, binascii.Error) as err:
                raise DataError(
                    f"data.tokenizer: {path}:{number} is not 'BASE64_TOKEN RANK'; "
                    f"fix: a tiktoken BPE file such as Llama 3's original/tokenizer.model"
                ) from err
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing or sorted(ranks.values()) != list(range(len(ranks))):
        what = f"byte 0x{missing[0]:02X} has no rank" if missing else "its ranks are not 0..N-1 without gaps"
        raise DataError(f"data.tokenizer: {path} is not a byte-level BPE file ({what}); fix: a complete tiktoken file")
    return ranks


class TikTokenizer(FileTokenizer):
    """Llama 3's tokenizer: tiktoken ranks from the file, Llama 3's 256 special tokens after them."""

    TOKENIZER_TYPE = "TikTokenizer"

    def __init__(self, path: Path) -> None:
        try:
            import tiktoken
        except ImportError as err:
            raise DataError(
                f"data.tokenizer: {path} is a tiktoken BPE file but tiktoken is not installed; "
                f"fix: pip install 'kilocard[tokenizers]'"
            ) from err
        ranks = read_ranks(path)
        self._num_ranks = len(ranks)
        self._specials = {name: self._num_ranks + i for i, name in enumerate(SPECIAL_TOKENS)}
        self._enc = tiktoken.Encoding(
            name=path.name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=self._specials
        )
        super().__init__(path)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text is plain text (the preprocessor appends the EOD)."""
        return self._enc.encode(text, allowed_special=set(), disallowed_special=())

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special tokens (EOD, ...) and ids outside the vocabulary are dropped."""
        flat = [int(i) for i in numpy.asarray(ids).reshape(-1) if 0 <= int(i) < self._num_ranks]
        return self._enc.decode(flat, errors="replace")

    @property
    def vocab(self) -> dict[str, int]:
        """Token text -> id (tokens that are not whole UTF-8 as ``<0x..>`` hex), special tokens included."""
        table = {}
        for i in range(self._num_ranks):
            raw = self._enc.decode_single_token_bytes(i)
            try:
                table[raw.decode("utf-8")] = i
            except UnicodeDecodeError:
                table[f"<0x{raw.hex().upper()}>"] = i
        table.update(self._specials)
        return table

    @property
    def vocab_size(self) -> int:
        """Ranks + 256 special tokens (128,256 for Llama 3)."""
        return self._num_ranks + NUM_SPECIAL_TOKENS

    @property
    def eod(self) -> int:
        """``<|end_of_text|>`` (128001 for Llama 3)."""
        return self._specials[EOD_TOKEN]

    @property
    def pad(self) -> int:
        """No padding token: -1."""
        return NO_PAD
