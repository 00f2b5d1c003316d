"""Tokenizers for Megatron-Core datasets, all offline: ``get_tokenizer(data.tokenizer)``.

``data.tokenizer`` (``--tokenizer`` of ``kilocard preprocess``) is ``kilocard-bytes`` (the built-in
byte tokenizer of the tiny recipes) or the path of a local tokenizer file (or of a Hugging Face
model folder: its ``tokenizer.json``), looked up in the current directory, then under kilocard's
shipped root. The file's kind is recognised from its content and named with Megatron-LM's
``--tokenizer-type`` values:

- ``HuggingFaceTokenizer``: a Hugging Face ``tokenizer.json`` (``kilocard.data.hf_tokenizer``);
- ``SentencePieceTokenizer``: a SentencePiece model (Llama 2, Mistral ``tokenizer.model``), loaded by
  Megatron-Core's own ``megatron.core.tokenizers`` (library ``sentencepiece``);
- ``TikTokenizer``: a tiktoken BPE file (Llama 3 ``original/tokenizer.model``;
  ``kilocard.data.tiktoken_tokenizer``).

Nothing is downloaded. Every failure is one ``DataError`` line naming ``data.tokenizer``, the file
and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path

from kilocard.base.safe_read import FileReadError, open_regular
from kilocard.data.byte_tokenizer import BYTES_TOKENIZER, ByteTokenizer, TokenizerBase
from kilocard.data.errors import DataError
from kilocard.data.hf_tokenizer import HuggingFaceTokenizer
from kilocard.data.paths import find_file
from kilocard.data.tiktoken_tokenizer import TikTokenizer

HF, SENTENCEPIECE, TIKTOKEN = "HuggingFaceTokenizer", "SentencePieceTokenizer", "TikTokenizer"
HF_FILE = "tokenizer.json"
KINDS = "a Hugging Face tokenizer.json, a SentencePiece model or a tiktoken BPE file"
_TIKTOKEN_LINE = re.compile(rb"[A-Za-z0-9+/]+=* \d+\r?\n?")
_SENTENCEPIECE_FIRST_BYTE = 0x0A  # protobuf field 1 (the pieces), length-delimited


def tokenizer_type(path: Path) -> str:
    """Megatron-LM's ``--tokenizer-type`` name for the file at ``path``, from its first bytes."""
    try:
        with open_regular(path, limit=None) as f:
            head = f.read(4096)
    except FileReadError as err:
        raise DataError(f"data.tokenizer: {err}; fix: a readable tokenizer file") from None
    except OSError as err:
        raise DataError(f"data.tokenizer: cannot read {path} ({err.strerror}); fix: a readable file") from err
    if head.lstrip()[:1] == b"{":
        return HF
    if _TIKTOKEN_LINE.fullmatch(head.split(b"\n", 1)[0] + b"\n"):
        return TIKTOKEN
    if head[:1] == bytes([_SENTENCEPIECE_FIRST_BYTE]):
        return SENTENCEPIECE
    raise DataError(f"data.tokenizer: {path} is not {KINDS}; fix: point data.tokenizer at one of them")


def load_sentencepiece(path: Path) -> TokenizerBase:
    """A SentencePiece model through Megatron-Core's tokenizer (EOD = ``</s>``, pad -1 unless the model has one)."""
    from megatron.core.tokenizers import MegatronTokenizer

    try:
        tok = MegatronTokenizer.from_pretrained(tokenizer_path=str(path), metadata_path={"library": "sentencepiece"})
    except ModuleNotFoundError as err:
        raise DataError(
            f"data.tokenizer: {path} is a SentencePiece model but sentencepiece is not installed; "
            f"fix: pip install 'kilocard[tokenizers]'"
        ) from err
    except (OSError, RuntimeError) as err:
        raise DataError(f"data.tokenizer: {path} is not a SentencePiece model ({err}); fix: {KINDS}") from err
    if tok.eod < 0:
        raise DataError(f"data.tokenizer: {path} has no end-of-sentence piece (</s>); fix: train it with eos_id >= 0")
    return tok


LOADERS = {HF: HuggingFaceTokenizer, SENTENCEPIECE: load_sentencepiece, TIKTOKEN: TikTokenizer}
"""Tokenizer type -> loader taking the file's path."""


def get_tokenizer(name: str) -> TokenizerBase:
    """The tokenizer ``name``: ``kilocard-bytes`` or the path of a tokenizer file (see the module docstring)."""
    if name == BYTES_TOKENIZER:
        return ByteTokenizer()
    try:
        path = find_file(name) or find_file(str(Path(name) / HF_FILE))  # a model folder: its tokenizer.json
    except DataError as err:
        raise DataError(f"data.tokenizer: {err}") from None
    if path is None:
        raise DataError(
            f"data.tokenizer: unknown tokenizer {name!r} (no such file in {Path.cwd()} or kilocard's shipped root); "
            f"fix: {BYTES_TOKENIZER} or the path of {KINDS}"
        )
    return LOADERS[tokenizer_type(path)](path)
