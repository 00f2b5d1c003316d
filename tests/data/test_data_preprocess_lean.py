"""``kilocard preprocess`` stays light: it writes Megatron-Core's format without importing torch or Megatron-Core.

Importing ``megatron.core`` runs its package ``__init__`` (DDP, the optimizer, inference), and ``import torch``
loads ``torch.optim``: seconds before the first input line, and their warnings. ``kilocard.data.indexed``
writes the bytes Megatron-Core's ``IndexedDatasetBuilder`` writes; the test below compares them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from kilocard.paths import data_dir

pytestmark = pytest.mark.integration  # starts the verb in a fresh Python; builds with Megatron-Core to compare

DATA = data_dir("conf").parent / "data"
HEAVY = ("torch", "megatron", "apex", "transformer_engine")
"""Packages ``preprocess`` must not import (``torch`` brings ``torch.optim``; ``megatron`` its optimizer stack)."""
PROBE = """
import json, sys
from kilocard.commands import main
code = main(json.loads(sys.argv[1]))
print(json.dumps([code, sorted(m for m in sys.modules if m.split(".")[0] in json.loads(sys.argv[2]))]))
"""


def imported_by(argv: list[str]) -> tuple[int, list[str]]:
    """Exit code of ``kilocard ARGV`` run in a fresh Python, and the heavy modules it left in ``sys.modules``."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    code, modules = json.loads(proc.stdout.splitlines()[-1])
    return code, modules


@pytest.mark.parametrize(
    "args",
    [
        ["--input", str(DATA / "tiny_corpus" / "tiny_corpus.jsonl")],
        ["--input", str(DATA / "tiny_corpus" / "tiny_corpus.jsonl"), "--tokenizer", str(DATA / "tiny_corpus")],
        ["--chat", "--input", str(DATA / "tiny_chat" / "conversations.jsonl"), "--tokenizer", str(DATA / "tiny_chat")],
    ],
    ids=["bytes", "tokenizer.json", "chat"],
)
def test_preprocess_imports_neither_torch_nor_megatron(args, tmp_path):
    code, modules = imported_by(["preprocess", *args, "--output-prefix", str(tmp_path / "out")])
    assert code == 0
    assert not [m for m in modules if m.startswith(("megatron.core.optimizer", "torch.optim"))]
    assert modules == [], modules[:10]


@pytest.mark.parametrize("dtype", [numpy.uint8, numpy.uint16, numpy.int32])
def test_the_index_writer_writes_megatron_cores_bytes(dtype, tmp_path: Path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    from kilocard.data.indexed import IndexWriter

    rng = numpy.random.default_rng(0)
    high = 200 if dtype == numpy.uint8 else 70000 if dtype == numpy.int32 else 60000
    docs = [rng.integers(0, high, size=n) for n in (5, 1, 17, 3)]
    ours, theirs = IndexWriter(str(tmp_path / "a.bin"), dtype), IndexedDatasetBuilder(str(tmp_path / "b.bin"), dtype)
    for ids in docs:
        ours.add_document(ids)
        theirs.add_document(ids, [len(ids)])
    ours.finalize(str(tmp_path / "a.idx"))
    theirs.finalize(str(tmp_path / "b.idx"))
    for ext in ("bin", "idx"):
        assert (tmp_path / f"a.{ext}").read_bytes() == (tmp_path / f"b.{ext}").read_bytes(), ext
    read = IndexedDataset(str(tmp_path / "a"))
    assert [list(read[i]) for i in range(len(read))] == [list(d) for d in docs]
