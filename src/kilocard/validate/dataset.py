"""Rules on the dataset fields the ranks build Megatron-Core's dataset from (``kilocard.data.datasets``).

Without them a bad ``data.type`` is refused only on the ranks, after the run directory
is written and the job waited in the queue. The input files themselves are checked by
``kilocard.validate.inputpaths`` (they need the filesystem).
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.data.paths import DATA_TYPES
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error, not_one_of


def rule_data_type(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``DATA_TYPE``: ``data.type`` is one the trainer builds."""
    fix = "choose the data group: data=mock or data=tiny_corpus (or data.type=indexed with data.data_path)"
    yield from not_one_of("DATA_TYPE", "data.type", cfg.data.type, DATA_TYPES, fix)


def rule_sft_data(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``SFT_LOSS_MASK``: ``data.sft`` needs indexed conversations (each prefix's mask is checked with the files)."""
    if cfg.data.sft and cfg.data.type != "indexed":
        yield error(
            "SFT_LOSS_MASK",
            "data.sft",
            True,
            f"data.sft=true needs conversations with their loss mask, but data.type is {cfg.data.type!r}",
            "data=tiny_chat, or your `kilocard preprocess --chat` output in data.data_path (data.type=indexed)",
        )


RULES = (rule_data_type, rule_sft_data)
"""``data.split`` is ``kilocard.validate.evaluation``'s (its arithmetic is Megatron-Core's)."""
