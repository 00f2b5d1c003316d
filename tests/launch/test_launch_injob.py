"""``kilocard run`` with ``launcher.max_restarts`` > 0: the ft_launcher command, the ranks' environment, the
refusal without NVRx, ft_launcher's socket directory, and the silence guard across in-job attempts.

The multi-rank proof (a killed or hung rank restarted in the same launch) is tests/train/test_faults_injob.py.
"""

from __future__ import annotations

import math
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kilocard import exitcodes
from kilocard.config.compose import compose
from kilocard.launch import ftlaunch
from kilocard.launch.local import (
    SOCKET_TMPDIR_MAX,
    StopForwarder,
    _watch,
    ft_command,
    rank_env,
    socket_tmpdir,
    stop_wait_s,
    torchrun_command,
)
from kilocard.launch.rundir import create_run_dir
from kilocard.rundir import events
from kilocard.rundir.freeze import load_verified
from venvs import REPO, venv_without

NO_NVRX = ("nvidia_resiliency",)
"""Site-packages entries of NVRx (the ``resiliency`` extra)."""


def _run_dir(tmp_path: Path, *overrides: str) -> Path:
    o = ["recipe=tiny_gpt", *overrides]
    return create_run_dir(compose(o), o, root=tmp_path)


def test_in_job_restarts_start_ft_launcher_with_the_shared_arguments(tmp_path):
    """max_restarts=2: ``python -m`` NVRx's launcher with ftlaunch's argument list (one node, local rendezvous),
    its TERM timeout the launcher's stop wait, then the trainer; the ranks get the in-job exit contract."""
    run_dir = _run_dir(tmp_path, "launcher.max_restarts=2")
    cfg, _ = load_verified(run_dir)
    cmd = ft_command(run_dir, cfg, 2, 4321, stop_wait_s(cfg))
    shared = ftlaunch.ft_launcher_args(cfg, nnodes="1", nproc=2, rdzv_endpoint="127.0.0.1:4321")
    assert cmd[1:3] == ["-m", ftlaunch.TIED_MODULE]  # ft_launcher with its forks tied to it
    assert cmd[3 : 3 + len(shared)] == shared
    assert f"--term-timeout={math.ceil(stop_wait_s(cfg))}" in cmd
    assert cmd[-4:] == [ftlaunch.TEE, "-m", "kilocard.train", str(run_dir)]  # each rank's line labelled
    assert rank_env(run_dir, cfg, "tok")[exitcodes.INJOB_ENV] == "2"


def test_no_in_job_restarts_leave_the_ranks_environment_as_before(tmp_path):
    run_dir = _run_dir(tmp_path)
    cfg, _ = load_verified(run_dir)
    assert exitcodes.INJOB_ENV not in rank_env(run_dir, cfg, "tok")
    # torchrun labels each rank's line as ft_launcher does: [rankN]:
    assert rank_env(run_dir, cfg, "tok")[ftlaunch.LINE_PREFIX_ENV] == ftlaunch.LINE_PREFIX
    assert torchrun_command(run_dir, 2, 4321)[-4:] == [ftlaunch.TEE, "-m", "kilocard.train", str(run_dir)]


