"""``kilocard-bytes``: the built-in UTF-8 byte tokenizer of the tiny recipes (no file, no extra package).

Ids 0..255 are the UTF-8 bytes, 256 is end-of-document and 257 is padding: ``vocab_size`` is 258,
which the padded ``model.vocab_size`` must cover. It implements what Megatron-Core's
``GPTDataset``/``MockGPTDataset`` use from a tokenizer (``vocab_size``, ``eod``, ``pad``,
``unique_identifiers`` for the index-cache hash) and the rest of Megatron-Core's ``MegatronTokenizerBase``.

``TokenizerBase`` is that interface without Megatron-Core: ``megatron.core.tokenizers`` runs the package's
``__init__``, which imports torch and Megatron-Core's optimizer, distributed and inference stacks, and
``kilocard preprocess`` needs none of them. Megatron-Core's datasets only read the attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy

from kilocard.config.schema import BYTES_TOKENIZER
from kilocard.data.errors import DataError


class TokenizerBase(ABC):
    """Megatron-Core's ``MegatronTokenizerBase`` (its constructor and abstract methods) and ``eod``, torch-free."""

    def __init__(self, path: str, config: dict[str, Any]) -> None:
        self.path = path
        for key, value in config.items():
            setattr(self, key, value)

    @abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``."""

    @abstractmethod
    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of ``ids``."""

    @property
    @abstractmethod
    def vocab(self) -> dict[str, int]:
        """Token text -> id."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids."""

    @property
    @abstractmethod
    def eod(self) -> int:
        """End-of-document id."""

    @abstractmethod
    def apply_chat_template(self, *args: object, **kwargs: object) -> str:
        """Render a conversation (not every tokenizer has a template)."""


class ByteTokenizer(TokenizerBase):
    """UTF-8 byte tokenizer: ids 0..255 are bytes, 256 is end-of-document, 257 is padding."""

    NUM_BYTES = 256
    EOD_ID = 256
    PAD_ID = 257

    def __init__(self) -> None:
        super().__init__(path="", config={"library": "kilocard", "class_name": type(self).__name__})
        self.unique_identifiers: dict[str, object] = OrderedDict(
            [("class", type(self).__name__), ("name", BYTES_TOKENIZER), ("vocab_size", self.vocab_size)]
        )

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``: its UTF-8 bytes (no EOD; the preprocessor appends it)."""
        return list(text.encode("utf-8"))

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special tokens (EOD, padding) are dropped, broken UTF-8 is replaced."""
        data = bytes(int(i) for i in numpy.asarray(ids).reshape(-1) if 0 <= int(i) < self.NUM_BYTES)
        return data.decode("utf-8", errors="replace")

    @property
    def vocab(self) -> dict[str, int]:
        """Token text -> id: ``<0xNN>`` for bytes, ``<eod>`` and ``<pad>`` for the specials."""
        table = {f"<0x{b:02X}>": b for b in range(self.NUM_BYTES)}
        table.update({"<eod>": self.EOD_ID, "<pad>": self.PAD_ID})
        return table

    @property
    def inv_vocab(self) -> dict[int, str]:
        """Id -> token text (the inverse of ``vocab``)."""
        return {i: t for t, i in self.vocab.items()}

    @property
    def vocab_size(self) -> int:
        """256 bytes + EOD + padding."""
        return self.NUM_BYTES + 2

    @property
    def eod(self) -> int:
        """End-of-document id, appended after every document by ``kilocard preprocess``."""
        return self.EOD_ID

    @property
    def pad(self) -> int:
        """Padding id (GPTDataset masks the loss on it)."""
        return self.PAD_ID

    def apply_chat_template(self, *args: object, **kwargs: object) -> str:
        """Chat templates are not part of a pretraining byte tokenizer."""
        raise DataError(f"tokenizer {BYTES_TOKENIZER!r} has no chat template; use a chat tokenizer for chat data")
