"""``HuggingFaceTokenizer``: a Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library, offline.

Megatron-Core's own ``HuggingFaceTokenizer`` goes through transformers' ``AutoTokenizer`` (a large
extra dependency); the ``tokenizers`` library reads the same file directly. ``tokenizer.json`` does
not say which token ends a document: like ``AutoTokenizer``, the ``eos_token`` (and ``pad_token``)
of a ``tokenizer_config.json`` beside the file decide; without one, the first of ``EOD_NAMES``
(``PAD_NAMES``) the file defines. Without a padding token (or with one equal to the EOD) ``pad`` is -1,
Megatron-Core's "none".
Text is encoded without added BOS/EOS (the preprocessor appends the EOD) and special-token text
inside a document is encoded as plain text (``encode_special_tokens``), so a document cannot forge an
end of document; decoding drops special tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy
from tokenizers import Tokenizer

from kilocard.base.safe_read import FileReadError, read_json
from kilocard.data.errors import DataError
from kilocard.data.file_tokenizer import FileTokenizer

EOD_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|eos|>")
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]")
NO_PAD = -1
CONFIG_FILE = "tokenizer_config.json"


def _configured_tokens(path: Path) -> dict[str, str]:
    """``eos_token``/``pad_token`` of the ``tokenizer_config.json`` beside ``path`` (a string or ``{"content"}``)."""
    config_path = path.with_name(CONFIG_FILE)
    if not config_path.exists() and not config_path.is_symlink():
        return {}
    try:
        config = read_json(config_path, dict)
    except FileReadError as err:
        raise DataError(f"data.tokenizer: {err}; fix: a valid JSON file or none") from None
    out = {}
    for key in ("eos_token", "pad_token"):
        value = config.get(key) if isinstance(config, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


class HuggingFaceTokenizer(FileTokenizer):
    """A ``tokenizer.json`` (BPE, Unigram or WordPiece) with its normaliser, pre-tokeniser and decoder."""

    TOKENIZER_TYPE = "HuggingFaceTokenizer"

    def __init__(self, path: Path) -> None:
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust extension raises a bare Exception for a malformed file
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise DataError(
                f"data.tokenizer: {path} is not a Hugging Face tokenizer.json ({reason}); "
                f"fix: the tokenizer.json of a Hugging Face model folder"
            ) from err
        self._tok.encode_special_tokens = True
        self._vocab: dict[str, int] = self._tok.get_vocab(with_added_tokens=True)
        named = _configured_tokens(path)
        eod = self._special_id(named.get("eos_token"), EOD_NAMES)
        if eod is None:
            raise DataError(
                f"data.tokenizer: {path} defines none of {', '.join(EOD_NAMES)} to end a document; "
                f'fix: put a {CONFIG_FILE} with "eos_token" beside it'
            )
        self._eod: int = eod
        pad = self._special_id(named.get("pad_token"), PAD_NAMES)
        self._pad = NO_PAD if pad in (None, self._eod) else pad  # Megatron-Core refuses a pad equal to the EOD
        super().__init__(path)

    def _special_id(self, configured: str | None, names: tuple[str, ...]) -> int | None:
        """Id of the configured token, else of the first of ``names`` in the vocabulary."""
        for name in ([configured] if configured else []) + list(names):
            if name in self._vocab:
                return self._vocab[name]
        return None

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token text is plain text (the preprocessor appends the EOD)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special tokens (EOD, padding, ...) and ids outside the vocabulary are dropped."""
        flat = [int(i) for i in numpy.asarray(ids).reshape(-1) if 0 <= int(i) < self.vocab_size]
        return self._tok.decode(flat, skip_special_tokens=True)

    @property
    def vocab(self) -> dict[str, int]:
        """Token text -> id, added tokens included."""
        return dict(self._vocab)

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (what the embedding must hold), added tokens included."""
        return max(self._vocab.values()) + 1

    @property
    def eod(self) -> int:
        """End-of-document id."""
        return self._eod

    @property
    def pad(self) -> int:
        """Padding id, or -1 when the file has none."""
        return self._pad