def _kilocard(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run(
        [str(venv / "bin" / "python"), "-m", "kilocard.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration  # a real venv without NVRx
def test_in_job_restarts_without_nvrx_are_refused_before_anything_is_written(tmp_path):
    """A venv without nvidia-resiliency-ext (a real interpreter, NVRx's packages left out): a new run and a
    resume with launcher.max_restarts=1 are each refused with exit 2 and one line naming the field and both
    fixes; no run directory is written, the resumed one is left as it was."""
    venv = venv_without(tmp_path, NO_NVRX)
    res = _kilocard(venv, tmp_path, "run", "recipe=tiny_gpt", "launcher.max_restarts=1", "cluster.shared_fs=runs")
    line = (
        "kilocard run: error: launcher.max_restarts=1: in-job restarts need NVIDIA Resiliency Extension "
        "(nvidia-resiliency-ext), which does not import here; install it with pip install "
        "'kilocard[resiliency]', or set launcher.max_restarts=0"
    )
    assert (res.returncode, res.stderr.strip()) == (2, line), res.stdout + res.stderr
    assert not (tmp_path / "runs").exists()

    run_dir = _run_dir(tmp_path / "made", "launcher.max_restarts=1")
    before = sorted(p.name for p in run_dir.rglob("*"))
    res = _kilocard(venv, tmp_path, "run", "--resume", str(run_dir))
    assert (res.returncode, res.stderr.strip()) == (2, line), res.stdout + res.stderr
    assert sorted(p.name for p in run_dir.rglob("*")) == before


def test_a_deep_run_directory_gets_a_short_socket_directory(tmp_path):
    """ft_launcher binds Unix sockets (at most 107 bytes of path) in TMPDIR: a deep run's tmp is reached
    through a short link while the launch lasts; a short one is used as it is."""
    deep = tmp_path.joinpath(*["d" * 30] * 4, "tmp")
    deep.mkdir(parents=True)
    with socket_tmpdir(deep) as short:
        assert len(str(short)) <= SOCKET_TMPDIR_MAX and short.resolve() == deep.resolve()
        (short / "probe").write_text("x")
    assert (deep / "probe").read_text() == "x"
    assert not short.exists() and not short.parent.exists()
    near = Path("/tmp") / "kc"
    with socket_tmpdir(near) as same:
        assert same == near


def _attempts_in_background(run_dir: Path, every_s: float, until_s: float) -> threading.Thread:
    """Append a ``start`` event every ``every_s`` for ``until_s`` (ranks restarted in-job, no step yet)."""

    def write() -> None:
        t_end = time.monotonic() + until_s
        while time.monotonic() < t_end:
            events.append(run_dir, "start", world_size=2, restart=0, job_id=None)
            time.sleep(every_s)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_silence_guard_restarts_its_clock_at_every_new_attempt(tmp_path):
    """A launcher (here a real ``sleep``) whose ranks record no step for 3x the silence allowance but start a
    new attempt every 0.6 s is left alone to end by itself; without new attempts it is stopped (FAULT)."""
    silence_s = 1.5
    proc = subprocess.Popen(["sleep", "4.5"], start_new_session=True)
    _attempts_in_background(tmp_path, 0.6, 4.0)
    assert _watch(proc, tmp_path, silence_s, StopForwarder(proc, 60)) is None
    assert proc.returncode == 0

    quiet = tmp_path / "quiet"
    quiet.mkdir()
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    t0 = time.monotonic()
    assert _watch(proc, quiet, silence_s, StopForwarder(proc, 60)) == exitcodes.FAULT
    assert time.monotonic() - t0 < 10


def test_failed_run_tail_leaves_out_the_missing_nvml_notes(tmp_path, capsys):
    """Without a GPU, NVRx and torch note in every start that NVML is missing (in the log, with tracebacks);
    the tail a failed run prints on the terminal leaves those lines out."""
    from kilocard.launch.local import _print_tail

    log = tmp_path / "train.log"
    log.write_text(
        "[INFO] [ft_launcher1@vm] starting workers\n"
        "[WARNING] [ft_launcher1@vm] GPU Health checks disabled: Unable to determine driver version due to: "
        "NVML Shared Library Not Found\n"
        "  import pynvml  # type: ignore[import]\n"
        "[ERROR] [ft_launcher1@vm] failed (exitcode: 1) local_rank: 0\n"
    )
    _print_tail(log)
    err = capsys.readouterr().err
    assert "failed (exitcode: 1)" in err and "starting workers" in err
    assert "NVML" not in err and "pynvml" not in err


def test_a_failed_rank_s_own_error_line_reaches_the_terminal(tmp_path, capsys):
    """A rank that fails before the trainer's handler (here at import) has no `kilocard.train: error` line: its
    traceback's last line is shown, not torchrun's summary and boilerplate."""
    from kilocard.launch.local import _print_tail

    log = tmp_path / "train.log"
    log.write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/venv/kilocard/train/__main__.py", line 12, in <module>\n'
        "[rank1]: ModuleNotFoundError: No module named 'transformer_engine'\n"
        "E1203 08:00:00 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 1\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
        "============================================================\n"
    )
    _print_tail(log)
    err = capsys.readouterr().err.splitlines()
    assert err[1:] == ["[rank1]: ModuleNotFoundError: No module named 'transformer_engine'"], err
