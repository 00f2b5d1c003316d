"""Tokenizer by name (``data.tokenizer`` / ``--tokenizer``): the built-in ``kilocard-bytes`` or a BPE file."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kilocard.data.bpe import BpeTokenizer
from kilocard.data.byte_tokenizer import BYTES_TOKENIZER, ByteTokenizer
from kilocard.data.errors import DataError
from kilocard.data.paths import find_file

if TYPE_CHECKING:
    from megatron.core.tokenizers import MegatronTokenizerBase

TOKENIZERS = {BYTES_TOKENIZER: ByteTokenizer}
"""Built-in tokenizer name (``data.tokenizer`` / ``--tokenizer``) -> class; a file path loads a BPE."""


def get_tokenizer(name: str) -> MegatronTokenizerBase:
    """The tokenizer ``name``: a built-in (``kilocard-bytes``) or a ``kilocard-bpe`` JSON file.

    A relative file path is looked up in the current directory, then under kilocard's shipped root.
    Anything else raises ``DataError`` listing the choices.
    """
    if name in TOKENIZERS:
        return TOKENIZERS[name]()
    path = find_file(name)
    if path is None:
        known = ", ".join(sorted(TOKENIZERS))
        raise DataError(
            f"data.tokenizer: unknown tokenizer {name!r}; fix: use {known} or the path of a kilocard-bpe JSON file"
        )
    return BpeTokenizer.load(path)
