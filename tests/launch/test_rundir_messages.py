"""Run-directory problems end in one line naming the real cause, never a traceback or the wrong field:
a missing ``git``, a run name too long for the file system, a read-only run directory on ``--resume``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kilocard.commands import exits, main
from kilocard.config.compose import compose
from kilocard.launch.rundir import create_run_dir
from kilocard.paths import MAX_NAME_BYTES

TINY = ["recipe=tiny_gpt", "cluster.nodes=2", "cluster.gpus_per_node=2", "launcher.signal_lead_s=60"]
CHECKOUT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def run_main(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.integration  # runs kilocard in a fresh interpreter
@pytest.mark.skipif(not (CHECKOUT / ".git").exists(), reason="kilocard runs from a checkout only here")
def test_missing_git_records_an_unknown_version_instead_of_blaming_shared_fs(tmp_path, monkeypatch, capsys):
    """Without git on the PATH the run is written; provenance says why the commit is unknown."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    rc, out, err = run_main(["sbatch", *TINY, f"cluster.shared_fs={tmp_path}/runs"], capsys)
    assert rc == exits.OK, err
    run_dir = next((tmp_path / "runs").iterdir())
    code = json.loads((run_dir / "provenance.json").read_text())["submit_host"]["code"]
    assert code["git_commit"] is None and "git could not be run" in code["git_error"]


@pytest.mark.parametrize("verb", ["validate", "sbatch", "run"])
def test_overlong_run_name_names_run_name(verb, tmp_path, capsys):
    """300 characters used to fail as 'cluster.shared_fs: ... File name too long' (and validate passed it).
    ``run`` gets one node: two are refused first, alone, as no run of this machine (RUN_HERE)."""
    layout = ["recipe=tiny_gpt"] if verb == "run" else TINY
    argv = [verb, *layout, f"cluster.shared_fs={tmp_path}/runs", f"launcher.run_name={'r' * 300}"]
    rc, out, err = run_main(argv, capsys)
    assert rc == exits.INVALID and "Traceback" not in out + err
    assert f"RUN_NAME: launcher.run_name = '{'r' * 40}...': launcher.run_name is 300 bytes long" in out + err
    assert not (tmp_path / "runs").exists()


def test_overlong_automatic_name_names_job_name(tmp_path, capsys):
    """An automatic name (<job_name>-<UTC time>) too long for the file system names launcher.job_name."""
    argv = ["run", "recipe=tiny_gpt", f"cluster.shared_fs={tmp_path}/runs", f"launcher.job_name={'j' * 250}"]
    rc, out, err = run_main(argv, capsys)
    assert rc == exits.USAGE and out == ""
    assert err.startswith("kilocard run: error: launcher.job_name: the run directory name is 266 bytes long (")
    assert f"use at most {MAX_NAME_BYTES} (file systems allow 255 per name)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


DROP_AND_RESUME = """
import os, sys
from kilocard.commands import main  # imported first: the interpreter's own files may be root's only
os.setgid({gid}); os.setuid({uid})  # root writes anywhere: resume as an ordinary user (no-op if not root)
sys.exit(main(["run", "--resume", sys.argv[1]]))
"""


@pytest.mark.integration  # runs kilocard in a fresh interpreter
def test_read_only_run_dir_on_resume_is_one_line():
    """A run directory the user cannot write: exit 2 naming it, before any rank starts (was a traceback)."""
    root = Path(tempfile.mkdtemp(prefix="kilocard-ro-"))
    try:
        root.chmod(0o755)
        run_dir = create_run_dir(compose(["recipe=tiny_gpt"]), [], root=root)
        run_dir.chmod(0o555)
        root_user = os.geteuid() == 0
        code = DROP_AND_RESUME.format(
            uid=NOBODY if root_user else os.geteuid(), gid=NOBODY if root_user else os.getegid()
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        proc = subprocess.run(
            [sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, timeout=120, env=env, cwd="/"
        )
        assert proc.returncode == exits.USAGE, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines() == [
            f"kilocard run: error: --resume {run_dir}: the run directory is not writable (Permission denied); "
            "make it writable or copy it"
        ]
        assert sorted(p.name for p in run_dir.iterdir()) == ["config.sha256", "config.yaml", "provenance.json"]
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
