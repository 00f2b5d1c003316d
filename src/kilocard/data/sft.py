"""``SFTDataset``: Megatron-Core's ``GPTDataset`` whose loss mask is also the assistant mask of ``preprocess --chat``.

Samples are exactly ``GPTDataset``'s (same document, sample and shuffle indices, same cache): the token
dataset ``PREFIX_text_document`` is read as pre-training reads it. Beside it, the mask dataset
``PREFIX_text_document_loss_mask`` (``kilocard.data.preprocess.mask_prefix``) holds the same documents,
1 on assistant tokens; each sample's window of it is read with the same indices, and the sample's
``loss_mask`` (over its labels, the tokens shifted left by one) is ``GPTDataset``'s times the mask of
those labels. So only assistant tokens are predicted with loss, and padding still carries none.

Conversations are concatenated into sequences as pre-training documents are, separated by the EOD;
attention is causal over the whole sequence (a conversation can see the one before it in its
sequence) and position ids run on: packing with attention kept inside each conversation is not done yet.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset

from kilocard.base.safe_read import FileReadError, require_regular
from kilocard.data.errors import DataError
from kilocard.data.record import mask_prefix


def open_mask(prefix: str, tokens: IndexedDataset) -> IndexedDataset:
    """The mask dataset beside ``prefix``; ``DataError`` when it is missing or not shaped like ``tokens``."""
    masked = mask_prefix(prefix)
    try:
        for suffix in (".bin", ".idx"):
            require_regular(f"{masked}{suffix}")  # Megatron-Core memory-maps both itself
    except FileReadError:
        raise DataError(
            f"data.data_path: {prefix} has no loss mask ({masked}.bin/.idx) but data.sft is true; "
            f"fix: build it with `kilocard preprocess --chat`, or data.sft=false"
        ) from None
    mask = IndexedDataset(masked)
    if not numpy.array_equal(mask.sequence_lengths, tokens.sequence_lengths):
        raise DataError(
            f"data.data_path: {masked} does not have the documents of {prefix}; "
            f"fix: rebuild both with one `kilocard preprocess --chat`"
        )
    return mask


class SFTDataset(GPTDataset):
    """``GPTDataset`` with the assistant-only loss mask of ``preprocess --chat`` (module docstring)."""

    dataset: IndexedDataset
    """The token ids (``GPTDataset``'s attribute, set by its constructor; its type stated here for mypy)."""

    def __init__(self, indexed_dataset: IndexedDataset, dataset_path: str | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(indexed_dataset, dataset_path, *args, **kwargs)
        assert dataset_path is not None, "SFT data is read from files"
        self.mask_dataset = open_mask(dataset_path, indexed_dataset)
        """The assistant mask, one entry per token of ``self.dataset``."""
        self.masks_and_position_ids_are_cacheable = False  # every sample has its own mask

    def _assistant_window(self, idx: int | None) -> torch.Tensor:
        """The mask of sample ``idx``'s window (``seq_length + 1`` entries), read with the token indices."""
        tokens = self.dataset
        self.dataset = self.mask_dataset
        try:
            window, *_ = self._query_document_sample_shuffle_indices(0 if idx is None else idx)  # 0.19: 3 values
        finally:
            self.dataset = tokens
        return torch.from_numpy(window == 1)

    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        sample = super().__getitem__(idx)
        window = self._assistant_window(idx)
        labels = window[1:] if self.config.add_extra_token_to_sequence else torch.roll(window, -1)
        sample["loss_mask"] = sample["loss_mask"] * labels[: len(sample["loss_mask"])].float()
        return sample
