"""Rules on the dataset fields the ranks build Megatron-Core's dataset from (``kilocard.data.datasets``).

Without them a bad ``data.type`` or ``data.split`` is refused only on the ranks, after the run directory
is written and the job waited in the queue. The input files themselves are checked by
``kilocard.validate.inputpaths`` (they need the filesystem).
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.data.paths import DATA_TYPES, split_problem
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error, not_one_of


def rule_data_type(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``DATA_TYPE``: ``data.type`` is one the trainer builds."""
    fix = "choose the data group: data=mock or data=tiny_corpus (or data.type=indexed with data.data_path)"
    yield from not_one_of("DATA_TYPE", "data.type", cfg.data.type, DATA_TYPES, fix)


def rule_data_split(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``DATA_SPLIT``: for indexed data, ``data.split`` is one to three weights >= 0 with a positive train
    weight (the mock dataset ignores it)."""
    if cfg.data.type != "indexed":
        return
    problem = split_problem(cfg.data.split)
    if problem:
        yield error(
            "DATA_SPLIT",
            "data.split",
            cfg.data.split,
            f"data.split={cfg.data.split!r} {problem}",
            "set data.split='969,30,1' (train, valid, test weights)",
        )


RULES = (rule_data_type, rule_data_split)
