"""Which global samples each data-parallel rank reads: Megatron-LM's ``MegatronPretrainingSampler``.

Global samples are read in order from ``consumed_samples``. Every micro step covers
``micro_batch_size * dp_size`` consecutive global indices; data-parallel rank ``r`` takes the
slice ``[r * mbs, (r + 1) * mbs)`` of it. A run resumed at ``consumed_samples`` therefore reads
exactly what the uninterrupted run would have read next.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from kilocard.data.errors import DataError


@dataclass(kw_only=True)
class PretrainingSampler:
    """Yields this rank's list of dataset indices for each micro step (a ``batch_sampler``)."""

    total_samples: int
    """Global samples in the whole run (``train_iters * global_batch_size``)."""
    consumed_samples: int
    """Global samples already trained on: where reading starts."""
    micro_batch_size: int
    """Samples per micro-batch per data-parallel rank."""
    dp_rank: int
    """This rank's data-parallel rank."""
    dp_size: int
    """Data-parallel world size."""

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise DataError(f"trainer.micro_batch_size: {self.micro_batch_size} must be >= 1")
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            raise DataError(f"data-parallel rank {self.dp_rank} of size {self.dp_size} is not a valid rank")
        if not 0 <= self.consumed_samples <= self.total_samples:
            raise DataError(
                f"consumed_samples: {self.consumed_samples} is outside [0, {self.total_samples}] "
                f"(train_iters * global_batch_size); fix: resume with the same or larger trainer.train_iters"
            )

    @property
    def samples_per_micro_step(self) -> int:
        """Global samples one micro step covers over all data-parallel ranks."""
        return self.micro_batch_size * self.dp_size

    def __len__(self) -> int:
        return (self.total_samples - self.consumed_samples) // self.samples_per_micro_step

    def __iter__(self) -> Iterator[list[int]]:
        start = self.consumed_samples + self.dp_rank * self.micro_batch_size
        for step in range(len(self)):
            first = start + step * self.samples_per_micro_step
            yield list(range(first, first + self.micro_batch_size))
