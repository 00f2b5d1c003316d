"""``data.split`` arithmetic, as Megatron-Core does it (torch-free: the validator uses it too).

``"969,30,1"`` is three weights (train, valid, test; missing ones are 0), normalised to sum 1
(``parse_and_normalize_split``). Split ``i`` covers the fraction ``[sum(w[:i]), sum(w[:i+1]))`` of a
prefix's documents, ``None`` when its weight is 0 (``convert_split_vector_to_split_matrix``), and
``int(round(beg * n))`` .. ``int(round(end * n))`` of ``n`` documents
(``BlendedMegatronDatasetBuilder._build_megatron_dataset_splits``). A split with a positive weight
can still get no document of a small prefix: ``split_documents`` says how many each one gets.

How many samples each split must hold follows Megatron-LM's ``get_train_valid_test_num_samples``:
the validation split is read ``eval_iters`` global batches per evaluation, at every
``eval_interval`` steps and once at the end; the test split ``eval_iters`` global batches once.
"""

from __future__ import annotations

import math
import re

from kilocard.data.errors import DataError

SPLITS = ("train", "valid", "test")
"""The three splits in ``data.split`` order."""
TRAIN, VALID, TEST = range(3)

_FIX = "fix: three weights train,valid,test, e.g. data.split='969,30,1'"


def split_weights(split: str) -> list[float]:
    """The normalised (train, valid, test) weights of ``data.split``; ``DataError`` when it is malformed."""
    parts = [p for p in re.split(r"[,/]", str(split).strip())]
    try:
        weights = [float(p) for p in parts]
    except ValueError:
        raise DataError(f"data.split: {split!r} is not comma-separated numbers; {_FIX}") from None
    if len(weights) > 3 or any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise DataError(f"data.split: {split!r} needs at most three weights >= 0 with a positive sum; {_FIX}")
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    return [w / total for w in weights]


def split_bounds(weights: list[float]) -> list[tuple[float, float] | None]:
    """Each split's ``(begin, end)`` fraction of a prefix's documents; ``None`` for a split of weight 0."""
    out: list[tuple[float, float] | None] = []
    begin = 0.0
    for w in weights:
        end = begin + w
        out.append((begin, end) if w > 0 else None)
        begin = end
    return out


def split_documents(weights: list[float], documents: int) -> list[int]:
    """How many of a prefix's ``documents`` each split gets (Megatron-Core's rounding)."""
    return [
        0 if b is None else int(round(b[1] * documents)) - int(round(b[0] * documents)) for b in split_bounds(weights)
    ]


def eval_count(train_iters: int, eval_interval: int) -> int:
    """Validation evaluations in a run: one every ``eval_interval`` steps, plus the one at the end."""
    return train_iters // eval_interval + 1


def valid_samples(train_iters: int, eval_interval: int, eval_iters: int, global_batch_size: int) -> int:
    """Validation samples the whole run reads (Megatron-LM's ``get_train_valid_test_num_samples``)."""
    return eval_count(train_iters, eval_interval) * eval_iters * global_batch_size


def valid_start(step: int, eval_interval: int, eval_iters: int, global_batch_size: int) -> int:
    """First validation sample of the evaluation at ``step``: every evaluation reads the next
    ``eval_iters`` global batches, those before it having read theirs (the same after a resume)."""
    return ((max(step, 1) - 1) // eval_interval) * eval_iters * global_batch_size
