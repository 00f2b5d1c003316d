"""Optional trackers (W&B offline, MLflow file store): off by default and never required.

Neither package is installed in kilocard's venv (and the shared venv may not be changed), so these
tests cover the disabled path and the missing-package error; the logging calls themselves are not
exercised here."""

from __future__ import annotations

import importlib.util

import pytest

from kilocard.config.compose import compose
from kilocard.config.schema import RunConfig
from kilocard.rundir.metrics import scalars
from kilocard.train.tracking import PACKAGES, TrackingUnavailable, check_available, enabled

MISSING = [f for f, pkg in PACKAGES.items() if importlib.util.find_spec(pkg) is None]


def _cfg(*overrides: str) -> RunConfig:
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose(["recipe=tiny_gpt", *overrides]))


def test_trackers_are_off_by_default_and_need_nothing() -> None:
    cfg = _cfg()
    assert enabled(cfg) == []
    check_available(cfg)  # no package needed


@pytest.mark.parametrize("field", MISSING)
def test_an_enabled_tracker_without_its_package_names_the_field(field: str) -> None:
    with pytest.raises(
        TrackingUnavailable, match=rf"^trainer\.{field}: true, but the {field} package is not installed"
    ):
        check_available(_cfg(f"trainer.{field}=true"))


def test_trackers_get_the_tensorboard_scalars() -> None:
    rec = {"step": 3, "time": 1.7e9, "loss": 2.5, "slowest_rank": 1, "mfu_peak": "cpu", "ok": True}
    assert scalars(rec) == {"train/loss": 2.5, "train/slowest_rank": 1.0}


@pytest.mark.skipif("wandb" not in MISSING, reason="wandb is installed here")
def test_run_with_wandb_missing_is_refused_before_anything_is_written(tmp_path, capsys) -> None:
    from kilocard.commands import main

    root = tmp_path / "runs"
    rc = main(["run", "recipe=tiny_gpt", "trainer.wandb=true", f"cluster.shared_fs={root}"])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert "trainer.wandb is on, but the wandb package is not installed here" in out + err
    assert "pip install wandb, or trainer.wandb=false" in out + err
    assert "Traceback" not in out + err and not root.exists()
