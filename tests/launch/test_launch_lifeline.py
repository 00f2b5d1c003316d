"""Ranks never outlive their launcher: ``kill -9`` of ``kilocard run`` takes torchrun and every rank with it.

The unit test ties a child to a parent the way the launcher ties torchrun (``parent_death_preexec``) and a
rank ties itself (``die_with_parent``). The run test is real: two gloo CPU ranks of tiny_gpt under torchrun,
the launcher SIGKILLed mid-run, then ``kilocard run --resume`` of the same directory.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from faults import records, run_until, tracker
from kilocard import exitcodes

pytestmark = pytest.mark.slow

GONE_WITHIN_S = 20.0
"""Seconds after the launcher's death by which no process of the run may be left."""

PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from kilocard.base.lifeline import parent_death_preexec
    how = sys.argv[1]
    child = (
        "import os, time\\n"
        "from kilocard.base.lifeline import die_with_parent\\n"
        "die_with_parent(os.getppid())\\n"
        "time.sleep(120)\\n"
    )
    if how == "preexec":
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=parent_death_preexec())
    else:
        p = subprocess.Popen([sys.executable, "-c", child])
    print(p.pid, flush=True)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("how", ["preexec", "self"])
def test_a_child_dies_with_its_parent(how):
    """SIGKILL of the parent: its child (tied by the launcher's preexec, or by itself at start) is gone."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    time.sleep(1.0)  # the child has set its guard (the "self" form sets it after its interpreter started)
    assert _alive(child)
    parent.kill()
    parent.wait()
    left = _wait_gone([child], 10)
    for pid in left:
        psutil.Process(pid).kill()
    assert not left, "the child outlived its parent"


ARGS = [
    "--nproc",
    "2",
    "recipe=tiny_gpt",
    "trainer.train_iters=400",
    "checkpoint.save_interval=2",
    "trainer.tensorboard=false",
]
"""Long enough never to finish before the kill; a committed step every 2 steps to resume from."""


def _run_tree(launcher_pid: int) -> tuple[list[psutil.Process], list[str]]:
    """The processes under the ``kilocard run`` launcher (torchrun or ft_launcher, the ranks, their helpers)
    and the command lines of those still running."""
    tree, commands = psutil.Process(launcher_pid).children(recursive=True), []
    for p in tree:
        try:
            commands.append(" ".join(p.cmdline()))
        except psutil.Error:  # a helper that ended meanwhile
            continue
    return tree, commands


@pytest.mark.parametrize("launcher", ["torchrun", "ft_launcher"])
def test_sigkill_of_the_launcher_takes_every_rank_with_it_and_the_run_resumes(kilocard_run, launcher):
    """Under torchrun, and under NVRx's ft_launcher (in-job restarts): nothing of the run is left 20 s after
    the launcher's SIGKILL; the torchrun run is then resumed (one writer again, not refused as busy)."""
    tree: list[psutil.Process] = []
    commands: list[str] = []
    args = ARGS + (["launcher.max_restarts=1"] if launcher == "ft_launcher" else [])

    def kill_launcher(proc, run_dir, step):
        if step < 5 or (tracker(run_dir) or 0) < 2:
            return False
        found, cmds = _run_tree(proc.pid)
        tree.extend(found)
        commands.extend(cmds)
        proc.send_signal(signal.SIGKILL)
        return True

    try:
        code, out, run_dir, _ = run_until(kilocard_run, args, kill_launcher)
        assert code == -signal.SIGKILL
        assert sum("kilocard.train" in c for c in commands) >= 3, f"torchrun and 2 ranks expected: {commands}"
        left = _wait_gone([p.pid for p in tree], GONE_WITHIN_S)
        assert not left, f"processes outlived the killed launcher: {left}"
    finally:
        for p in tree:  # never leave orphans behind, also when the test fails
            if _alive(p.pid):
                p.kill()
    committed = tracker(run_dir)
    assert committed is not None and committed >= 2
    if launcher != "torchrun":
        return  # the resume is the same for both launchers
    shown = max(r["step"] for r in records(run_dir))  # the resumed launcher first shows the last recorded step

    def stop_after_progress(proc, rd, step):
        proc.send_signal(signal.SIGTERM)
        return True

    code, out, _, _ = run_until(kilocard_run, ["--resume", str(run_dir)], stop_after_progress, after_step=shown)
    assert code == exitcodes.RETRY, out[-3000:]  # one writer again: not refused as busy, resumed, stopped on TERM
    assert f"(step {committed}," in (run_dir / "logs" / "train.log").read_text(errors="replace")
