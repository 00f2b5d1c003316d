"""Pieces several verbs share: the Hydra override arguments and the one validation call."""

from __future__ import annotations

import argparse

from kilocard.config.schema import RunConfig
from kilocard.validate import validate
from kilocard.validate.issues import Report


def add_config_args(p: argparse.ArgumentParser, multirun: bool = True) -> None:
    """The Hydra overrides (and ``-m/--multirun`` where a verb takes a sweep)."""
    p.add_argument("overrides", nargs="*", help="Hydra overrides: recipe=NAME, a.b=v, +a.new=v, ~a.b, group=option")
    if multirun:
        p.add_argument("-m", "--multirun", action="store_true", help="one config per sweep point (a=1,2)")


def check_config(run_cfg: RunConfig) -> Report:
    """Everything checked before a config is launched: ``validate``, ``run`` and ``sbatch`` call this."""
    return validate(run_cfg)
