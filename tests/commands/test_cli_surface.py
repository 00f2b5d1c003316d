"""The user-facing surface is frozen: config groups and CLI verbs change only on purpose.

Like torchtitan's frozen CLI-options test: a new group or verb must be added to the literal tuples
below in the same change, so the surface never grows (or shrinks) by accident.
"""

from __future__ import annotations

import argparse

import yaml

from kilocard import cli
from kilocard.config.schema import CONFIG_GROUPS, RunConfig
from kilocard.paths import data_dir

FROZEN_GROUPS = ("model", "parallel", "precision", "optim", "data", "checkpoint", "trainer", "cluster", "launcher")
FROZEN_TOP_LEVEL_KEYS = ("recipe",) + FROZEN_GROUPS
FROZEN_VERBS = ("recipes", "show", "validate", "run", "preprocess", "sbatch", "baselines", "plan", "convert")


def test_config_groups_are_frozen() -> None:
    assert CONFIG_GROUPS == FROZEN_GROUPS
    conf_dirs = tuple(sorted(p.name for p in data_dir("conf").iterdir() if p.is_dir()))
    assert conf_dirs == tuple(sorted(FROZEN_GROUPS))


def test_top_level_config_keys_are_frozen() -> None:
    assert tuple(RunConfig.__dataclass_fields__) == FROZEN_TOP_LEVEL_KEYS


def test_root_defaults_list_selects_every_group_once_in_order() -> None:
    defaults = yaml.safe_load((data_dir("conf") / "config.yaml").read_text())["defaults"]
    groups = [next(iter(d)) for d in defaults if isinstance(d, dict)]
    assert tuple(g for g in groups if g != "recipes") == FROZEN_GROUPS
    assert defaults[0] == "kilocard_schema" and defaults[-1] == "_self_"


def test_cli_verbs_are_frozen() -> None:
    assert cli.VERBS == FROZEN_VERBS
    sub = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(sub.choices) == FROZEN_VERBS
    assert tuple(cli.COMMANDS) == FROZEN_VERBS
