"""The user-facing surface is frozen: config groups and CLI verbs change only on purpose.

Like torchtitan's frozen CLI-options test: a new group or verb must be added to the literal tuples
below in the same change, so the surface never grows (or shrinks) by accident.
"""

from __future__ import annotations

import argparse

import yaml

from kilocard import cli, commands
from kilocard.config.schema import CONFIG_GROUPS, RunConfig
from kilocard.paths import data_dir

FROZEN_GROUPS = (
    "model",
    "parallel",
    "precision",
    "optim",
    "data",
    "peft",
    "checkpoint",
    "trainer",
    "cluster",
    "launcher",
    "perf",
)
FROZEN_TOP_LEVEL_KEYS = ("recipe",) + FROZEN_GROUPS
FROZEN_VERBS = (
    "recipes",
    "show",
    "validate",
    "run",
    "preprocess",
    "sbatch",
    "baselines",
    "plan",
    "budget",
    "image",
    "logs",
    "runs",
    "convert",
    "goodput",
    "report",
)


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
    assert commands.VERBS == FROZEN_VERBS
    sub = next(a for a in commands.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(sub.choices) == FROZEN_VERBS
    assert tuple(commands.COMMANDS) == FROZEN_VERBS
    assert cli.main is commands.main  # the console script's entry point dispatches through the one table


def test_every_verb_module_owns_its_arguments_and_exit_code() -> None:
    """Each verb is a module with HELP, add_arguments and execute (no verb logic in kilocard.cli)."""
    for verb, module in commands.COMMANDS.items():
        assert module.__name__ == f"kilocard.commands.{verb}"
        assert module.HELP and callable(module.add_arguments) and callable(module.execute), verb
