"""``kilocard sbatch`` without a cluster: validation first, run directory contents, quoting, secrets.

Submission against a real controller is in tests/launch/test_slurm_e2e.py.
"""

from __future__ import annotations

import dataclasses
import json
import stat
import subprocess
from pathlib import Path

import pytest

from kilocard.base.shell import ShellValueError
from kilocard.cli import main
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.render import render_script
from kilocard.plan import build_plan
from kilocard.validate import validate
from kilocard.validate.slurm import signal_lead_issues

TINY = ["recipe=tiny_gpt", "cluster.nodes=2", "cluster.gpus_per_node=2", "launcher.signal_lead_s=60"]


def run_cli(args, capsys):
    rc = main(["sbatch", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_valid_config_writes_run_dir_and_prints_paths(tmp_path, capsys):
    """A valid config gives a run dir with the frozen config, plan, provenance and the script."""
    rc, out, err = run_cli([*TINY, f"cluster.shared_fs={tmp_path}"], capsys)
    assert rc == 0, err
    lines = dict(line.split(": ", 1) for line in out.strip().splitlines())
    run_dir, script = Path(lines["run dir"]), Path(lines["script"])
    assert run_dir.parent == tmp_path and script == run_dir / "submit.sbatch"
    assert lines["sbatch"] == f"sbatch {script}"
    for name in ("config.yaml", "config.sha256", "provenance.json", "plan.json", "submit.sbatch", "logs"):
        assert (run_dir / name).exists(), name
    assert script.stat().st_mode & stat.S_IXUSR
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["world_size"] == 4 and plan["tasks_per_node"] == 2 and plan["gpus_per_node"] == 0
    assert "launcher:\n  kind: slurm" in (run_dir / "config.yaml").read_text()
    rc_cfg = to_run_config(compose([*TINY, f"cluster.shared_fs={tmp_path}", "launcher=slurm"]))
    assert script.read_text() == render_script(rc_cfg, build_plan(rc_cfg), run_dir)


def test_invalid_config_writes_nothing_and_prints_every_error(tmp_path, capsys):
    """Two errors in one config: both printed, exit 1, no run directory."""
    root = tmp_path / "runs"
    rc, out, err = run_cli(
        [
            *TINY,
            f"cluster.shared_fs={root}",
            "parallel.tensor_model_parallel_size=3",
            "checkpoint.expected_save_time_s=100",
        ],
        capsys,
    )
    assert rc == 1 and out == ""
    assert "parallel.tensor_model_parallel_size" in err and "SIGNAL_LEAD_SAVE" in err
    assert "nothing written, nothing submitted" in err
    assert not root.exists()


def test_multirun_with_one_invalid_point_writes_nothing(tmp_path, capsys):
    """A sweep is all or nothing: one invalid point and no run directory is created."""
    rc, out, err = run_cli(
        [*TINY, f"cluster.shared_fs={tmp_path}", "--multirun", "parallel.tensor_model_parallel_size=1,2,3"], capsys
    )
    assert rc == 1 and "1 of 3 config(s) invalid" in err
    assert list(tmp_path.iterdir()) == []
    rc, out, err = run_cli(
        [*TINY, f"cluster.shared_fs={tmp_path}", "--multirun", "parallel.tensor_model_parallel_size=1,2"], capsys
    )
    assert rc == 0 and len(list(tmp_path.iterdir())) == 2 and out.count("run dir: ") == 2


@pytest.mark.parametrize("name", ["$(touch /tmp/pwned)", "a;b", "`id`", "a b", "x|y"])
def test_unsafe_job_name_rejected(tmp_path, capsys, name):
    """A job name with shell metacharacters is rejected in one line; nothing written."""
    rc, out, err = run_cli([*TINY, f"cluster.shared_fs={tmp_path}", f"launcher.job_name='{name}'"], capsys)
    assert rc == 1 and "launcher.job_name" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_unsafe_extra_sbatch_and_partition_rejected(tmp_path, capsys):
    for override in [
        "launcher.extra_sbatch=['--constraint=a;touch /tmp/x']",
        "cluster.partition='gpu$(id)'",
        "launcher.dependency='afterok:1;id'",
        "launcher.time='1:00:00;id'",
    ]:
        rc, out, err = run_cli([*TINY, f"cluster.shared_fs={tmp_path}", override], capsys)
        assert rc == 1, override
        assert override.split("=", 1)[0] in err, (override, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("field", ["launcher.env.X", "cluster.venv", "cluster.container_image"])
def test_control_characters_rejected(field):
    """A newline would end the quoted word's line: rejected, naming the field."""
    rc = to_run_config(compose(TINY))
    if field == "launcher.env.X":
        rc = dataclasses.replace(rc, launcher=dataclasses.replace(rc.launcher, env={"X": "a\ntouch /tmp/pwned"}))
    else:
        attr = field.split(".")[1]
        rc = dataclasses.replace(rc, cluster=dataclasses.replace(rc.cluster, **{attr: "/opt/x\n/bin/id"}))
    with pytest.raises(ShellValueError, match=field.replace(".", r"\.")):
        render_script(rc, build_plan(rc), Path("/shared/runs/x"))


INJECT = {
    "A": "$(touch {p})",
    "B": "`touch {p}`",
    "C": "x; touch {p}",
    "D": "' ; touch {p} ; '",
    "E": "$HOME${{PATH}}",
    "F": "a\tb && touch {p}",
}


def test_injected_values_never_execute(tmp_path):
    """Run the rendered script with stand-ins for srun/scontrol (a mock: this test needs no Slurm;
    the real-Slurm run in test_slurm_local.py repeats it): no marker file appears, and every rank
    sees each value verbatim."""
    pwned = tmp_path / "pwned"
    values = {k: v.format(p=pwned) for k, v in INJECT.items()}
    rc = to_run_config(compose(TINY))
    rc = dataclasses.replace(rc, launcher=dataclasses.replace(rc.launcher, env=values))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = run_dir / "submit.sbatch"
    script.write_text(render_script(rc, build_plan(rc), run_dir))
    subprocess.run(["bash", "-n", str(script)], check=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho n1\n")
    (bin_dir / "srun").write_text('#!/bin/sh\nenv -0 > "$KILOCARD_RUN_DIR/env.bin"\nexit 0\n')
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "HOME": "/root"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert not pwned.exists()
    seen = dict(kv.split("=", 1) for kv in (run_dir / "env.bin").read_text().split("\0") if "=" in kv)
    for k, v in values.items():
        assert seen[k] == v
    assert (run_dir / "DONE").exists()


@pytest.mark.parametrize("root", ["/tmp/a b", "/tmp/$(touch /tmp/pwned)", "/tmp/`id`", "/tmp/x;id"])
def test_unsafe_run_dir_path_rejected(tmp_path, capsys, root):
    """The run dir reaches #SBATCH --output, which sbatch parses without a shell: safe characters only."""
    rc, out, err = run_cli([*TINY, f"cluster.shared_fs='{root}'"], capsys)
    assert rc == 1 and "cluster.shared_fs" in err and not Path(root).exists()


def test_secret_reference_becomes_a_name_never_a_value(tmp_path, capsys, monkeypatch):
    """``${oc.env:WANDB_API_KEY}`` is passed by name: its value is in no file of the run dir."""
    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t-v4lue-123")
    rc, out, err = run_cli(
        [*TINY, f"cluster.shared_fs={tmp_path}", "+launcher.env.WANDB_API_KEY='${oc.env:WANDB_API_KEY}'"], capsys
    )
    assert rc == 0, err
    run_dir = Path(dict(line.split(": ", 1) for line in out.strip().splitlines())["run dir"])
    for f in run_dir.rglob("*"):
        if f.is_file():
            assert b"s3cr3t-v4lue-123" not in f.read_bytes(), f
    assert "secret_env:\n  - WANDB_API_KEY" in (run_dir / "config.yaml").read_text()
    assert "--export=ALL,WANDB_API_KEY" in out
    assert '[ -n "${WANDB_API_KEY+set}" ]' in (run_dir / "submit.sbatch").read_text()


def test_secret_value_in_secret_env_is_refused():
    rc = to_run_config(compose([*TINY, "launcher.secret_env=['sk-live-abc=def']"]))
    issues = [i for i in validate(rc).issues if i.severity == "error"]
    assert [i.code for i in issues] == ["SECRET_VALUE"] and issues[0].value == "<hidden>"


def test_signal_lead_rule_uses_save_time_and_time_limit():
    """USR1 must come before a save could finish: lead >= 1.2 x save + 30 s, and lead < time limit."""
    ok = to_run_config(compose([*TINY, "checkpoint.expected_save_time_s=20"]))
    assert signal_lead_issues(ok) == []
    slow = to_run_config(compose([*TINY, "checkpoint.expected_save_time_s=100"]))
    (issue,) = signal_lead_issues(slow)
    assert issue.code == "SIGNAL_LEAD_SAVE" and issue.field == "launcher.signal_lead_s" and "150" in issue.hint
    short = to_run_config(compose([*TINY, "launcher.time=00:01:00", "launcher.signal_lead_s=90"]))
    assert [i.code for i in signal_lead_issues(short)] == ["SIGNAL_LEAD_TIME"]
    big = to_run_config(compose(["recipe=llama31_405b", "cluster.fs_write_bandwidth_gbs=1"]))
    (issue,) = signal_lead_issues(big)
    assert issue.code == "SIGNAL_LEAD_SAVE" and "GB / cluster.fs_write_bandwidth_gbs=1" in issue.message


def test_chain_must_be_positive(tmp_path, capsys):
    rc, out, err = run_cli([*TINY, f"cluster.shared_fs={tmp_path}", "--chain", "0"], capsys)
    assert rc == 2 and "--chain" in err


def test_sbatch_argv_passes_secret_names_and_chain_position():
    from kilocard.launch.slurm import sbatch_argv

    argv = sbatch_argv(Path("/r/submit.sbatch"), ["WANDB_API_KEY"], chain_link=2, dependency="afterany:17")
    assert argv == [
        "sbatch",
        "--parsable",
        "--export=ALL,KILOCARD_CHAIN_LINK=2,WANDB_API_KEY",
        "--dependency=afterany:17",
        "/r/submit.sbatch",
    ]
    assert sbatch_argv(Path("/r/s"), parsable=False) == ["sbatch", "/r/s"]


@pytest.mark.parametrize("text,job", [("123\n", 123), ("4567;cluster\n", 4567), ("sbatch: warning x\n89\n", 89)])
def test_parse_job_id(text, job):
    from kilocard.launch.slurm import parse_job_id

    assert parse_job_id(text) == job


def test_parse_job_id_rejects_garbage():
    from kilocard.launch.slurm import SlurmError, parse_job_id

    with pytest.raises(SlurmError, match="expected a job id"):
        parse_job_id("Submitted batch job 12")


def test_submit_refuses_missing_secret_before_calling_sbatch(tmp_path, capsys, monkeypatch):
    """A secret named in launcher.secret_env but not exported: one-line error, sbatch never runs."""
    monkeypatch.delenv("KC_TEST_SECRET", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sbatch reachable: the check must come first
    rc, out, err = run_cli(
        [*TINY, f"cluster.shared_fs={tmp_path}/runs", "launcher.secret_env=[KC_TEST_SECRET]", "--submit"], capsys
    )
    assert rc == 1 and "KC_TEST_SECRET not set" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_script_mounts_the_frozen_absolute_checkpoint_dir_into_the_container(tmp_path, capsys, monkeypatch):
    """A relative ``checkpoint.save`` with a container image: the script is rendered from the frozen config,
    so the directory it saves to is mounted (rendered from the config as typed it mounted only the runs
    directory, and the checkpoints went to the container's scratch space)."""
    monkeypatch.chdir(tmp_path)
    image = ["cluster.container_image=/lustre/images/kilocard.sqsh", "launcher.packaging=image"]
    rc, out, err = run_cli([*TINY, f"cluster.shared_fs={tmp_path / 'runs'}", "checkpoint.save=ckpt", *image], capsys)
    assert rc == 0, err
    run_dir = Path(dict(line.split(": ", 1) for line in out.strip().splitlines())["run dir"])
    assert f"save: {tmp_path / 'ckpt'}" in (run_dir / "config.yaml").read_text()
    text = (run_dir / "submit.sbatch").read_text()
    mounts = next(a for a in text.split() if a.startswith("--container-mounts=")).split("=", 1)[1].strip("'")
    assert f"{tmp_path / 'ckpt'}:{tmp_path / 'ckpt'}" in mounts.split(","), mounts


def test_preview_and_written_run_share_one_runs_root(tmp_path, capsys, monkeypatch):
    """A relative ``cluster.shared_fs``: ``--dry-run`` names the directory the written run then gets
    (``kilocard.launch.rundir.runs_root``: absolute against the cwd), and the script's paths agree."""
    monkeypatch.chdir(tmp_path)
    args = [*TINY, "cluster.shared_fs=runs", "launcher.run_name=exp"]
    rc, out, err = run_cli([*args, "--dry-run"], capsys)
    assert rc == 0, err
    assert out.startswith(f"#!/bin/bash\n# run dir: {tmp_path / 'runs' / 'exp'} (dry run: nothing written)\n")
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    run_dir = tmp_path / "runs" / "exp"
    assert f"run dir: {run_dir}\n" in out
    assert f"\nRUN_DIR={run_dir}\n" in (run_dir / "submit.sbatch").read_text()
