"""Build the train, validation and test splits with Megatron-Core: ``GPTDataset`` or ``MockGPTDataset`` (mock).

Everything goes through Megatron-Core's ``BlendedMegatronDatasetBuilder`` and ``GPTDatasetConfig``;
kilocard only maps its config onto them and checks the input first, so that a bad path or an
empty split is one clear ``DataError`` instead of an assertion (or an endless loop) deep inside.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sized
from pathlib import Path
from typing import cast

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.tokenizers import MegatronTokenizerBase
from torch.utils.data import Dataset

from kilocard.base.safe_read import FileReadError, require_regular
from kilocard.config.schema import RunConfig
from kilocard.data.errors import DataError
from kilocard.data.paths import DATA_TYPES, parse_blend
from kilocard.data.split import SPLITS, TEST, TRAIN, split_documents, split_weights, valid_samples


class _MockCacheNotice(logging.Filter):
    """Drops Megatron's warning that mock indices are not cached: kilocard does that on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "MockGPTDataset indexes because path_to_cache is None" not in record.getMessage()


logging.getLogger("megatron.core.datasets.gpt_dataset").addFilter(_MockCacheNotice())


def train_samples(run_cfg: RunConfig) -> int:
    """Global samples the whole run reads: ``trainer.train_iters * trainer.global_batch_size``."""
    return run_cfg.trainer.train_iters * run_cfg.trainer.global_batch_size


def cache_path(run_cfg: RunConfig, cache_dir: str | None) -> str | None:
    """Index-cache folder: ``data.path_to_cache``, else ``cache_dir``, else Megatron's default (None).

    Mock data is never cached: every rank rebuilds its (deterministic) index in well under a second.
    """
    if run_cfg.data.type == "mock":
        return None
    chosen = run_cfg.data.path_to_cache or cache_dir
    return str(Path(chosen).expanduser().resolve()) if chosen else None


def gpt_dataset_config(
    run_cfg: RunConfig,
    tokenizer: MegatronTokenizerBase,
    cache_dir: str | None = None,
    create_attention_mask: bool = True,
) -> GPTDatasetConfig:
    """Megatron-Core's ``GPTDatasetConfig`` for ``run_cfg`` (all three splits of ``data.split``)."""
    data = run_cfg.data
    if data.type not in DATA_TYPES:
        raise DataError(
            f"data.type: {data.type!r} is not one of {', '.join(DATA_TYPES)}; fix: data=mock or data=tiny_corpus"
        )
    split_weights(data.split)  # one line naming data.split instead of Megatron's assertion
    blend: tuple[list[str], list[float] | None] | None = None
    if data.type == "indexed":
        blend = parse_blend(data.data_path)
    try:
        config = GPTDatasetConfig(
            random_seed=data.random_seed,
            sequence_length=run_cfg.model.seq_length,
            blend=blend,
            split=data.split,
            tokenizer=tokenizer,
            reset_position_ids=data.reset_position_ids,
            reset_attention_mask=data.reset_attention_mask,
            eod_mask_loss=False,
            create_attention_mask=create_attention_mask,
            path_to_cache=cache_path(run_cfg, cache_dir),
        )
    except (AssertionError, ValueError) as err:
        raise DataError(
            f"data.split: {data.split!r} is not a valid split ({err}); fix: e.g. data.split='969,30,1'"
        ) from err
    if config.split_matrix[TRAIN] is None and not run_cfg.trainer.skip_train:
        raise DataError(f"data.split: {data.split!r} gives the train split no share; fix: a positive first weight")
    return config


def _prefix_documents(prefix: str) -> int:
    """Documents in the indexed dataset ``prefix`` (its ``.bin``/``.idx`` memory-mapped by Megatron-Core,
    so each is checked to be a regular file first)."""
    for suffix in (".bin", ".idx"):
        try:
            require_regular(f"{prefix}{suffix}")
        except FileReadError as err:
            raise DataError(f"data.data_path: {err}; fix: a prefix of a .bin/.idx pair") from None
    return len(IndexedDataset(prefix).document_indices) - 1


