"""Build a ``RunConfig`` from dotted ``group.field`` values without Hydra (fast unit tests)."""

from __future__ import annotations

import dataclasses

from kilocard.config.schema import RunConfig


def cfg_of(values: dict[str, object]) -> RunConfig:
    """The schema defaults with ``values`` (``{"parallel.tensor_model_parallel_size": 2, ...}``) set."""
    cfg, groups = RunConfig(), {}
    for path, v in values.items():
        g, f = path.split(".")
        groups.setdefault(g, {})[f] = v
    return dataclasses.replace(cfg, **{g: dataclasses.replace(getattr(cfg, g), **fs) for g, fs in groups.items()})
