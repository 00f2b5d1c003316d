"""Megatron-Core's indexed dataset format (``PREFIX.bin`` / ``PREFIX.idx``), written without torch.

``kilocard preprocess`` writes with ``IndexWriter`` the bytes Megatron-Core's ``IndexedDatasetBuilder``
writes (``megatron/core/datasets/indexed_dataset.py``, unchanged from 0.16 to 0.19; the test compares
them byte for byte), so that the verb imports neither torch nor Megatron-Core (importing
``megatron.core`` loads its optimizer, distributed and inference stacks: seconds before the first
line is read). Megatron-Core's ``IndexedDataset`` reads the result.

``.bin``: every document's token ids, one after the other, in the index's dtype. ``.idx``: the header
``MMIDIDX\\0\\0``, version 1 (``<Q``), the dtype code (``<B``), the sequence count and document count
(``<Q`` each), then the sequence lengths (int32), their byte offsets in ``.bin`` (int64) and the document
indices (int64: sequence numbers where each document ends, starting with 0). One sequence per document.
"""

from __future__ import annotations

import struct
from typing import IO

import numpy

INDEX_HEADER = b"MMIDIDX\x00\x00"
"""The first bytes of a Megatron-Core ``.idx`` (``megatron.core.datasets.indexed_dataset._INDEX_HEADER``)."""
VERSION = 1
"""The ``.idx`` version Megatron-Core writes and reads."""
DTYPE_CODES = {
    numpy.uint8: 1,
    numpy.int8: 2,
    numpy.int16: 3,
    numpy.int32: 4,
    numpy.int64: 5,
    numpy.float64: 6,
    numpy.float32: 7,
    numpy.uint16: 8,
}
"""numpy dtype -> its code in the ``.idx`` header (Megatron-Core's ``DType`` enum)."""


def optimal_dtype(vocab_size: int) -> type[numpy.integer]:
    """The token dtype for a vocabulary of ``vocab_size`` ids (Megatron-Core's ``DType.optimal_dtype``)."""
    return numpy.uint16 if vocab_size < 65500 else numpy.int32


class IndexWriter:
    """Writes ``.bin`` as documents are added, then ``.idx`` on ``finalize`` (``IndexedDatasetBuilder``'s calls)."""

    def __init__(self, bin_path: str, dtype: type[numpy.number]) -> None:
        self.dtype = dtype
        self.data_file: IO[bytes] = open(bin_path, "wb")  # noqa: SIM115 - closed by finalize or the caller
        self.lengths: list[int] = []

    def add_document(self, ids: numpy.ndarray) -> None:
        """Append one document (one sequence) of token ids."""
        array = numpy.asarray(ids, dtype=self.dtype)
        self.data_file.write(array.tobytes(order="C"))
        self.lengths.append(array.size)

    def finalize(self, idx_path: str) -> None:
        """Close ``.bin`` and write the index of every document added."""
        self.data_file.close()
        lengths = numpy.asarray(self.lengths, dtype=numpy.int64)
        pointers = numpy.zeros(len(lengths), dtype=numpy.int64)
        numpy.cumsum(lengths[:-1] * numpy.dtype(self.dtype).itemsize, out=pointers[1:])
        documents = numpy.arange(len(lengths) + 1, dtype=numpy.int64)
        with open(idx_path, "wb") as f:
            f.write(INDEX_HEADER + struct.pack("<Q", VERSION) + struct.pack("<B", DTYPE_CODES[self.dtype]))
            f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(documents)))
            f.write(lengths.astype(numpy.int32).tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(documents.tobytes(order="C"))