def empty_prefixes(config: GPTDatasetConfig, split: int) -> list[tuple[str, int]]:
    """``(prefix, documents)`` of every prefix that puts no document in ``split`` (all of them when its weight
    is 0; none for mock data, whose 100,000 synthetic documents fill every split with a positive weight)."""
    weights = split_weights(config.split)
    if config.mock:
        return [] if weights[split] > 0 else [("mock", 0)]
    counts = [(p, _prefix_documents(p)) for p in config.blend[0]]
    return [(p, n) for p, n in counts if split_documents(weights, n)[split] < 1]


def check_split_documents(config: GPTDatasetConfig, split: int, fix: str) -> None:
    """``DataError`` when a prefix gets no document of ``split`` (Megatron loops forever on it otherwise)."""
    empty = empty_prefixes(config, split)
    if empty:
        prefix, count = empty[0]
        raise DataError(
            f"data.split: {config.split!r} leaves no {SPLITS[split]} document in {prefix} ({count} documents); "
            f"fix: {fix}"
        )


def _disable_mask_cache(dataset: Dataset) -> None:
    """Turn off GPTDataset's mask cache, which makes a sample depend on what was read first.

    Megatron-Core 0.16.1 caches the first sample's loss mask *before* zeroing that sample's pad
    positions in place, so every later sample inherits them: masks would depend on where reading
    started, and a resumed run would not reproduce the uninterrupted one. Computing the masks per
    sample costs one small tensor op.
    """
    for ds in getattr(dataset, "datasets", None) or [dataset]:
        if hasattr(ds, "masks_and_position_ids_are_cacheable"):
            ds.masks_and_position_ids_are_cacheable = False


def dataset_class(config: GPTDatasetConfig, sft: bool, packing: bool = True) -> type[GPTDataset]:
    """``MockGPTDataset`` for mock data, ``SFTDataset`` (``kilocard.data.sft``) for ``data.sft`` (its
    ``UnpackedSFTDataset`` without ``data.packing``), else ``GPTDataset``."""
    if not packing and not sft:
        raise DataError(
            "data.packing: false (one conversation per sequence) needs data.sft=true; fix: data.packing=true"
        )
    if config.mock:
        if sft:
            raise DataError("data.sft: true needs conversations, not mock data; fix: data=tiny_chat or data.sft=false")
        return MockGPTDataset
    if sft:
        from kilocard.data.sft import SFTDataset, UnpackedSFTDataset

        return SFTDataset if packing else UnpackedSFTDataset
    return GPTDataset


def build_split_dataset(
    config: GPTDatasetConfig, split: int, needed: int, sft: bool = False, packing: bool = True
) -> Dataset:
    """Split ``split`` (``kilocard.data.split.TRAIN``/``VALID``/``TEST``) as a map-style dataset built for
    ``needed`` samples; the other splits are not built. ``sft``: with the assistant-only loss mask;
    ``packing``: several conversations per sample (``data.packing``).

    Collective when torch.distributed is initialised (rank 0 builds the index cache first).
    """
    cls = dataset_class(config, sft, packing)
    only = copy.copy(config)
    only.split_matrix = [m if i == split else None for i, m in enumerate(config.split_matrix)]
    sizes = [needed if i == split else 0 for i in range(len(config.split_matrix))]
    dataset = BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, only).build()[split]
    _disable_mask_cache(dataset)
    return dataset


def build_train_dataset(run_cfg: RunConfig, config: GPTDatasetConfig) -> Dataset:
    """The train split as a map-style dataset of at least ``train_samples(run_cfg)`` samples."""
    if not config.mock:
        check_split_documents(config, TRAIN, "more documents or a larger train weight")
    needed = train_samples(run_cfg)
    dataset = build_split_dataset(config, TRAIN, needed, run_cfg.data.sft, run_cfg.data.packing)
    have = len(cast(Sized, dataset))
    if have < needed:
        raise DataError(
            f"data.data_path: the unweighted blend gives {have} train samples but the run needs "
            f"{needed}; fix: give weights ([w1, p1, w2, p2]) so Megatron draws more epochs"
        )
    return dataset


def eval_samples(run_cfg: RunConfig, split: int) -> int:
    """Samples the run's evaluations read from ``split`` (VALID or TEST; ``kilocard.data.split``)."""
    t = run_cfg.trainer
    if split == TEST:
        return t.eval_iters * t.global_batch_size
    return valid_samples(t.train_iters, t.eval_interval or t.train_iters or 1, t.eval_iters, t.global_batch_size)
