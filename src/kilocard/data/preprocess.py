"""``kilocard preprocess``: JSONL text -> Megatron-Core indexed dataset ``PREFIX_text_document.bin/.idx``.

Each input line is one JSON object with a string ``"text"``; blank lines are skipped. Every
document is tokenized (``data.tokenizer`` kinds: ``kilocard.data.tokenizer``), followed by the
tokenizer's EOD id, and written in Megatron-Core's indexed format (one sequence per
document, the smallest integer dtype that holds the vocabulary), as Megatron-LM's
``tools/preprocess_data.py`` does, through ``kilocard.data.indexed`` (the same bytes without importing torch
or Megatron-Core: the verb starts in well under a second). With ``workers > 1`` a pool of processes parses and tokenizes
batches of lines, each loading the tokenizer once; results are written in input order, so the
output is the same for any number of workers. A progress bar (input bytes, documents/s) goes to
stderr on a terminal. Output goes to temporary names that are renamed into place only after the
whole input was read: a bad line leaves no output behind. Beside them goes ``PREFIX.meta.json``
(``kilocard.data.record``): the tokenizer and its file's sha256, its vocabulary size, the largest
token id and the document count, which ``kilocard validate`` compares with a run's tokenizer.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import numpy
from tqdm import tqdm

from kilocard.base.safe_read import FileReadError, open_regular, require_regular
from kilocard.config.schema import BYTES_TOKENIZER
from kilocard.data.chat import encode_conversation, load_chat_tokenizer, messages_of, template_sha256
from kilocard.data.errors import DataError, require_utf8
from kilocard.data.indexed import IndexWriter, optimal_dtype
from kilocard.data.record import DataRecord, mask_prefix, tokenizer_sha256, write_record
from kilocard.data.tokenizer import TokenizerBase, get_tokenizer

SUFFIX = "_text_document"
BATCH_LINES = 64
"""Lines per task sent to a worker."""
AHEAD_PER_WORKER = 4
"""Batches in flight per worker."""

Line = tuple[int, str]
"""``(line_number, raw_line)`` of a non-blank input line."""


@dataclass(kw_only=True)
class PreprocessResult:
    """What ``preprocess_jsonl`` wrote."""

    prefix: str
    """Output prefix of the ``.bin/.idx`` pair (``PREFIX_text_document``)."""
    documents: int
    """Documents written (one per non-blank input line)."""
    tokens: int
    """Token ids written, EODs included."""
    seconds: float
    """Wall time of reading, tokenizing and writing."""
    workers: int = 1
    """Tokenizer processes used (``--workers``, capped at the CPUs this process may use)."""
    assistant_tokens: int | None = None
    """``--chat``: tokens that carry loss (the ``PREFIX_text_document_loss_mask`` dataset marks them)."""
    truncated: int | None = None
    """``--chat --max-length N --on-overflow truncate``: conversations cut to ``N`` tokens."""

    @property
    def documents_per_second(self) -> float:
        """Throughput over the whole run."""
        return self.documents / max(self.seconds, 1e-9)


def require_input(path: Path) -> Path:
    """``path`` if it is a regular file (the safe reader's check); ``DataError`` naming ``--input`` otherwise."""
    try:
        return require_regular(path)
    except FileReadError as err:
        raise DataError(f'--input: {err}; fix: pass a JSONL file, one {{"text": ...}} per line') from None


def read_lines(path: Path) -> Iterator[Line]:
    """``(line_number, line)`` for every non-blank line; a line that is not UTF-8 is a ``DataError``
    naming the line and the byte offset in the file (never the line's bytes)."""
    offset = 0
    with open_regular(path, limit=None) as lines:
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{path}:{number}: not UTF-8 text (bad byte at offset {offset + err.start}); "
                    "fix: save the input as UTF-8 JSONL"
                ) from None
            offset += len(raw)
            if line.strip():
                yield number, line


