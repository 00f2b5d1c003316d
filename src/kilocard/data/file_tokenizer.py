"""What every tokenizer read from a local file shares: its identity for the dataset cache, and no chat template."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from kilocard.base.digest import sha256_file
from kilocard.data.byte_tokenizer import TokenizerBase
from kilocard.data.errors import DataError


class FileTokenizer(TokenizerBase):
    """Base of the file tokenizers; a subclass sets ``TOKENIZER_TYPE`` (Megatron-LM's ``--tokenizer-type`` name).

    ``unique_identifiers`` (what Megatron-Core hashes to name its dataset index caches) holds the
    file's SHA-256, not its path: the same file anywhere shares a cache, a changed file never does.
    """

    TOKENIZER_TYPE = ""

    def __init__(self, path: Path) -> None:
        super().__init__(path=str(path), config={"library": self.TOKENIZER_TYPE, "class_name": type(self).__name__})
        self.unique_identifiers: dict[str, object] = OrderedDict(
            [
                ("class", type(self).__name__),
                ("tokenizer_type", self.TOKENIZER_TYPE),
                ("sha256", sha256_file(path)),
                ("vocab_size", self.vocab_size),
            ]
        )

    @property
    def inv_vocab(self) -> dict[int, str]:
        """Id -> token text (the inverse of ``vocab``)."""
        return {i: t for t, i in self.vocab.items()}

    def apply_chat_template(self, *args: object, **kwargs: object) -> str:
        """kilocard tokenizes pretraining text only."""
        raise DataError(f"tokenizer {self.path}: chat templates are not supported; kilocard tokenizes pretraining text")
