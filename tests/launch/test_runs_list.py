"""``kilocard runs`` over real runs: a done, a retry (the launcher's TERM: saved and stopped) and a fault (a
killed rank) run of tiny_gpt on local gloo CPU ranks, listed with their states and the commands that
continue them; the retry run's listed command is run and finishes it; a running run is listed running."""

from __future__ import annotations

import json
import shlex
import signal

import pytest

from conftest import KilocardRun
from faults import EVERY, TINY, kill_rank, run_until
from kilocard import exitcodes
from kilocard.commands import main
from kilocard.launch.runs import read_run
from kilocard.rundir.names import STEP_DELAY_ENV

pytestmark = pytest.mark.slow

SLOW = {STEP_DELAY_ENV: "0.2"}
"""Every step waits 0.2 s: a signal lands mid-run whatever the machine's speed (costs no CPU)."""


def slowed(runner: KilocardRun) -> KilocardRun:
    """``runner`` with ``SLOW`` in every launch's environment."""
    slow = KilocardRun(runner.workdir)
    slow.env = lambda **extra: KilocardRun.env(runner, **SLOW, **extra)  # type: ignore[method-assign]
    return slow


def listed(capsys, *args: str) -> tuple[int, list[dict], str]:
    """``kilocard runs ARGS --format json`` in this process: (exit code, the runs, stderr)."""
    capsys.readouterr()
    code = main(["runs", *args, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_runs_lists_done_retry_and_fault_runs_with_the_commands_that_continue_them(kilocard_run, monkeypatch, capsys):
    monkeypatch.chdir(kilocard_run.workdir)
    code, out, _ = kilocard_run(
        "recipe=tiny_gpt", "trainer.train_iters=3", "trainer.tensorboard=false", "launcher.run_name=a-done"
    )
    assert code == exitcodes.DONE, out[-3000:]

    seen_running = []

    def stop_launcher(proc, run_dir, step):
        if step < 2:
            return False
        seen_running.append(read_run(run_dir))  # listed while it trains
        proc.send_signal(signal.SIGTERM)  # kilocard run asks the ranks to save and stop: RETRY
        return True

    slow = slowed(kilocard_run)
    code, out, _, _ = run_until(
        slow,
        [
            "recipe=tiny_gpt",
            "trainer.train_iters=24",
            "checkpoint.save_interval=4",
            "trainer.tensorboard=false",
            "launcher.run_name=b-retry",
        ],
        stop_launcher,
    )
    assert code == exitcodes.RETRY, out[-3000:]
    code, out, _, _ = run_until(
        slow, [*TINY, "launcher.run_name=c-fault"], lambda p, d, s: s > EVERY and kill_rank(p, 1) is None
    )
    assert code == exitcodes.FAULT, out[-3000:]
    (kilocard_run.workdir / "runs" / "d-broken").mkdir()
    (kilocard_run.workdir / "runs" / "d-broken" / "config.yaml").write_text("not: [a config\n")

    assert seen_running[0].state == "running" and seen_running[0].eta_s is not None
    assert seen_running[0].resume_command is None  # it goes on by itself

    code, runs, err = listed(capsys)
    assert code == 0
    assert err.count("\n") == 1 and "skipped runs/d-broken: " in err  # one line for the bad directory
    by_name = {r["run_dir"]: r for r in runs}
    assert [r["run_dir"] for r in runs] == ["runs/c-fault", "runs/b-retry", "runs/a-done"]  # newest first
    done, retry, fault = by_name["runs/a-done"], by_name["runs/b-retry"], by_name["runs/c-fault"]
    assert (done["state"], done["step"], done["committed_step"], done["train_iters"]) == ("done", 3, 3, 3)
    assert done["resume_command"] is None and done["eta_s"] is None and done["loss"] > 0 and done["mfu"] > 0
    assert (retry["state"], retry["exit_code"]) == ("retry", exitcodes.RETRY)
    assert retry["committed_step"] == retry["step"] < retry["train_iters"] == 24  # saved where it stopped
    assert retry["eta_s"] > 0 and retry["resume_command"] == "kilocard run --resume runs/b-retry"
    assert (fault["state"], fault["exit_code"]) == ("fault", exitcodes.FAULT)
    assert fault["committed_step"] is not None and fault["committed_step"] <= fault["step"]
    assert fault["resume_command"] == "kilocard run --resume runs/c-fault"
    for key in ("run_dir", "state", "step", "committed_step", "train_iters", "loss", "mfu", "eta_s", "resume_command"):
        assert all(key in r for r in runs), key

    argv = shlex.split(retry["resume_command"])  # the listed command continues the run to its end
    assert argv[:2] == ["kilocard", "run"]
    code, out, _ = kilocard_run(*argv[2:])
    assert code == exitcodes.DONE, out[-3000:]
    code, one, _ = listed(capsys, "runs/b-retry")
    assert (one["state"], one["step"], one["committed_step"], one["resume_command"]) == ("done", 24, 24, None)

    capsys.readouterr()
    assert main(["runs"]) == 0  # the table names each state and the command that continues the fault run
    text = capsys.readouterr().out
    assert "c-fault  fault" in text and "c-fault: kilocard run --resume runs/c-fault" in text
