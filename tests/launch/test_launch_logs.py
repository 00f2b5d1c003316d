"""``kilocard logs``: a run's Slurm output, all of it or one rank's (``srun --label`` prefixes, or with
in-job restarts the node's label and ft_launcher's rank prefix)."""

from __future__ import annotations

import threading
import time

from kilocard.cli import main
from kilocard.config.compose import compose
from kilocard.rundir.freeze import write_frozen

JOB_1 = "[kilocard 2026-01-01T00:00:00Z job 7] start\n 0: step 1 loss 9.1\n12: rank twelve\n 3: step 1\n"
JOB_2 = "[kilocard 2026-01-01T01:00:00Z job 9] start\n 3: resumed\n 0: step 2\n"
# In-job restarts (one ft_launcher per node under srun --label, launcher.max_restarts=2), lines as a real
# 2 nodes x 2 ranks job wrote them: the rendezvous put ranks 0-1 on node 1 and ranks 2-3 on node 0, so
# node 3 does not exist and node 1's lines are ranks 0 and 1's or its launcher's.
INJOB = """\
[kilocard 2026-12-01T11:38:35Z job 204] start: restart 0, chain link 1/1, master n3:21428
0: [2026-12-01 11:38:48,882] [INFO] [ft_launcher28095@vm] Using nproc_per_node=2.
1: [2026-12-01 11:38:49,410] [INFO] [ft_launcher28093@vm] The node 'localhost_28093_0' has joined round 0 as rank 0.
1: [rank1]: /venv/megatron/core/optimizer/__init__.py:24: UserWarning: Apex is not installed.
0: [rank3]: /venv/megatron/core/optimizer/__init__.py:24: UserWarning: Apex is not installed.
0: [rank3]:   warnings.warn(
1: [rank0]: [rank 0] kilocard.train: node health: n4 ok (4 ranks in the job, 2 here; a 3.5 MB checkpoint fits)
0: [rank2]: [rank 2] kilocard.train: node health: n3 ok (4 ranks in the job, 2 here; a 3.5 MB checkpoint fits)
1: [rank0]: [    7.0s] kilocard.train: built model (1 micro-batches per step, world 4, backend cpu)
0: [2026-12-01 11:39:05,030] [ERROR] [ft_launcher28095@vm] failed (exitcode: -9) local_rank: 1 (pid: 28138)
[kilocard 2026-12-01T11:39:42Z job 204] ft_launcher exit code 0
"""


def run_dir(tmp_path, *overrides: str, logs: dict[str, str] | None = None):
    """A run directory with a real frozen config (tiny_gpt on Slurm, 4 nodes x 4 ranks, ``overrides``) and job
    logs."""
    cluster = ["cluster.nodes=4", "cluster.gpus_per_node=4"]
    write_frozen(compose(["recipe=tiny_gpt", "launcher=slurm", *cluster, *overrides]), tmp_path)
    (tmp_path / "logs").mkdir()
    for name, text in (logs or {"slurm-9.out": JOB_2, "slurm-7.out": JOB_1}).items():
        (tmp_path / "logs" / name).write_text(text)
    return tmp_path


