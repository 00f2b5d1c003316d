"""What made an indexed dataset: ``PREFIX.meta.json`` beside ``PREFIX.bin/.idx`` (torch-free).

``kilocard preprocess`` writes it (atomically, marked ``publishing`` before it renames the ``.bin/.idx``
into place and without the mark after): the tokenizer as given and
the sha256 of its file (``null`` for the built-in ``kilocard-bytes``), the tokenizer's vocabulary
size, the largest token id written, and the document and token counts. ``kilocard validate`` reads
it for every prefix of ``data.data_path`` and compares it with the run's ``data.tokenizer`` and
``model.vocab_size`` (``kilocard.validate.datarecord``): data tokenized with one tokenizer and
trained with another fails only at its first out-of-range id otherwise (an ``IndexError`` in the
embedding), or not at all while it trains on garbage.
"""

from __future__ import annotations

import functools
import json
import os
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy

from kilocard.base.digest import sha256_file
from kilocard.base.safe_read import FileReadError, expect_shape, open_regular, read_json
from kilocard.config.schema import BYTES_TOKENIZER
from kilocard.data.errors import DataError
from kilocard.data.indexed import INDEX_HEADER
from kilocard.data.paths import find_file

RECORD_SUFFIX = ".meta.json"
"""The record's name: the dataset prefix plus this."""
HF_FILE = "tokenizer.json"
"""A model folder's tokenizer file (``kilocard.data.tokenizer`` reads the same)."""
FORMAT = 1
"""Version of the record's layout."""
OMITTED_WHEN_NONE = ("assistant_tokens", "chat_template_sha256", "max_length", "truncated", "publishing")
"""Fields left out of the file when unset, so a record of plain text reads as it did before they existed."""


@dataclass(frozen=True, kw_only=True)
class DataRecord:
    """``PREFIX.meta.json``: what made one indexed dataset."""

    tokenizer: str
    """The tokenizer as ``preprocess --tokenizer`` was given it (``kilocard-bytes`` or a path)."""
    tokenizer_sha256: str | None
    """sha256 of the tokenizer file; ``None`` for the built-in ``kilocard-bytes``."""
    vocab_size: int
    """The tokenizer's vocabulary size (ids 0 .. vocab_size - 1)."""
    max_token_id: int
    """The largest token id in the ``.bin``."""
    documents: int
    """Documents written."""
    tokens: int
    """Token ids written, end-of-document ids included."""
    assistant_tokens: int | None = None
    """``preprocess --chat``: tokens that carry loss (assistant turns; the ``PREFIX_loss_mask`` dataset beside
    marks them); ``None`` for plain text, where every token does."""
    chat_template_sha256: str | None = None
    """``preprocess --chat``: sha256 of the chat template the conversations were rendered with
    (``kilocard.data.chat.template_sha256``); ``None`` for plain text."""
    max_length: int | None = None
    """``preprocess --chat --max-length``: the most tokens a conversation was allowed (its EOD included);
    ``None`` when unbounded."""
    truncated: int | None = None
    """``preprocess --chat --max-length N --on-overflow truncate``: conversations cut to ``N`` tokens (what was
    cut carries no loss anywhere); ``None`` without ``--max-length``."""
    publishing: bool | None = None
    """``True`` while ``preprocess`` renames the new ``.bin/.idx`` files into place (it writes the record so first,
    and without the field once every file is there): a record that still says so is of a publish that was cut
    off, whose files may be half old, half new. ``None`` (left out of the file) for a finished dataset."""
    format: int = FORMAT
    """Version of this layout."""

    def identity(self) -> str:
        """``tokenizer.json (sha256 0a1b2c3d4e5f, 512 ids)``: how messages name the record's tokenizer."""
        return describe(self.tokenizer, self.tokenizer_sha256, self.vocab_size)


def describe(name: str, sha256: str | None, vocab_size: int | None = None) -> str:
    """A tokenizer as messages name it: its name, the start of its file's sha256 and its size when known."""
    facts = ([f"sha256 {sha256[:12]}"] if sha256 else []) + ([f"{vocab_size} ids"] if vocab_size else [])
    return f"{name} ({', '.join(facts)})" if facts else name


MASK_SUFFIX = "_loss_mask"
"""``kilocard preprocess --chat``'s loss mask beside the token dataset: ``PREFIX_text_document_loss_mask``."""


def mask_prefix(prefix: str) -> str:
    """The loss-mask dataset beside token dataset ``prefix`` (``PREFIX_loss_mask``)."""
    return f"{prefix}{MASK_SUFFIX}"


def record_path(prefix: str) -> Path:
    """``PREFIX.meta.json``."""
    return Path(f"{prefix}{RECORD_SUFFIX}")


def tokenizer_file(name: str) -> Path | None:
    """The file of tokenizer ``name`` as ``get_tokenizer`` finds it; ``None`` for ``kilocard-bytes`` or when
    there is none (the tokenizer rules report that)."""
    if name == BYTES_TOKENIZER:
        return None
    return find_file(name) or find_file(str(Path(name) / HF_FILE))


def tokenizer_sha256(name: str) -> str | None:
    """sha256 of tokenizer ``name``'s file; ``None`` for ``kilocard-bytes`` (or a tokenizer without a file)."""
    path = tokenizer_file(name)
    return None if path is None else sha256_file(path)


