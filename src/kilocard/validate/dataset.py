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
from kilocard.validate.issues import Issue, not_one_of


def rule_data_type(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``DATA_TYPE``: ``data.type`` is one the trainer builds."""
    fix = "choose the data group: data=mock or data=tiny_corpus (or data.type=indexed with data.data_path)"
    yield from not_one_of("DATA_TYPE", "data.type", cfg.data.type, DATA_TYPES, fix)


RULES = (rule_data_type,)
"""``data.split`` is ``kilocard.validate.evaluation``'s (its arithmetic is Megatron-Core's)."""
