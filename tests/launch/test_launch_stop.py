"""TERM or a double Ctrl-C to ``kilocard run``: the ranks save, commit and exit RETRY; none outlives the launcher.

Real ranks: two gloo CPU ranks of tiny_gpt under torchrun, signalled through the ``kilocard run``
parent only (as a shell's ``kill`` or a terminal's Ctrl-C reaches it).
"""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from faults import rank_process, run_until, tracker
from kilocard import exitcodes

pytestmark = pytest.mark.slow

ARGS = [
    "--nproc",
    "2",
    "recipe=tiny_gpt",
    "trainer.train_iters=400",
    "trainer.tensorboard=false",
    "+cluster.env.KC_SITE=site",
    "+cluster.env.KC_BOTH=cluster",
    "+launcher.env.KC_BOTH=launcher",
]
"""Long enough never to finish before the signal; saves only on the stop (checkpoint.save_interval=0)."""


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stop_after_step_3(kilocard_run, signals: tuple[int, ...]):
    """Run, send ``signals`` to the parent after step 3; (code, output, run dir, ranks left, rank 0's env)."""
    ranks: list[psutil.Process] = []
    seen_env: dict[str, str] = {}

    def act(proc, run_dir, step):
        if step < 3:
            return False
        ranks.extend(rank_process(proc.pid, r) for r in (0, 1))
        seen_env.update(ranks[0].environ())
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.3)
        return True

    try:
        code, out, run_dir, _ = run_until(kilocard_run, ARGS, act)
    finally:
        left = [p for p in ranks if _alive(p)]
        for p in left:  # never leave orphans behind, also when the test fails
            p.kill()
    return code, out, run_dir, left, seen_env


def test_term_to_kilocard_run_saves_commits_and_leaves_no_rank(kilocard_run):
    """TERM: RETRY (75), a committed step at or after the signal's step, no rank process left.

    The ranks' environment is checked on the live rank too: cluster.env and launcher.env reach it,
    launcher.env winning (the batch script's precedence).
    """
    code, out, run_dir, left, env = _stop_after_step_3(kilocard_run, (signal.SIGTERM,))
    assert not left, f"ranks outlived kilocard run: {[p.pid for p in left]}"
    assert code == exitcodes.RETRY, out[-3000:]
    assert tracker(run_dir) is not None and tracker(run_dir) >= 3
    assert (env.get("KC_SITE"), env.get("KC_BOTH")) == ("site", "launcher")


def test_double_ctrl_c_waits_for_the_save_and_leaves_no_rank(kilocard_run):
    """Two SIGINTs 0.3 s apart: the second only says it is waiting; RETRY (75), committed step, no rank left."""
    code, out, run_dir, left, _ = _stop_after_step_3(kilocard_run, (signal.SIGINT, signal.SIGINT))
    assert not left, f"ranks outlived kilocard run: {[p.pid for p in left]}"
    assert code == exitcodes.RETRY, out[-3000:]
    assert tracker(run_dir) is not None and tracker(run_dir) >= 3
    assert "still waiting for the ranks to save" in out
