"""The trainer's micro-batch iterator (the contract is in ``kilocard.data``'s docstring)."""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import cast

import torch
from torch.utils.data import DataLoader, Dataset

from kilocard.config.megatron import padded_vocab_size
from kilocard.config.schema import RunConfig
from kilocard.data.errors import DataError
from kilocard.data.sampler import PretrainingSampler
from kilocard.data.tokenizer import get_tokenizer

MicroBatch = dict[str, torch.Tensor | None]


class TrainIterator:
    """Micro-batches for one data-parallel rank, from a global sample position onwards."""

    def __init__(self, loader: DataLoader, sampler: PretrainingSampler) -> None:
        self._loader = loader
        self._batches = iter(loader)
        self._step_samples = sampler.samples_per_micro_step
        self._remaining = len(sampler)
        self.consumed_samples = sampler.consumed_samples
        """Global samples before the next micro step's batch (advances by ``mbs * dp_size``)."""

    def __iter__(self) -> Iterator[MicroBatch]:
        return self

    def __len__(self) -> int:
        """Micro steps left for this rank."""
        return self._remaining

    def __next__(self) -> MicroBatch:
        batch = next(self._batches)
        batch.setdefault("attention_mask", None)
        self.consumed_samples += self._step_samples
        self._remaining -= 1
        return batch


def _check_batch_and_vocab(run_cfg: RunConfig, dp_size: int, tokenizer_vocab: int) -> None:
    t = run_cfg.trainer
    if dp_size < 1 or t.global_batch_size % (t.micro_batch_size * dp_size):
        raise DataError(
            f"trainer.global_batch_size: {t.global_batch_size} is not a multiple of "
            f"micro_batch_size({t.micro_batch_size}) * dp({dp_size}); fix: adjust one of them"
        )
    m = run_cfg.model
    padded = padded_vocab_size(m, run_cfg.parallel.tensor_model_parallel_size)
    if padded < tokenizer_vocab:
        raise DataError(
            f"model.vocab_size: {m.vocab_size} (padded to {padded}) is smaller than tokenizer "
            f"{run_cfg.data.tokenizer!r} ({tokenizer_vocab} ids); fix: model.vocab_size={tokenizer_vocab}"
        )


def build_train_iterator(
    run_cfg: RunConfig,
    *,
    dp_rank: int,
    dp_size: int,
    consumed_samples: int = 0,
    cache_dir: str | None = None,
    create_attention_mask: bool = True,
) -> TrainIterator:
    """This rank's micro-batches of the train split, starting at global sample ``consumed_samples``."""
    from kilocard.data.datasets import build_train_dataset, gpt_dataset_config, train_samples

    tokenizer = get_tokenizer(run_cfg.data.tokenizer)
    _check_batch_and_vocab(run_cfg, dp_size, tokenizer.vocab_size)
    config = gpt_dataset_config(run_cfg, tokenizer, cache_dir, create_attention_mask)
    dataset = build_train_dataset(run_cfg, config)
    sampler = PretrainingSampler(
        total_samples=train_samples(run_cfg),
        consumed_samples=consumed_samples,
        micro_batch_size=run_cfg.trainer.micro_batch_size,
        dp_rank=dp_rank,
        dp_size=dp_size,
    )
    workers = run_cfg.data.num_workers
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers, persistent_workers=workers > 0)
    return TrainIterator(loader, sampler)


def build_eval_dataset(
    run_cfg: RunConfig, split: int, *, dp_size: int, cache_dir: str | None = None, create_attention_mask: bool = True
) -> Dataset | None:
    """The validation or test split (``kilocard.data.split.VALID``/``TEST``) sized for the run's evaluations;
    ``None`` for a test split that some prefix gives no document (a validation split without one is a
    ``DataError``: ``validate`` refuses it before the run). Collective like ``build_train_iterator``."""
    from kilocard.data.datasets import (
        build_split_dataset,
        check_split_documents,
        empty_prefixes,
        eval_samples,
        gpt_dataset_config,
    )
    from kilocard.data.split import TEST

    tokenizer = get_tokenizer(run_cfg.data.tokenizer)
    _check_batch_and_vocab(run_cfg, dp_size, tokenizer.vocab_size)
    config = gpt_dataset_config(run_cfg, tokenizer, cache_dir, create_attention_mask)
    if split == TEST and empty_prefixes(config, split):
        return None
    check_split_documents(config, split, "more documents, a larger valid weight, or trainer.eval_interval=null")
    return build_split_dataset(config, split, eval_samples(run_cfg, split), run_cfg.data.sft, run_cfg.data.packing)


def eval_batches(
    dataset: Dataset, run_cfg: RunConfig, *, start: int, rounds: int, dp_rank: int, dp_size: int
) -> Iterator[MicroBatch]:
    """This rank's micro-batches of ``rounds`` global batches of ``dataset`` from global sample ``start``
    (the sampler's order; a short dataset is read round again from its first sample)."""
    t = run_cfg.trainer
    per_step = t.micro_batch_size * dp_size
    micro = rounds * (t.global_batch_size // per_step)
    size = len(cast(Sized, dataset))
    batches = (
        [(start + k * per_step + dp_rank * t.micro_batch_size + j) % size for j in range(t.micro_batch_size)]
        for k in range(micro)
    )
    for batch in DataLoader(dataset, batch_sampler=list(batches)):
        batch.setdefault("attention_mask", None)
        yield batch