def write_record(prefix: str, record: DataRecord) -> Path:
    """Write ``PREFIX.meta.json`` atomically (temporary file, fsync, rename); return its path."""
    path = record_path(prefix)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            fields_ = {k: v for k, v in asdict(record).items() if k not in OMITTED_WHEN_NONE or v is not None}
            json.dump(fields_, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_record(prefix: str) -> DataRecord | None:
    """The record of ``prefix`` (resolved), ``None`` when it has none (data from before records, or from
    other tools); ``DataError`` naming the file when it is not a record."""
    path = record_path(prefix)
    if not path.is_file():
        return None
    try:
        raw = read_json(path, dict)
        types = field_types()
        for key, value in raw.items():
            if key in types:
                expect_shape(path, value, types[key], f"field {key!r}")
        return DataRecord(**{k: v for k, v in raw.items() if k in types})
    except FileReadError as err:
        raise DataError(
            f"data.data_path: {err} (not a kilocard data record); "
            f"fix: rebuild the data with `kilocard preprocess`, or delete the file"
        ) from None
    except TypeError as err:
        raise DataError(
            f"data.data_path: {path} is not a kilocard data record ({type(err).__name__}); "
            f"fix: rebuild the data with `kilocard preprocess`, or delete the file"
        ) from None


@functools.cache
def field_types() -> dict[str, tuple[type, ...]]:
    """The JSON types of each ``DataRecord`` field, from its annotation (``int | None``: an integer or null)."""
    hints = typing.get_type_hints(DataRecord)
    return {f.name: typing.get_args(hints[f.name]) or (hints[f.name],) for f in fields(DataRecord)}


HEADER_BYTES = len(INDEX_HEADER) + 8 + 1 + 8 + 8
"""The header: the magic bytes, version (u64), dtype code (u8), sequence count (u64), document-index entries (u64)."""


def _index_counts(header: bytes) -> tuple[int, int] | None:
    """``(sequences, document-index entries)`` of an ``.idx`` header; ``None`` when it is not one."""
    import struct

    if len(header) < HEADER_BYTES or not header.startswith(INDEX_HEADER):
        return None
    sequences, entries = struct.unpack_from("<QQ", header, len(INDEX_HEADER) + 9)
    return sequences, entries


def index_documents(prefix: str) -> int | None:
    """Documents in ``PREFIX.idx`` from its header (the document index holds one more entry than there are
    documents); ``None`` when the file is not a Megatron-Core index."""
    try:
        with open_regular(f"{prefix}.idx", limit=None) as f:
            counts = _index_counts(f.read(HEADER_BYTES))
    except (FileReadError, OSError):
        return None
    return None if counts is None else max(counts[1] - 1, 0)


def document_lengths(prefix: str) -> numpy.ndarray | None:
    """Tokens of every document of ``PREFIX.idx`` (its int32 ``sequence_lengths`` after the header, one sequence
    per document as ``kilocard preprocess`` writes), memory-mapped as Megatron-Core reads them: a scan of a
    hundred million conversations costs no copy; ``None`` when the file is not a Megatron-Core index."""
    path = f"{prefix}.idx"
    try:
        with open_regular(path, limit=None) as f:
            counts = _index_counts(f.read(HEADER_BYTES))
        if counts is None or os.path.getsize(path) < HEADER_BYTES + 4 * counts[0]:
            return None
        return numpy.memmap(path, dtype=numpy.int32, mode="r", offset=HEADER_BYTES, shape=(counts[0],))
    except (FileReadError, OSError, ValueError):
        return None


MASK_CHUNK = 1 << 16
"""Conversations whose loss tokens ``loss_tokens`` counts at a time (their mask bytes read at once)."""


def loss_tokens(prefix: str, window: int | None) -> numpy.ndarray | None:
    """Loss tokens of every conversation of ``prefix`` that a run trains on: the ones of its loss mask
    (``PREFIX_loss_mask``, uint8) over its labels, the tokens after the first, cut at ``window`` labels
    (``model.seq_length`` when one conversation is one sequence; ``None``: all of them). ``None`` when the
    mask is not a uint8 Megatron-Core dataset with one sequence per document."""
    masked = mask_prefix(prefix)
    lengths = document_lengths(masked)
    try:
        with open_regular(f"{masked}.idx", limit=None) as f:
            header = f.read(HEADER_BYTES)
        if lengths is None or header[len(INDEX_HEADER) + 8] != 1:  # Megatron-Core's DType code 1: uint8
            return None
        data = numpy.memmap(f"{masked}.bin", dtype=numpy.uint8, mode="r")
    except (FileReadError, OSError, ValueError, IndexError):
        return None
    ends = numpy.cumsum(lengths, dtype=numpy.int64)
    if len(ends) and ends[-1] > len(data):
        return None
    out = numpy.zeros(len(lengths), dtype=numpy.int64)
    for first in range(0, len(lengths), MASK_CHUNK):
        last = min(first + MASK_CHUNK, len(lengths))
        base = int(ends[first - 1]) if first else 0
        sums = numpy.concatenate(([0], numpy.cumsum(data[base : int(ends[last - 1])], dtype=numpy.int64)))
        starts = (ends[first:last] - lengths[first:last]) - base
        stops = ends[first:last] - base
        if window is not None:
            stops = numpy.minimum(stops, starts + 1 + window)
        out[first:last] = sums[stops] - sums[numpy.minimum(starts + 1, stops)]
    return out
