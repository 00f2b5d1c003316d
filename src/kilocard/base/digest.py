"""The one chunked sha256 of a file (checkpoint manifests, the local checkpoint tier, tokenizer identity)."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 1 << 20
"""Bytes read at a time: a multi-GB shard never sits in memory whole."""


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of the file's bytes, read in ``CHUNK`` blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