def text_of(line: str, path: Path, number: int) -> str:
    """The ``"text"`` string of one JSONL line; ``DataError`` naming ``path:number`` otherwise."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(
            f'{path}:{number}: not valid JSON ({err.msg}); fix: one JSON object per line, e.g. {{"text": "..."}}'
        ) from err
    if not isinstance(record, dict) or "text" not in record:
        raise DataError(f'{path}:{number}: no "text" key; fix: every line needs {{"text": "..."}}')
    if not isinstance(record["text"], str):
        kind = type(record["text"]).__name__
        raise DataError(
            f'{path}:{number}: "text" is a {kind}, not a string; fix: put the document text in a JSON string'
        )
    return require_utf8(record["text"], f'{path}:{number}: "text"')


_worker: tuple[TokenizerBase, Path] | None = None
"""This process's tokenizer and input path (set once per worker by ``_start_worker``)."""


def _start_worker(tokenizer: str, path: Path) -> None:
    global _worker
    _worker = (get_tokenizer(tokenizer), path)


def _encode_batch(batch: list[Line]) -> tuple[list[numpy.ndarray], int]:
    """Token ids (EOD appended) of each line of ``batch``, and the batch's size in bytes."""
    assert _worker is not None, "_start_worker runs first"
    tok, path = _worker
    docs = [numpy.asarray(tok.tokenize(text_of(line, path, n)) + [tok.eod], dtype=numpy.int64) for n, line in batch]
    return docs, sum(len(line.encode("utf-8")) for _, line in batch)


