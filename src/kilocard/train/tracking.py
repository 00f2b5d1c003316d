"""Optional experiment tracking beside TensorBoard: Weights & Biases and MLflow.

Both are off by default and never required: ``trainer.wandb`` / ``trainer.mlflow`` turn them on, and the
package is imported only then. ``kilocard run`` refuses a run whose tracker package is missing before it
writes anything (``kilocard.validate.packages``); on a cluster every rank checks at start-up
(``check_available``) that the enabled packages are importable, so a missing one stops all ranks at
once with one line naming the field (exit BAD_CONFIG) instead of a traceback on rank 0. Rank 0 logs
the same scalars TensorBoard gets (``kilocard.rundir.metrics.scalars``), at the step of the record:

- W&B (``wandb_init_kwargs``): ``wandb.init(project=trainer.wandb_project, entity=trainer.wandb_entity,
  name=trainer.wandb_exp_name or the run directory's name, tags=trainer.wandb_tags,
  mode=trainer.wandb_mode, config=<the whole frozen config>, dir=<run_dir>, id=<run dir name>,
  resume="allow")``: a resumed run continues its W&B run; offline runs sync later with
  ``wandb sync <run_dir>/wandb/offline-run-*``;
- MLflow (``mlflow_settings``): tracking URI ``trainer.mlflow_tracking_uri`` (default a file store
  ``<run_dir>/mlruns``), experiment ``trainer.mlflow_experiment`` (default the recipe's name), one MLflow
  run per launch attempt named after the run directory.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any

import yaml

from kilocard.config.schema import RunConfig
from kilocard.validate.packages import TRACKERS, install_hint

PACKAGES = TRACKERS
"""``trainer.<field>`` -> the package it needs (``kilocard.validate.packages``)."""


class TrackingUnavailable(Exception):
    """A tracker is enabled but its package is not installed (exit BAD_CONFIG)."""


def enabled(cfg: RunConfig) -> list[str]:
    """The ``trainer`` fields whose package the run needs (TensorBoard, W&B, MLflow) that are on."""
    return [f for f in PACKAGES if getattr(cfg.trainer, f)]


def external(cfg: RunConfig) -> list[str]:
    """The enabled trackers besides TensorBoard (``Trackers`` logs to them)."""
    return [f for f in enabled(cfg) if f != "tensorboard"]


def check_available(cfg: RunConfig) -> None:
    """Raise ``TrackingUnavailable`` naming the first enabled tracker whose package does not import here."""
    for f in enabled(cfg):
        if importlib.util.find_spec(PACKAGES[f]) is None:
            raise TrackingUnavailable(
                f"trainer.{f}: true, but the {PACKAGES[f]} package is not installed on this node "
                f"({install_hint(f)}, or set trainer.{f}=false)"
            )


def wandb_init_kwargs(cfg: RunConfig, run_dir: Path, frozen: dict[str, Any]) -> dict[str, Any]:
    """The arguments of ``wandb.init`` for this run; ``frozen`` is the run's whole frozen config."""
    t = cfg.trainer
    return {
        "project": t.wandb_project,
        "entity": t.wandb_entity,
        "name": t.wandb_exp_name or run_dir.name,
        "tags": list(t.wandb_tags),
        "mode": t.wandb_mode,
        "config": frozen,
        "dir": str(run_dir),
        "id": run_dir.name,
        "resume": "allow",
    }


def mlflow_settings(cfg: RunConfig, run_dir: Path) -> tuple[str, str, str]:
    """``(tracking URI, experiment name, run name)`` of this run in MLflow."""
    t = cfg.trainer
    uri = t.mlflow_tracking_uri or (run_dir / "mlruns").resolve().as_uri()
    return uri, t.mlflow_experiment or cfg.recipe.name, run_dir.name


def frozen_config(run_dir: Path) -> dict[str, Any]:
    """The run's frozen ``config.yaml`` as a plain dict (what W&B records as the run's config)."""
    from kilocard.rundir.freeze import CONFIG_FILE

    data = yaml.safe_load((run_dir / CONFIG_FILE).read_text())
    return data if isinstance(data, dict) else {}


class Trackers:
    """The enabled trackers of one run, on rank 0."""

    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self._wandb: Any = None
        self._mlflow: Any = None
        if cfg.trainer.wandb:
            wandb = importlib.import_module("wandb")
            self._wandb = wandb.init(**wandb_init_kwargs(cfg, run_dir, frozen_config(run_dir)))
        if cfg.trainer.mlflow:
            self._mlflow = importlib.import_module("mlflow")
            uri, experiment, name = mlflow_settings(cfg, run_dir)
            self._mlflow.set_tracking_uri(uri)
            self._mlflow.set_experiment(experiment)
            self._mlflow.start_run(run_name=name)

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
