"""One writer per run directory: a second ``kilocard run --resume``, a second rank 0, a second Slurm job.

The lock holder in these tests is a real second process (``python -c`` taking ``kilocard.rundir.lock``'s
flock), as a concurrent ``kilocard run`` would be.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from kilocard import exitcodes
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.render import render_script
from kilocard.launch.rundir import create_run_dir
from kilocard.plan import build_plan
from kilocard.rundir.lock import LOCK_FILE, LockUnsupported, RunDirBusy, acquire, claim, read_holder

TINY = ["recipe=tiny_gpt", "trainer.train_iters=2", "trainer.tensorboard=false"]


@pytest.fixture
def run_dir(tmp_path):
    """A fresh tiny_gpt run directory (nothing trained yet)."""
    return create_run_dir(compose(TINY), TINY, root=tmp_path / "runs")


@pytest.fixture
def holder(run_dir):
    """Another live process that holds ``run_dir``'s lock, as a Slurm job would (``SLURM_JOB_ID=4242``)."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from kilocard.rundir.lock import acquire
        lock = acquire(Path({str(run_dir)!r}))
        print("held", flush=True)
        time.sleep(600)
    """)
    env = {**os.environ, "SLURM_JOB_ID": "4242"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.integration  # holds the lock from a second process
def test_lock_names_its_holder_and_a_dead_holder_does_not_block(run_dir, holder):
    """A held lock refuses with pid, host and job id; once the holder dies (SIGKILL) it is free again."""
    with pytest.raises(RunDirBusy) as e:
        acquire(run_dir)
    assert f"pid {holder.pid}" in str(e.value) and "Slurm job 4242" in str(e.value)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = acquire(run_dir)  # the stale holder info is still in the file; it does not block
    assert read_holder(run_dir)["pid"] == os.getpid()
    lock.release()
    assert (run_dir / LOCK_FILE).read_text() == ""


@pytest.mark.integration  # holds the lock from a second process
def test_a_requeued_job_waits_for_its_own_earlier_start_to_let_go(run_dir, holder, monkeypatch, capsys):
    """The holder is job 4242 before its requeue (restart 0): restart 1 waits for it and takes the lock
    once it exits; a different job, or the same start, is refused at once."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    t0 = time.monotonic()
    with pytest.raises(RunDirBusy, match=r"Slurm job 4242 \(restart 0\)"):
        claim(run_dir, None, wait_s=30)  # the same start: another writer, no wait
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with pytest.raises(RunDirBusy):
        claim(run_dir, None, wait_s=30)  # another job
    assert time.monotonic() - t0 < 10, "neither waited"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    with pytest.raises(RunDirBusy):
        claim(run_dir, None, wait_s=2)  # the earlier start outlives the wait
    assert "still held by an earlier start of this job" in capsys.readouterr().err
    threading.Timer(2.0, holder.kill).start()
    lock = claim(run_dir, None, wait_s=60)
    assert lock is not None and read_holder(run_dir)["slurm_restart_count"] == "1"
    lock.release()


def test_a_filesystem_without_flock_is_named_not_a_crash(run_dir, monkeypatch):
    """ENOLCK from flock (NFS without lockd, Lustre without ``-o flock``): ``LockUnsupported`` naming the file.

    flock is replaced here because no filesystem that refuses it can be mounted for a test.
    """

    def refuse(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(LockUnsupported, match=f"{run_dir / LOCK_FILE}: the filesystem refuses flock"):
        acquire(run_dir)


@pytest.mark.integration  # holds the lock from a second process
def test_second_kilocard_run_resume_is_refused_at_once_naming_the_holder(run_dir, holder):
    """``kilocard run --resume`` of a held run directory exits 1 before any rank starts."""
    proc = subprocess.run(
        [sys.executable, "-m", "kilocard.cli", "run", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"in use by another writer (pid {holder.pid} on host" in proc.stderr
    assert "Slurm job 4242" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run_dir / "logs" / "train.log").exists(), "no rank was started"


@pytest.mark.slow
def test_rank_zero_refuses_a_held_run_dir_with_busy_and_takes_a_free_one(run_dir, holder):
    """Under Slurm (no launcher token) rank 0 takes the lock itself; a held one ends the rank with BUSY."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": "77"}
    env.pop("KILOCARD_RUN_LOCK", None)
    cmd = [sys.executable, "-m", "kilocard.train", str(run_dir)]
    busy = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert busy.returncode == exitcodes.BUSY, busy.stdout + busy.stderr[-3000:]
    assert f"in use by another writer (pid {holder.pid}" in busy.stderr
    assert not (run_dir / "metrics.jsonl").exists()
    holder.kill()
    holder.wait()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == exitcodes.DONE, done.stdout + done.stderr[-3000:]
    assert read_holder(run_dir)["slurm_job_id"] == "77", "rank 0 held the lock as the Slurm job"


def test_batch_script_ends_a_busy_job_without_requeue_or_failed_marker(tmp_path):
    """BUSY (4) from srun: the job ends with 4; no ``scontrol requeue``, no FAILED marker in the run dir.

    srun and scontrol are stand-ins here: the branch under test depends only on srun's exit code,
    and the local Slurm cluster is not started by this fast test.
    """
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    # the preflight step passes; the training step answers BUSY
    (bin_dir / "srun").write_text(
        f'#!/bin/bash\necho srun >> {calls}\n[[ "$*" == *preflight.py* ]] && exit 0\nexit {exitcodes.BUSY}\n'
    )
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "scontrol $*" >> {calls}\necho localhost\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    rc = to_run_config(compose(["recipe=tiny_gpt", "launcher=slurm"]))
    script = tmp_path / "train.sbatch"
    script.write_text(render_script(rc, build_plan(rc), run_dir))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1"}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == exitcodes.BUSY, proc.stderr
    assert "requeue" not in calls.read_text()
    assert not (run_dir / "FAILED").exists() and not (run_dir / "DONE").exists()
    assert "another job is writing" in proc.stderr