def _batches(lines: Iterable[Line]) -> Iterator[list[Line]]:
    batch: list[Line] = []
    for item in lines:
        batch.append(item)
        if len(batch) == BATCH_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def _encoded(tok: TokenizerBase, tokenizer: str, path: Path, workers: int) -> Iterator[tuple[list[numpy.ndarray], int]]:
    """Encoded batches in input order: in this process (with ``tok``), or from a pool of ``workers`` (fork)
    processes that each load ``tokenizer``.

    At most ``AHEAD_PER_WORKER * workers`` batches are in flight, so memory stays flat however large the input.
    """
    global _worker
    if workers == 1:
        _worker = (tok, path)
        yield from map(_encode_batch, _batches(read_lines(path)))
        return
    with multiprocessing.get_context("fork").Pool(workers, _start_worker, (tokenizer, path)) as pool:
        pending: deque[AsyncResult] = deque()
        for batch in _batches(read_lines(path)):
            pending.append(pool.apply_async(_encode_batch, (batch,)))
            if len(pending) >= AHEAD_PER_WORKER * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _progress(path: Path) -> tqdm:
    """A bar over the input's bytes with documents/s; shown only when stderr is a terminal."""
    return tqdm(
        total=path.stat().st_size,
        unit="B",
        unit_scale=True,
        desc="preprocess",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the CPU count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _check_workers(workers: int) -> int:
    """The worker count to use: ``workers`` capped at ``usable_cpus()`` (more processes than CPUs only
    cost memory; ``--workers 100000`` used to fork 100,000 processes)."""
    if workers < 1:
        raise DataError(f"--workers: {workers} is not a process count; fix: --workers 1 or more (e.g. the CPU count)")
    return min(workers, usable_cpus())


def _output_files(prefix: str) -> tuple[list[Path], list[Path]]:
    """``PREFIX.bin/.idx`` and the temporary names they are written under; creates the folder."""
    final = [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")]
    tmp = [p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in final]
    try:
        final[0].parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(
            f"--output-prefix: cannot create {final[0].parent} ({err.strerror}); fix: a writable folder"
        ) from err
    return final, tmp


Output = tuple[IndexWriter, list[Path], list[Path]]
"""A writer and its final and temporary ``.bin/.idx`` names."""


@contextlib.contextmanager
def _outputs(*specs: tuple[str, type[numpy.number]]) -> Iterator[list[Output]]:
    """A writer at the temporary names of each ``(prefix, dtype)``; every temporary file left on the way out (all
    of them unless ``_publish`` renamed them) is removed: a failed run leaves no output behind."""
    outputs: list[Output] = []
    try:
        for prefix, dtype in specs:
            final, tmp = _output_files(prefix)
            try:
                outputs.append((IndexWriter(str(tmp[0]), dtype), final, tmp))
            except OSError as err:
                raise DataError(
                    f"--output-prefix: cannot write {tmp[0]} ({err.strerror}); fix: a writable folder"
                ) from None
        yield outputs
    finally:
        for writer, _, tmp in outputs:
            writer.data_file.close()
            for p in tmp:
                p.unlink(missing_ok=True)


@dataclass
class _Counts:
    """What a run has written so far (the data record's numbers)."""

    documents: int = 0
    """Documents written."""
    tokens: int = 0
    """Token ids written, EODs included."""
    max_id: int = -1
    """The largest token id written."""
    assistant: int | None = None
    """``--chat``: tokens that carry loss (``None`` for text)."""

    def add(self, ids: numpy.ndarray, mask: numpy.ndarray | None = None) -> None:
        """Count one document (its ids, EOD included) and, with ``--chat``, its loss mask."""
        self.documents += 1
        self.tokens += len(ids)
        self.max_id = max(self.max_id, int(ids.max()))
        if mask is not None:
            self.assistant = (self.assistant or 0) + int(mask.sum())


def _publish(
    prefix: str, outputs: list[Output], tokenizer: str, vocab_size: int, counts: _Counts, empty: str, **chat: Any
) -> None:
    """Refuse an input without documents (``empty``: the line saying so); else finalize each writer's index and
    rename its temporary ``.bin/.idx`` into place between two writes of the data record: first marked
    ``publishing`` (so files left half old, half new by a cut-off publish are refused by ``validate``), then
    without the mark. ``chat``: the record's ``--chat`` fields (template, ``max_length``, cuts)."""
    if counts.documents == 0:
        raise DataError(empty)
    record = DataRecord(
        tokenizer=tokenizer,
        tokenizer_sha256=tokenizer_sha256(tokenizer),
        vocab_size=vocab_size,
        max_token_id=counts.max_id,
        documents=counts.documents,
        tokens=counts.tokens,
        assistant_tokens=counts.assistant,
        **chat,
    )
    try:
        for writer, _, tmp in outputs:
            writer.finalize(str(tmp[1]))
        write_record(prefix, replace(record, publishing=True))
        for _, final, tmp in outputs:
            for src, dst in zip(tmp, final, strict=True):
                os.replace(src, dst)
        write_record(prefix, record)
    except OSError as err:
        raise DataError(
            f"--output-prefix: cannot write {prefix}.bin/.idx ({err.strerror}); fix: a writable folder with space, "
            f"then run preprocess again (until then validate refuses the prefix)"
        ) from None


def preprocess_jsonl(
    input_path: str,
    output_prefix: str,
    tokenizer: str = BYTES_TOKENIZER,
    workers: int = 1,
) -> PreprocessResult:
    """Tokenize ``input_path`` into ``output_prefix + "_text_document"`` ``.bin/.idx`` (atomically)."""
    workers = _check_workers(workers)
    start = time.perf_counter()
    path = require_input(Path(input_path))
    tok = get_tokenizer(tokenizer)
    prefix = f"{output_prefix}{SUFFIX}"
    counts = _Counts()
    with _outputs((prefix, optimal_dtype(tok.vocab_size))) as outputs:
        with _progress(path) as bar:
            for docs, size in _encoded(tok, tokenizer, path, workers):
                for ids in docs:
                    outputs[0][0].add_document(ids)
                    counts.add(ids)
                bar.update(size)
                if not bar.disable:
                    rate = counts.documents / max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix_str(f"{rate:.0f} documents/s", refresh=False)
        empty = f'{input_path}: no documents (every line is blank); fix: one {{"text": ...}} per line'
        _publish(prefix, outputs, tokenizer, tok.vocab_size, counts, empty)
    seconds = time.perf_counter() - start
    return PreprocessResult(
        prefix=prefix, documents=counts.documents, tokens=counts.tokens, seconds=seconds, workers=workers
    )


OVERFLOW = ("refuse", "truncate")
"""What ``preprocess --chat --max-length`` does with a longer conversation (``--on-overflow``)."""


def fit_length(
    ids: numpy.ndarray, mask: numpy.ndarray, max_length: int | None, on_overflow: str, eod: int, where: str
) -> tuple[numpy.ndarray, numpy.ndarray, bool]:
    """A conversation (its EOD last) within ``max_length`` tokens: as it is, or cut to ``max_length - 1`` tokens and
    the EOD (no loss on it) with ``on_overflow="truncate"`` (the third value says so); ``DataError`` with
    ``"refuse"``."""
    if max_length is None or len(ids) <= max_length:
        return ids, mask, False
    if on_overflow != "truncate":
        raise DataError(
            f"{where}: the conversation is {len(ids)} tokens, longer than --max-length {max_length}; "
            f"fix: shorten it, a larger --max-length, or --on-overflow truncate to cut it"
        )
    return numpy.append(ids[: max_length - 1], eod), numpy.append(mask[: max_length - 1], numpy.uint8(0)), True


MAX_DOCUMENT_TOKENS = 2**31 - 1
"""The longest document an ``.idx`` records (Megatron-Core stores lengths as int32)."""


def _check_max_length(max_length: int | None, on_overflow: str) -> None:
    if on_overflow not in OVERFLOW:
        raise DataError(
            f"--on-overflow: {on_overflow!r} is not one of {', '.join(OVERFLOW)}; fix: --on-overflow refuse"
        )
    if max_length is not None and max_length < 2:
        raise DataError(
            f"--max-length: {max_length} leaves no room for a conversation and its end-of-document token; "
            f"fix: the model's seq_length + 1, e.g. --max-length 4097"
        )
    if max_length is not None and max_length > MAX_DOCUMENT_TOKENS:
        raise DataError(
            f"--max-length: {max_length} is more than a document of the .idx can hold ({MAX_DOCUMENT_TOKENS} tokens, "
            f"int32 lengths); fix: the model's seq_length + 1, e.g. --max-length 4097"
        )


def preprocess_chat(
    input_path: str, output_prefix: str, tokenizer: str, max_length: int | None = None, on_overflow: str = "refuse"
) -> PreprocessResult:
    """Render the conversations of ``input_path`` with ``tokenizer``'s chat template (``kilocard.data.chat``) into
    ``PREFIX_text_document`` (token ids, the EOD appended unless the template ends with it) and
    ``PREFIX_text_document_loss_mask`` (1 on assistant tokens, 0 elsewhere and on the appended EOD), the same
    documents and lengths; atomically, with the data record (its ``assistant_tokens``, template, and with
    ``max_length`` the conversations cut to it, ``fit_length``)."""
    start = time.perf_counter()
    _check_max_length(max_length, on_overflow)
    path = require_input(Path(input_path))
    chat = load_chat_tokenizer(tokenizer)
    tok = get_tokenizer(tokenizer)  # what training reads: vocabulary, EOD and padding ids
    prefix = f"{output_prefix}{SUFFIX}"
    counts, truncated = _Counts(assistant=0), 0
    with _outputs((prefix, optimal_dtype(tok.vocab_size)), (mask_prefix(prefix), numpy.uint8)) as outputs:
        for number, line in read_lines(path):
            where = f"{path}:{number}"
            ids, mask = encode_conversation(chat, messages_of(line, path, number), where)
            if not len(ids) or ids[-1] != tok.eod:
                ids, mask = numpy.append(ids, tok.eod), numpy.append(mask, numpy.uint8(0))
            ids, mask, cut = fit_length(ids, mask, max_length, on_overflow, tok.eod, where)
            truncated += cut
            outputs[0][0].add_document(ids)
            outputs[1][0].add_document(mask)
            counts.add(ids, mask)
        empty = f'{input_path}: no conversations (every line is blank); fix: one {{"messages": [...]}} per line'
        cuts = truncated if max_length is not None else None
        chat_fields = {"chat_template_sha256": template_sha256(chat.chat_template), "max_length": max_length}
        _publish(prefix, outputs, tokenizer, tok.vocab_size, counts, empty, **chat_fields, truncated=cuts)
    seconds = time.perf_counter() - start
    return PreprocessResult(
        prefix=prefix,
        documents=counts.documents,
        tokens=counts.tokens,
        seconds=seconds,
        assistant_tokens=counts.assistant,
        truncated=truncated if max_length is not None else None,
    )
