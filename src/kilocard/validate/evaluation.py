"""Evaluation rules (``trainer.eval_interval``, ``trainer.eval_iters``, ``trainer.skip_train``).

Pure: they read the config only. ``data.split``'s arithmetic is Megatron-Core's
(``kilocard.data.split``); whether a small prefix gets a validation *document* depends on its
document count, which the input checks read (``kilocard.validate.datarecord``).
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.data.errors import DataError
from kilocard.data.split import SPLITS, TRAIN, VALID, split_weights, valid_samples
from kilocard.layout import Layout
from kilocard.validate.inputs import MAX_TRAIN_SAMPLES
from kilocard.validate.issues import Issue, error

SPLIT_FIX = "set data.split='969,30,1' (train, valid, test weights)"


def rule_split_form(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``DATA_SPLIT``: ``data.split`` is at most three weights >= 0 with a positive sum, the train one positive
    unless ``trainer.skip_train``."""
    try:
        weights = split_weights(cfg.data.split)
    except DataError as err:
        what, _ = err.parts()
        yield error("DATA_SPLIT", "data.split", cfg.data.split, what.removeprefix("data.split: "), SPLIT_FIX)
        return
    if weights[TRAIN] == 0 and not cfg.trainer.skip_train:
        yield error(
            "DATA_SPLIT",
            "data.split",
            cfg.data.split,
            f"data.split={cfg.data.split!r} gives the train split no share",
            f"{SPLIT_FIX}, or trainer.skip_train=true to evaluate only",
        )


def rule_eval_split(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``EVAL_SPLIT_EMPTY``: with ``trainer.eval_interval`` set, ``data.split`` gives the validation split a share."""
    if not cfg.trainer.eval_interval:
        return
    try:
        weights = split_weights(cfg.data.split)
    except DataError:
        return  # rule_split_form reports it
    if weights[VALID] == 0:
        yield error(
            "EVAL_SPLIT_EMPTY",
            "data.split",
            cfg.data.split,
            f"data.split={cfg.data.split!r} leaves the {SPLITS[VALID]} split empty, but trainer.eval_interval="
            f"{cfg.trainer.eval_interval} evaluates on it",
            f"{SPLIT_FIX}, or trainer.eval_interval=null for no evaluation",
        )


def rule_skip_train_evaluates(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``SKIP_TRAIN_NO_EVAL``: ``trainer.skip_train`` (evaluate only) needs ``trainer.eval_interval``."""
    if cfg.trainer.skip_train and not cfg.trainer.eval_interval:
        yield error(
            "SKIP_TRAIN_NO_EVAL",
            "trainer.skip_train",
            True,
            "trainer.skip_train=true neither trains nor evaluates without trainer.eval_interval",
            "set trainer.eval_interval (e.g. 1000) and trainer.eval_iters, or trainer.skip_train=false",
        )


def rule_skip_train_loads(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``SKIP_TRAIN_NO_LOAD``: ``trainer.skip_train`` evaluates a checkpoint, so it needs ``checkpoint.load``
    (without one it would evaluate the random initialisation and exit 0, a loss that means nothing)."""
    if cfg.trainer.skip_train and cfg.checkpoint.load is None:
        yield error(
            "SKIP_TRAIN_NO_LOAD",
            "checkpoint.load",
            None,
            "trainer.skip_train=true evaluates a checkpoint, but checkpoint.load is null: it would evaluate a "
            "randomly initialised model",
            "set checkpoint.load=DIR (a run's checkpoints, or `kilocard convert hf-to-mcore` output), or "
            "trainer.skip_train=false",
        )


def rule_eval_samples(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``EVAL_SAMPLES``: the samples every evaluation of the run reads (validation ``eval_iters`` global batches
    at each evaluation, the test split once) fit Megatron-Core's dataset index, as the train samples do."""
    t = cfg.trainer
    if not t.eval_interval or t.eval_interval < 1 or t.eval_iters < 1 or t.global_batch_size < 1:
        return  # no evaluation, or the fields' domains name them
    samples = valid_samples(t.train_iters, t.eval_interval, t.eval_iters, t.global_batch_size) + t.eval_iters * (
        t.global_batch_size
    )
    if samples > MAX_TRAIN_SAMPLES:
        yield error(
            "EVAL_SAMPLES",
            "trainer.eval_iters",
            t.eval_iters,
            f"trainer.eval_iters({t.eval_iters}) x trainer.global_batch_size({t.global_batch_size}) at every "
            f"evaluation is {samples} samples; Megatron-Core's dataset index holds at most 2**36",
            "a smaller trainer.eval_iters (Megatron-LM's default is 100) or a larger trainer.eval_interval",
        )


RULES = (rule_split_form, rule_eval_split, rule_skip_train_evaluates, rule_skip_train_loads, rule_eval_samples)
