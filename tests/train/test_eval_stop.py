"""A stop that lands on an evaluation step keeps that evaluation (real ranks: tiny_gpt under ``kilocard run``).

The stopped step is committed and its resume starts after it: an evaluation skipped for the stop was lost for
good, and with the stop on the last step neither the final validation nor the test loss was ever produced.
Each step sleeps 2 s (``KILOCARD_FAULT_STEP_DELAY_S``), so a TERM sent when step N-2's line appears reaches
the ranks while step N runs: the stop lands on step N.
"""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from faults import run_until, tracker
from kilocard import exitcodes
from kilocard.rundir.metrics import read_evals
from kilocard.rundir.names import STEP_DELAY_ENV

pytestmark = pytest.mark.slow

ARGS = ["recipe=tiny_gpt", "trainer.tensorboard=false", "trainer.eval_interval=3", "trainer.eval_iters=1"]


def _stop_on(kilocard_run, step: int, train_iters: int):
    def act(proc, run_dir, seen):
        if seen < step - 2:
            return False
        proc.send_signal(signal.SIGTERM)
        return True

    args = [*ARGS, f"trainer.train_iters={train_iters}"]
    delay = {STEP_DELAY_ENV: "2"}
    slow = SimpleNamespace(workdir=kilocard_run.workdir, start=lambda *a: kilocard_run.start(*a, **delay))
    code, out, run_dir, _ = run_until(slow, args, act)
    return code, out, run_dir


@pytest.mark.parametrize(("step", "train_iters"), [(3, 12), (6, 6)], ids=["eval step", "last step"])
def test_a_stop_on_an_evaluation_step_still_evaluates_it(kilocard_run, step, train_iters):
    code, out, run_dir = _stop_on(kilocard_run, step, train_iters)
    assert code == exitcodes.RETRY, out[-3000:]
    assert tracker(run_dir) == step, out[-3000:]
    evals = read_evals(run_dir)
    assert [r["step"] for r in evals if r["split"] == "valid"][-1] == step, evals
    if step == train_iters:
        assert [r["step"] for r in evals if r["split"] == "test"] == [step], evals
