"""``SFTDataset``: Megatron-Core's ``GPTDataset`` whose loss mask is also the assistant mask of ``preprocess --chat``.

Samples are exactly ``GPTDataset``'s (same document, sample and shuffle indices, same cache): the token
dataset ``PREFIX_text_document`` is read as pre-training reads it. Beside it, the mask dataset
``PREFIX_text_document_loss_mask`` (``kilocard.data.preprocess.mask_prefix``) holds the same documents,
1 on assistant tokens; each sample's window of it is read with the same indices, and the sample's
``loss_mask`` (over its labels, the tokens shifted left by one) is ``GPTDataset``'s times the mask of
those labels. So only assistant tokens are predicted with loss, and padding still carries none.

Packing (``data.packing``, the default): conversations follow each other in a sequence, separated by the
EOD, as pre-training documents do. With ``data.reset_position_ids`` and ``data.reset_attention_mask``
(Megatron-Core's own ``GPTDatasetConfig`` switches) position ids restart at 0 after every EOD and each
conversation attends only to itself: a block-diagonal causal mask, or on Transformer Engine the THD layout
the trainer derives from the restarting positions (``kilocard.train.megatron_adapter.packed_seq_params``).
A sample that begins inside a conversation (its start is in the sample before) carries no loss on that
piece, which has lost its prompt.

``UnpackedSFTDataset`` (``data.packing=false``): one conversation per sample, cut at ``seq_length + 1``
tokens and padded; the padding carries no loss. Its samples are the conversations in Megatron-Core's
shuffled document order (``_build_document_index``, the same seed), as many epochs as the run needs.
"""

from __future__ import annotations

import typing
from typing import Any

import numpy
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset, _build_document_index
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
        if self.config.reset_attention_mask and idx is not None and self._starts_inside(idx):
            eods = (sample["tokens"] == self.config.tokenizer.eod).nonzero()
            sample["loss_mask"][: int(eods[0]) + 1 if len(eods) else None] = 0.0
        return sample

    def _starts_inside(self, idx: int) -> bool:
        """Whether sample ``idx`` begins inside a conversation (its document offset is not 0)."""
        if self.shuffle_index is None:  # GPTDataset memory-maps its indices on first use
            self._query_document_sample_shuffle_indices(idx)
        return bool(self.sample_index[self.shuffle_index[idx]][1] > 0)


QUERY_VALUES = len(typing.get_args(typing.get_type_hints(GPTDataset._query_document_sample_shuffle_indices)["return"]))
"""How many values ``GPTDataset.__getitem__`` unpacks from ``_query_document_sample_shuffle_indices``: the
text and document ids up to megatron-core 0.18, and the document lengths after them from 0.19."""


class UnpackedSFTDataset(SFTDataset):
    """One conversation per sample, padded (``data.packing=false``; module docstring)."""

    def _build_document_sample_shuffle_indices(self) -> tuple[numpy.ndarray, None, None]:
        """The shuffled conversations, epoch after epoch until ``num_samples``: the samples themselves (no cache:
        one shuffle of the document ids, the same on every rank)."""
        documents = max(len(self.indices), 1)
        epochs = max(1, -(-(self.num_samples or documents) // documents))
        rng = numpy.random.RandomState(self.config.random_seed)
        return _build_document_index(self.indices, epochs, rng, False), None, None

    def __len__(self) -> int:
        return len(self.document_index)

    def _query_document_sample_shuffle_indices(self, idx: int) -> Any:
        """Conversation ``idx`` cut at ``seq_length + 1`` tokens and padded with the pad id, and its document id
        (and, where Megatron-Core asks for them, ``QUERY_VALUES``, the unpadded length as the one document length)."""
        doc = int(self.document_index[idx])
        window = self.config.sequence_length + self.config.add_extra_token_to_sequence
        text = self.dataset.get(doc, offset=0, length=min(window, int(self.dataset.sequence_lengths[doc])))
        padding = numpy.full(window - len(text), self._pad_token_id, dtype=numpy.int64)
        values = (numpy.concatenate([text.astype(numpy.int64), padding]), numpy.array([doc], dtype=numpy.int64))
        return values if QUERY_VALUES == 2 else (*values, [len(text)])

    def _starts_inside(self, idx: int) -> bool:
        return False