def test_all_lines_in_job_order_and_one_rank(tmp_path, capsys):
    d = run_dir(tmp_path)
    assert main(["logs", str(d)]) == 0
    assert capsys.readouterr().out == JOB_1 + JOB_2
    assert main(["logs", str(d), "--rank", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "[kilocard 2026-01-01T00:00:00Z job 7] start",
        " 3: step 1",
        "[kilocard 2026-01-01T01:00:00Z job 9] start",
        " 3: resumed",
    ]


def test_follow_reads_new_lines_until_the_run_ends(tmp_path, capsys):
    d = run_dir(tmp_path)

    def job():
        time.sleep(1.5)
        with (d / "logs" / "slurm-9.out").open("a") as f:
            f.write(" 3: step 3\n 0: step 3\n")
        (d / "DONE").write_text("now\n")

    t = threading.Thread(target=job)
    t.start()
    assert main(["logs", str(d), "--rank", "3", "--follow"]) == 0
    t.join()
    assert capsys.readouterr().out.splitlines()[-1] == " 3: step 3"


def test_not_a_run_directory_is_one_line(tmp_path, capsys):
    assert main(["logs", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RUN_DIR" in err and "has no logs/" in err


def test_in_job_rank_is_the_launchers_rank_prefix_not_the_node_label(tmp_path, capsys):
    d = run_dir(
        tmp_path, "launcher.max_restarts=2", "cluster.nodes=2", "cluster.gpus_per_node=2", logs={"slurm-204.out": INJOB}
    )
    assert main(["logs", str(d), "--rank", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "[kilocard 2026-12-01T11:38:35Z job 204] start: restart 0, chain link 1/1, master n3:21428",
        "0: [rank3]: /venv/megatron/core/optimizer/__init__.py:24: UserWarning: Apex is not installed.",
        "0: [rank3]:   warnings.warn(",
        "[kilocard 2026-12-01T11:39:42Z job 204] ft_launcher exit code 0",
    ]
    assert main(["logs", str(d), "--rank", "1"]) == 0  # node 1's launcher and rank 0 ran there: neither is shown
    assert [line.split(": ", 2)[1] for line in capsys.readouterr().out.splitlines()[1:-1]] == ["[rank1]"]
    assert main(["logs", str(d)]) == 0
    assert capsys.readouterr().out == INJOB


def test_rank_without_a_readable_frozen_config_is_one_line(tmp_path, capsys):
    (tmp_path / "logs").mkdir()
    assert main(["logs", str(tmp_path), "--rank", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.yaml" in err and "--rank needs the run's frozen config" in err


LOCAL = """\
W1207 18:21:50.123000 4242 torch/distributed/run.py:792] Setting OMP_NUM_THREADS environment variable
[rank0]: [rank 0] kilocard.train: rank 0 of 2 up on vm (local rank 0, pid 4243)
[rank0]: [rank 0] kilocard.train: node health: vm ok (2 ranks in the job, 2 here)
[rank0]: [    9.9s] kilocard.train: built model (2 micro-batches per step, world 2, backend cpu)
[rank1]: [rank 1] kilocard.train: rank 1 of 2 up on vm (local rank 1, pid 4244)
[rank0]: step 1/3 | loss 5.9619 | grad norm 0.852 | lr 1.500e-03 | samples 8 | tokens 512 | 0.147 s/step | \
1.74e+03 tok/s/gpu | 0.00299 TFLOP/s/gpu | MFU 5.98% | ETA 0:00:01
[rank1]: Traceback (most recent call last):
[rank0]: kilocard.train: done at step 3
"""
"""A local run's train.log as torchrun's ``--tee`` labels it (``ftlaunch.LINE_PREFIX``), with one line of
torchrun's own."""


NPROC_2 = ("cluster.gpus_per_node=2", "cluster.nodes=1", "launcher.nproc=2")
"""``kilocard run --nproc 2``'s overrides."""


def local_run_dir(tmp_path, holder: str = ""):
    """A run directory as ``kilocard run`` leaves it: logs/train.log, the lock file with ``holder``."""
    tmp_path.mkdir(exist_ok=True)
    write_frozen(compose(["recipe=tiny_gpt", *NPROC_2]), tmp_path)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train.log").write_text(LOCAL)
    (tmp_path / ".lock").write_text(holder)
    return tmp_path


def test_a_local_run_is_read_too(tmp_path, capsys):
    """`kilocard logs` on a `kilocard run` directory printed nothing (exit 0)."""
    d = local_run_dir(tmp_path)
    assert main(["logs", str(d)]) == 0
    assert capsys.readouterr().out == LOCAL
    assert main(["logs", str(d), "--rank", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "[rank1]: [rank 1] kilocard.train: rank 1 of 2 up on vm (local rank 1, pid 4244)",
        "[rank1]: Traceback (most recent call last):",
    ]


def test_a_rank_the_run_does_not_have_is_exit_2_naming_its_ranks(tmp_path, capsys):
    """``--rank 5`` of a 2-rank run printed nothing with exit 0."""
    d = local_run_dir(tmp_path / "local")
    assert main(["logs", str(d), "--rank", "5"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.out == "" and captured.err == "kilocard logs: error: --rank 5: no such rank (the run has ranks 0-1)\n"
    )
    slurm = tmp_path / "slurm"
    slurm.mkdir()
    run_dir(slurm)  # 16 ranks
    assert main(["logs", str(slurm), "--rank", "15"]) == 0
    assert main(["logs", str(slurm), "--rank", "16"]) == 2
    assert "(the run has ranks 0-15)" in capsys.readouterr().err


def test_a_run_without_output_yet_says_so(tmp_path, capsys):
    """A run directory whose job has not started (no log yet), or a rank without a line yet: a note on stderr."""
    d = local_run_dir(tmp_path)
    (d / "logs" / "train.log").unlink()
    assert main(["logs", str(d)]) == 0
    captured = capsys.readouterr()
    assert (
        captured.out == ""
        and captured.err == f"kilocard logs: {d}: no output yet (a job or kilocard run writes logs/)\n"
    )
    (d / "logs" / "train.log").write_text(LOCAL.replace("[rank1]", "[rank0]"))
    assert main(["logs", str(d), "--rank", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"kilocard logs: {d}: no line from rank 1 yet\n"


def test_follow_of_a_finished_local_run_returns(tmp_path, capsys):
    """No holder (the launcher cleared it), or a holder whose process is gone (a killed launcher): ended."""
    import json
    import platform

    for holder in ("", json.dumps({"host": platform.node(), "pid": 2**22 + 12345})):
        d = local_run_dir(tmp_path / f"r{len(holder)}", holder)
        assert main(["logs", str(d), "--follow"]) == 0
        assert capsys.readouterr().out == LOCAL


def test_follow_of_a_running_local_run_ends_when_its_launcher_lets_go(tmp_path, capsys):
    """While a live process holds the lock (as `kilocard run` does), --follow reads on; it ends at release."""
    from kilocard.commands.logs import show
    from kilocard.rundir import lock as runlock

    d = local_run_dir(tmp_path)
    held = runlock.acquire(d)

    def launcher():
        time.sleep(1.0)
        with (d / "logs" / "train.log").open("a") as f:
            f.write("[rank 0] kilocard.train: summary written\n")
        held.release()

    t = threading.Thread(target=launcher)
    t.start()
    began = time.monotonic()
    assert show(d, follow=True, poll_s=0.2) == 0
    t.join()
    assert capsys.readouterr().out.splitlines()[-1] == "[rank 0] kilocard.train: summary written"
    assert 0.9 < time.monotonic() - began < 10


def _local_run(tmp_path, train_log: str | None):
    """A local run's directory (``kilocard run``: launcher.kind local) whose ``logs/train.log`` is missing (None),
    a FIFO or a directory."""
    import os

    (tmp_path / "logs").mkdir(parents=True)
    write_frozen(compose(["recipe=tiny_gpt"]), tmp_path)
    log = tmp_path / "logs" / "train.log"
    if train_log == "fifo":
        os.mkfifo(log)
    elif train_log == "dir":
        log.mkdir()
    return tmp_path


def test_a_local_log_that_cannot_be_read_or_waited_for_is_one_line_exit_2(tmp_path, capsys):
    """``logs --follow`` of a run whose train.log is missing, a FIFO or a directory never returned: each is one line
    naming the file and what it is, exit 2, at once. Without ``--follow`` a FIFO or a directory is the same line;
    a missing log is the note that the run has no output yet (``test_a_run_without_output_yet_says_so``)."""
    from bad_files import finishes

    cases = {None: "train.log: missing, and no kilocard run is writing this run", "fifo": "is a FIFO (named pipe)"}
    cases["dir"] = "train.log: is a directory, not a regular file"
    for i, (kind, says) in enumerate(cases.items()):
        d = _local_run(tmp_path / str(i), kind)
        for follow in ([], ["--follow"]) if kind else (["--follow"],):
            result = finishes(lambda d=d, follow=follow: main(["logs", str(d), *follow]), seconds=20)
            err = capsys.readouterr().err
            assert result.get("value") == 2, (kind, follow, result, err)
            assert len(err.strip().splitlines()) == 1 and says in err, (kind, err)
    assert main(["logs", str(_local_run(tmp_path / "r", None)), "--rank", "-1"]) == 2
    assert "--rank -1" in capsys.readouterr().err
