"""Optional trackers (TensorBoard, W&B, MLflow): each an extra, the external ones off by default.

Neither wandb nor mlflow is installed in kilocard's test venv (and the shared venv may not be changed), so
these tests cover the disabled path, the missing-package error (a package made unimportable with
``sys.modules[name] = None``, what Python does for a missing one), and the mapping of the config to the
packages' own arguments (``wandb.init``, ``mlflow.set_tracking_uri``/``set_experiment``/``start_run``):
the calls are received by stand-in modules recording them, since the real packages are absent here."""

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


def test_external_trackers_are_off_by_default_and_need_nothing() -> None:
    from kilocard.train.tracking import external

    cfg = _cfg()
    assert enabled(cfg) == [] and external(cfg) == []  # TensorBoard too: off unless asked (torchtitan, Megatron-LM)
    check_available(cfg)
    assert enabled(_cfg("trainer.tensorboard=true")) == ["tensorboard"]


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
    assert "pip install 'kilocard[wandb]', or trainer.wandb=false" in out + err
    assert "Traceback" not in out + err and not root.exists()


def test_wandb_gets_project_entity_name_tags_mode_and_the_whole_frozen_config(tmp_path) -> None:
    from kilocard.rundir.freeze import write_frozen
    from kilocard.train.tracking import frozen_config, wandb_init_kwargs

    overrides = [
        "trainer.wandb=true",
        "trainer.wandb_project=llm",
        "trainer.wandb_entity=team-a",
        "trainer.wandb_exp_name=lr-sweep-3",
        "trainer.wandb_tags=[llama,lr]",
        "trainer.wandb_mode=online",
    ]
    run_dir = tmp_path / "tiny_gpt-20260101-120000"
    run_dir.mkdir()
    write_frozen(compose(["recipe=tiny_gpt", *overrides]), run_dir)
    frozen = frozen_config(run_dir)
    assert frozen["trainer"]["wandb_tags"] == ["llama", "lr"] and frozen["model"]["num_layers"] > 0
    kwargs = wandb_init_kwargs(_cfg(*overrides), run_dir, frozen)
    assert kwargs == {
        "project": "llm", "entity": "team-a", "name": "lr-sweep-3", "tags": ["llama", "lr"], "mode": "online",
        "config": frozen, "dir": str(run_dir), "id": run_dir.name, "resume": "allow",
    }  # fmt: skip
    default = wandb_init_kwargs(_cfg("trainer.wandb=true"), run_dir, frozen)
    assert (default["project"], default["entity"], default["name"], default["mode"]) == (
        "kilocard",
        None,
        run_dir.name,
        "offline",
    )


def test_mlflow_gets_the_tracking_uri_and_experiment(tmp_path) -> None:
    from kilocard.train.tracking import mlflow_settings

    assert mlflow_settings(_cfg("trainer.mlflow=true"), tmp_path) == (tmp_path.resolve().as_uri() + "/mlruns",
                                                                        "tiny_gpt", tmp_path.name)  # fmt: skip
    cfg = _cfg("trainer.mlflow=true", "trainer.mlflow_tracking_uri=http://mlflow.example:5000",
               "trainer.mlflow_experiment=pretrain")  # fmt: skip
    assert mlflow_settings(cfg, tmp_path) == ("http://mlflow.example:5000", "pretrain", tmp_path.name)


def test_trackers_call_the_packages_with_those_arguments(tmp_path, monkeypatch) -> None:
    """Stand-in ``wandb``/``mlflow`` modules record the calls (the real packages are not installed here)."""
    import sys
    import types

    from kilocard.rundir.freeze import write_frozen
    from kilocard.train.tracking import Trackers

    calls: list[tuple[str, object]] = []

    def record(name: str):
        return lambda *a, **kw: calls.append((name, a or kw))

    run = types.SimpleNamespace(log=record("wandb.log"), finish=record("wandb.finish"))
    wandb = types.SimpleNamespace(init=lambda **kw: calls.append(("wandb.init", kw)) or run)
    mlflow_calls = ("set_tracking_uri", "set_experiment", "start_run", "log_metrics", "end_run")
    mlflow = types.SimpleNamespace(**{name: record(f"mlflow.{name}") for name in mlflow_calls})
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    overrides = ["trainer.wandb=true", "trainer.mlflow=true", "trainer.mlflow_experiment=pretrain"]
    write_frozen(compose(["recipe=tiny_gpt", *overrides]), tmp_path)
    t = Trackers(_cfg(*overrides), tmp_path)
    t.log({"train/loss": 2.5}, step=3)
    t.close()
    names = [c[0] for c in calls]
    assert names == ["wandb.init", "mlflow.set_tracking_uri", "mlflow.set_experiment", "mlflow.start_run",
                     "wandb.log", "mlflow.log_metrics", "wandb.finish", "mlflow.end_run"]  # fmt: skip
    assert calls[0][1]["config"]["trainer"]["mlflow_experiment"] == "pretrain"
    assert (
        calls[2][1] == ("pretrain",) and calls[4][1] == ({"train/loss": 2.5},) and calls[5][1] == ({"train_loss": 2.5},)
    )


@pytest.mark.parametrize("field", ["tensorboard", "wandb", "mlflow"])
def test_a_missing_extra_is_one_line_naming_the_extra(field, monkeypatch) -> None:
    import sys

    from kilocard.validate.packages import tracker_issues

    monkeypatch.setitem(sys.modules, field, None)  # what an install without the extra looks like to find_spec
    cfg = _cfg(f"trainer.{field}=true")
    (issue,) = tracker_issues(cfg)
    assert (
        issue.field == f"trainer.{field}" and issue.hint == f"pip install 'kilocard[{field}]', or trainer.{field}=false"
    )
    with pytest.raises(TrackingUnavailable, match=rf"pip install 'kilocard\[{field}\]', or set trainer.{field}=false"):
        check_available(cfg)


def test_a_wandb_mode_typo_is_refused_by_validate() -> None:
    from kilocard.validate import validate

    issues = [i for i in validate(_cfg("trainer.wandb_mode=ofline")).issues if i.code == "WANDB_MODE"]
    assert len(issues) == 1 and "expected one of online, offline" in issues[0].message


def test_plan_plot_without_matplotlib_is_one_line(monkeypatch, capsys) -> None:
    import sys

    from kilocard.commands import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plan", "recipe=tiny_gpt", "--plot", "p.png"]) == 2
    err = capsys.readouterr().err
    assert err == "kilocard plan: error: --plot p.png: needs matplotlib (pip install 'kilocard[plots]')\n"
