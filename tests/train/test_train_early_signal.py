"""A stop signal during a rank's start-up is kept for the first step boundary, never fatal.

Slurm's ``--signal=USR1@lead`` can reach a rank while it is still importing torch and
Megatron-Core; the default action of USR1 would kill it.
"""

import signal
import subprocess
import sys
import time

import pytest

from kilocard.launch.local import torchrun_command


def wait_for_usr1_handler(pid: int, timeout_s: float = 60.0) -> None:
    """Until ``pid`` catches SIGUSR1 (its ``SigCgt`` mask): a fixed sleep raced a loaded machine's start-up."""
    bit = 1 << (signal.SIGUSR1 - 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = open(f"/proc/{pid}/status").read()
        caught = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigCgt:")), 16)
        if caught & bit:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never installed a SIGUSR1 handler")


@pytest.mark.integration  # signals a real rank process
def test_usr1_while_importing_does_not_kill_the_rank(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "kilocard.train", str(tmp_path / "missing")], stderr=subprocess.PIPE, text=True
    )
    wait_for_usr1_handler(proc.pid)  # the entry installs it first, then imports torch and Megatron-Core
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (proc.returncode, err)  # BAD_CONFIG for the missing dir, not -SIGUSR1
    assert "does not exist" in err


def test_launcher_max_restarts_reaches_torchrun(tmp_path):
    assert "--max-restarts=3" in torchrun_command(tmp_path, 2, 12345, max_restarts=3)
    assert "--max-restarts=0" in torchrun_command(tmp_path, 2, 12345)


SLOW_END = """
import atexit, runpy, sys, time

class Finalized:
    def __del__(self):  # would run while CPython clears module globals, after it reset its signal handlers
        print("interpreter teardown", flush=True)

def slow_end():  # the ranks' atexit handlers (logging, trackers) run after the outcome
    print("ending", flush=True)
    time.sleep(5)

finalized = Finalized()
atexit.register(slow_end)
sys.argv = ["kilocard.train", sys.argv[1]]
runpy.run_module("kilocard.train", run_name="__main__")
"""


@pytest.mark.integration  # signals a real rank process
def test_usr1_after_the_outcome_does_not_kill_the_rank_as_it_ends(tmp_path):
    """Slurm's USR1 can come after the last step. CPython gives every signal it handled its default
    disposition back when it tears the interpreter down, and USR1's default is death: exit -10 (138 under
    srun), read by the batch script as a FAULT that requeued a finished run. After the outcome the entry
    ignores USR1, and the rank ends without that teardown (``kilocard.base.quickexit``): no finalizer runs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_END, str(tmp_path / "missing")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ending"
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (proc.returncode, err)  # BAD_CONFIG for the missing dir, not -SIGUSR1
    assert "interpreter teardown" not in out
