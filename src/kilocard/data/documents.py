"""JSONL documents: one ``{"text": ...}`` object per line (the input of ``kilocard preprocess`` and BPE training)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from kilocard.data.errors import DataError


def read_documents(path: Path) -> Iterator[tuple[int, str]]:
    """``(line_number, text)`` for every non-blank line; ``DataError`` names the file and line."""
    if not path.is_file():
        raise DataError(
            f'--input: {path} does not exist or is not a file; fix: pass a JSONL file, one {{"text": ...}} per line'
        )
    with path.open("r", encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            yield number, _text_of(line, path, number)


def _text_of(line: str, path: Path, number: int) -> str:
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
    return record["text"]
