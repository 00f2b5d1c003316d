"""Optional packages a config switches on, checked where the ranks will run (``kilocard run``: here).

TensorBoard (``trainer.tensorboard``, on in the benchmark trainer), W&B and MLflow are off by default;
each is an extra of kilocard (``pip install 'kilocard[tensorboard]'``, ``docs/install.md``). A run that
turns one on must find its package, or it is refused before its run directory is written, with one
line naming the field and the fix. On a cluster the batch script's preflight checks the nodes instead.
"""

from __future__ import annotations

import importlib.util

from kilocard.config.schema import RunConfig
from kilocard.validate.issues import Issue, error

TRACKERS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""``trainer.<field>`` -> the package it needs; each is kilocard's extra of the same name."""


def install_hint(extra: str) -> str:
    """How to install kilocard's extra ``extra`` (``pip install 'kilocard[wandb]'``)."""
    return f"pip install 'kilocard[{extra}]'"


def importable(module: str) -> bool:
    """Whether ``module`` can be imported in this Python."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def tracker_issues(cfg: RunConfig) -> list[Issue]:
    """One error per enabled tracker whose package is not installed here."""
    return [
        error(
            "PACKAGE_MISSING",
            f"trainer.{name}",
            True,
            f"trainer.{name} is on, but the {module} package is not installed here",
            f"{install_hint(name)}, or trainer.{name}=false",
        )
        for name, module in TRACKERS.items()
        if getattr(cfg.trainer, name) and not importable(module)
    ]
