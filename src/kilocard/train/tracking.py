"""Optional experiment tracking beside TensorBoard: Weights & Biases (offline) and MLflow (a local file store).

Both are off by default and never required: ``trainer.wandb`` / ``trainer.mlflow`` turn them on, and the
package is imported only then. ``kilocard run`` refuses a run whose tracker package is missing before it
writes anything (``kilocard.validate.packages``); on a cluster every rank checks at start-up
(``check_available``) that the enabled packages are importable, so a missing one stops all ranks at
once with one line naming the field (exit BAD_CONFIG) instead of a traceback on rank 0. Rank 0 logs
the same scalars TensorBoard gets (``kilocard.rundir.metrics.scalars``), at the step of the record:

- W&B: ``wandb.init(mode="offline", dir=<run_dir>, id=<run dir name>, resume="allow")``; sync later with
  ``wandb sync <run_dir>/wandb/offline-run-*``;
- MLflow: tracking URI ``file://<run_dir>/mlruns``, one MLflow run per launch attempt named after the run
  directory.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

from kilocard.config.schema import RunConfig
from kilocard.validate.packages import TRACKERS

PACKAGES = TRACKERS
"""``trainer.<field>`` -> the package it needs (``kilocard.validate.packages``)."""


class TrackingUnavailable(Exception):
    """A tracker is enabled but its package is not installed (exit BAD_CONFIG)."""


def enabled(cfg: RunConfig) -> list[str]:
    """The ``trainer`` tracking fields that are on."""
    return [f for f in PACKAGES if getattr(cfg.trainer, f)]


def check_available(cfg: RunConfig) -> None:
    """Raise ``TrackingUnavailable`` naming the first enabled tracker whose package does not import here."""
    for f in enabled(cfg):
        if importlib.util.find_spec(PACKAGES[f]) is None:
            raise TrackingUnavailable(
                f"trainer.{f}: true, but the {PACKAGES[f]} package is not installed on this node "
                f"(pip install {PACKAGES[f]}, or set trainer.{f}=false)"
            )


class Trackers:
    """The enabled trackers of one run, on rank 0."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self._wandb: Any = None
        self._mlflow: Any = None
        if cfg.trainer.wandb:
            wandb = importlib.import_module("wandb")
            self._wandb = wandb.init(
                mode="offline", dir=str(run_dir), project="kilocard", id=run_dir.name, resume="allow"
            )
        if cfg.trainer.mlflow:
            self._mlflow = importlib.import_module("mlflow")
            self._mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
            self._mlflow.start_run(run_name=run_dir.name)

    def log(self, scalars: dict[str, float], step: int) -> None:
        """Log one step's scalars to every enabled tracker."""
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        if self._mlflow is not None:
            self._mlflow.log_metrics({k.replace("/", "_"): v for k, v in scalars.items()}, step=step)

    def close(self) -> None:
        """Finish the tracker runs."""
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()
