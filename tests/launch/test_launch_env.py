"""The ranks of ``kilocard run`` get the run's environment: layout defaults < cluster.env < launcher.env."""

from __future__ import annotations

from kilocard.config.compose import compose
from kilocard.launch.local import rank_env
from kilocard.launch.rundir import create_run_dir
from kilocard.launch.slurm import missing_secrets
from kilocard.rundir.freeze import load_verified
from kilocard.rundir.lock import TOKEN_ENV


def test_rank_env_has_cluster_and_launcher_env_with_the_batch_scripts_precedence(tmp_path, monkeypatch):
    """launcher.env beats cluster.env beats the caller's shell; layout defaults yield to the shell."""
    monkeypatch.setenv("KC_BOTH", "from the shell")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("KC_SECRET", "s3cret")
    overrides = [
        "recipe=tiny_gpt",
        "+cluster.env.KC_SITE=site",
        "+cluster.env.KC_BOTH=cluster",
        "+launcher.env.KC_BOTH=launcher",
        "+launcher.env.KC_JOB=job",
        "launcher.secret_env=[KC_SECRET]",
    ]
    run_dir = create_run_dir(compose(overrides), overrides, root=tmp_path)
    run_cfg, _ = load_verified(run_dir)
    env = rank_env(run_dir, run_cfg, "tok")
    assert (env["KC_SITE"], env["KC_BOTH"], env["KC_JOB"]) == ("site", "launcher", "job")
    assert env["OMP_NUM_THREADS"] == "3", "a layout default never overrides the caller's setting"
    assert env["KC_SECRET"] == "s3cret" and "s3cret" not in (run_dir / "config.yaml").read_text()
    assert env[TOKEN_ENV] == "tok"
    assert missing_secrets(run_cfg.launcher.secret_env) == []
    monkeypatch.delenv("KC_SECRET")
    assert missing_secrets(run_cfg.launcher.secret_env) == ["KC_SECRET"]


def test_run_with_a_missing_secret_is_refused_before_the_run_dir_is_written(tmp_path, monkeypatch):
    from kilocard.commands import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KC_ABSENT_SECRET", raising=False)
    code = main(["run", "recipe=tiny_gpt", "launcher.secret_env=[KC_ABSENT_SECRET]", "cluster.shared_fs=runs"])
    assert code == 2
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
