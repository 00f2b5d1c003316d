"""The one chunked file sha256 (``kilocard.base.digest``) that manifests, the local tier and tokenizers use."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from kilocard.base.digest import CHUNK, sha256_file

SRC = Path(__file__).parents[2] / "src" / "kilocard"


def test_digest_of_a_file_longer_than_one_chunk_equals_hashlibs(tmp_path):
    data = bytes(range(256)) * (CHUNK // 256 * 2 + 3)
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(str(tmp_path / "empty")) == hashlib.sha256(b"").hexdigest()


def test_no_other_module_reads_a_file_in_chunks_to_hash_it():
    copies = [
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        if p.name != "digest.py" and re.search(r"iter\(lambda: \w+\.read\(", p.read_text())
    ]
    assert copies == []
