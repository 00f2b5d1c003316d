"""``kilocard preprocess``: JSONL text -> Megatron-Core indexed dataset ``PREFIX_text_document.bin/.idx``.

Each input line is one JSON object with a string ``"text"``; blank lines are skipped. Every
document is tokenized, followed by the tokenizer's EOD id, and written with Megatron-Core's
``IndexedDatasetBuilder`` (one sequence per document, the smallest integer dtype that holds the
vocabulary, as Megatron-LM's ``preprocess_data.py`` does). Output goes to temporary names that
are renamed into place only after the whole input was read: a bad line leaves no output behind.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kilocard.data.documents import read_documents
from kilocard.data.errors import DataError
from kilocard.data.tokenizer import get_tokenizer

EXIT_OK, EXIT_USAGE = 0, 2
SUFFIX = "_text_document"


@dataclass(kw_only=True)
class PreprocessResult:
    """What ``preprocess_jsonl`` wrote."""

    prefix: str
    """Output prefix of the ``.bin/.idx`` pair (``PREFIX_text_document``)."""
    documents: int
    """Documents written (one per non-blank input line)."""
    tokens: int
    """Token ids written, EODs included."""


def preprocess_jsonl(input_path: str, output_prefix: str, tokenizer: str = "kilocard-bytes") -> PreprocessResult:
    """Tokenize ``input_path`` into ``output_prefix + "_text_document"`` ``.bin/.idx`` (atomically)."""
    import numpy
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    tok = get_tokenizer(tokenizer)
    prefix = f"{output_prefix}{SUFFIX}"
    final = [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")]
    tmp = [p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in final]
    try:
        final[0].parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DataError(
            f"--output-prefix: cannot create {final[0].parent} ({err.strerror}); fix: a writable folder"
        ) from err
    builder = IndexedDatasetBuilder(str(tmp[0]), dtype=DType.optimal_dtype(tok.vocab_size))
    documents = tokens = 0
    try:
        for _, text in read_documents(Path(input_path)):
            ids: list[int] = tok.tokenize(text) + [tok.eod]
            builder.add_document(numpy.asarray(ids), [len(ids)])
            documents, tokens = documents + 1, tokens + len(ids)
        if documents == 0:
            raise DataError(f'{input_path}: no documents (every line is blank); fix: one {{"text": ...}} per line')
        builder.finalize(str(tmp[1]))
        for src, dst in zip(tmp, final, strict=False):
            os.replace(src, dst)
    finally:
        builder.data_file.close()
        for path in tmp:
            path.unlink(missing_ok=True)
    return PreprocessResult(prefix=prefix, documents=documents, tokens=tokens)


def preprocess_command(input: str, output_prefix: str, tokenizer: str = "kilocard-bytes") -> int:
    """The ``kilocard preprocess`` verb: 0 on success, 2 (one error line on stderr) on bad input."""
    try:
        result = preprocess_jsonl(input, output_prefix, tokenizer)
    except DataError as err:
        print(f"kilocard preprocess: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {result.prefix}.bin/.idx: {result.documents} documents, {result.tokens} tokens ({tokenizer})")
    return EXIT_OK
