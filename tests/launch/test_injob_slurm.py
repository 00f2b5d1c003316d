"""In-job restarts and bad-node exclusion on the real local Slurm cluster: every job under NVRx's
ft_launcher on 2 nodes x 2 CPU ranks (a killed rank takes its node's other rank down with it, and
``kilocard logs --rank`` must tell a rank from its node's srun label); e), which has no ft_launcher, on 2 nodes
x 1 rank (half the ranks to start). (Under ft_launcher with one rank per node, both nodes on this one host,
the ranks hung once in the restarted attempt's start and once in the step after USR1, in 2 of 5 tries here;
each job then requeued and completed: docs/faults.md names the likely cause of the first and its fix.)

a) ``launcher.max_restarts=2``: one rank SIGKILLed mid-run; NVRx's ft_launcher restarts every rank
   inside the same allocation and the job ends COMPLETED without a requeue (Restarts=0), with the loss
   of every step equal to an uninterrupted run's;
b) a node marked unhealthy by the health check's fault injection (``KILOCARD_FAULT_UNHEALTHY_NODES``)
   ends the first link of a two-link chain BAD_NODE; the link excludes the node from the queued second
   link, which completes on other nodes; the blocklist file and the log say so (the requeue's exclusion
   is d));
c) Slurm's USR1 under ft_launcher: the ranks save, exit RETRY and the job requeues;
d) the node that hosted the failed rank of two in-job restarts is excluded from the requeued job;
e) a hung rank without in-job restarts ends the step and the job requeues.
a) and d) submit their jobs themselves; b), c) and e) share one module fixture that submits their three
jobs together (6 nodes) and drives each fault from its own thread, so their requeue delays and the hang's
watchdog and ``srun --wait`` overlap instead of adding up. Every job is cancelled at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from kilocard.rundir.names import BLOCKLIST, FAILED_RANKS, UNHEALTHY_NODES_ENV
from slurm_runs import (
    ITERS,
    SLOW,
    Run,
    cancel,
    finished,
    idle_nodes,
    inject,
    jsonl,
    logs,
    losses,
    metrics,
    rank_on_node,
    recovery,
    scontrol,
    story,
    submit,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_killed_rank_restarts_in_the_same_job_with_the_uninterrupted_loss(local_slurm, tmp_path):
    ref = submit(tmp_path, "launcher.job_name=injob-ref")
    run = submit(tmp_path, "launcher.job_name=injob-kill", "launcher.max_restarts=2")
    try:
        killed_at = inject(run, rank=3, kind="kill")
        final, ref_final = finished(run), finished(ref)
    finally:
        cancel(ref, run)
    text = logs(run)
    assert final["JobState"] == "COMPLETED" and (run.run_dir / "DONE").exists(), text[-4000:]
    assert final["Restarts"] == "0", f"the job was requeued instead of restarted in the job:\n{text[-4000:]}"
    starts = [e for e in jsonl(run.run_dir / "events.jsonl") if e["event"] == "start"]
    assert [e["restart"] for e in starts] == [0, 1] and {e["job_id"] for e in starts} == {str(run.job_id)}
    rec = recovery(run, killed_at)
    assert rec["seconds_to_resume"] is not None and rec["seconds_to_resume"] < 60, rec
    # kilocard goodput, from the run's records alone, against the kill time this test took
    cli = [sys.executable, "-m", "kilocard.cli", "goodput", str(run.run_dir), "--format", "json"]
    [fault] = json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)["faults"]
    assert abs(fault["seconds_to_resume"] - rec["seconds_to_resume"]) <= 0.1 * rec["seconds_to_resume"], (fault, rec)
    assert fault["steps_recomputed"] == rec["steps_recomputed"], (fault, rec)
    assert ref_final["JobState"] == "COMPLETED", logs(ref)[-3000:]
    got = losses(run)
    assert sorted(got) == list(range(1, ITERS + 1))
    assert got == losses(ref)
    # with one launcher per node the srun label is the node's; --rank 3 picks the launcher's rank prefix
    cli = [sys.executable, "-m", "kilocard.cli", "logs", str(run.run_dir), "--rank", "3"]
    shown = subprocess.run(cli, capture_output=True, text=True, check=True).stdout.splitlines()
    rank3 = [x for x in shown if not x.startswith("[kilocard ")]
    assert rank3 and all(x.split(": ", 2)[1] == "[rank3]" for x in rank3), shown
    assert "[rank0]: " in text and not any("[rank0]: " in x for x in shown), shown


def test_node_that_hosted_the_failed_rank_twice_is_excluded(local_slurm, tmp_path):
    """A rank on the same node SIGKILLed in two attempts: the third attempt's health check blames the node
    twice, every rank ends BAD_NODE, and the requeued job completes without that node."""
    run = submit(tmp_path, "launcher.job_name=injob-twice", "launcher.max_restarts=3", env=SLOW)
    try:
        first = inject(run, rank=3, kind="kill")
        node = node_of_first_failure(run)
        # the restart's rank is found while it starts up, so the kill follows the step at once: the restart's
        # ~50 steps take over 12 s (SLOW), and a kill that lands after them tests nothing
        rank = wait_until(lambda: rank_on_node(run, node, first), 120, f"a restarted rank on {node}", every=0.5)
        wait_until(lambda: any(m["time"] > first and m["step"] >= 8 for m in metrics(run)), 300, "the restart's step 8")
        rank.send_signal(signal.SIGKILL)
        second = time.time()
        final = finished(run, 420)
    finally:
        cancel(run)
    text, told = logs(run), story(run)
    failed = [line.split("\t") for line in (run.run_dir / FAILED_RANKS).read_text().splitlines()]
    assert [(f[0], f[3]) for f in failed] == [(node, "0"), (node, "1")], (failed, told)
    done = [m["time"] for m in metrics(run) if m["step"] == ITERS]
    assert min(done, default=0.0) > second, "the second kill landed after the restart had trained its last step"
    reason = (run.run_dir / BLOCKLIST).read_text().split("\t")
    assert reason[0] == node and "hosted the failed rank of 2 in-job restarts" in reason[1], (reason, told)
    assert f"excluding node(s) {node} from the requeued job" in text, f"{told}\n...\n{text[-2000:]}"
    assert final["JobState"] == "COMPLETED" and final["Restarts"] == "1", told
    assert node not in scontrol("show", "hostnames", final["NodeList"]).split()
    assert sorted(losses(run)) == list(range(1, ITERS + 1))


def node_of_first_failure(run: Run) -> str:
    """The node of the rank the first kill hit, from the health check's record of the restart."""
    path = run.run_dir / FAILED_RANKS
    wait_until(lambda: path.exists() and path.read_text().strip(), 300, "the restart's failed-rank record")
    return path.read_text().split("\t", 1)[0]


def _unhealthy_node(run: Run) -> dict:
    """Nothing to inject (the health check's fault injection fails the node): the end of both links."""
    first = finished(run, 420)
    return {"first": first, "final": finished(Run(run.run_dir, run.later_links[-1]), 420)}


def _usr1_at_step_10(run: Run) -> dict:
    """``scancel --signal=USR1`` (what Slurm sends ``launcher.signal_lead_s`` before the limit) at step 10."""
    wait_until(lambda: len(metrics(run)) >= 10, 300, "step 10")
    subprocess.run(["timeout", "10", "scancel", "--signal=USR1", str(run.job_id)], check=True)
    return {"final": finished(run, 420)}


def _rank_1_stopped(run: Run) -> dict:
    """SIGSTOP of rank 1 (the second node's) after step 10: the job's end and the unix time of the signal."""
    stopped_at = inject(run, rank=1, kind="stop")
    return {"final": finished(run, 420), "stopped_at": stopped_at}


def _drive(run: Run, fault: Callable[[Run], dict]) -> dict:
    """``fault(run)``, the job cancelled whatever happens (a finished job is left as it is)."""
    try:
        return fault(run)
    finally:
        cancel(run)


@pytest.fixture(scope="module")
def side_by_side(local_slurm, tmp_path_factory) -> Iterator[dict[str, tuple[Run, Future]]]:
    """The unhealthy-node, USR1 and hung-rank runs submitted together (the unhealthy node's first, so Slurm
    gives it the first idle nodes), each fault driven from its own thread: {name: (run, future of its end)}.
    Submissions stay in this thread (``submit`` sets the environment it passes on)."""
    root: Path = tmp_path_factory.mktemp("side-by-side")
    nodes = wait_until(lambda: n if len(n := idle_nodes()) >= 4 else None, 300, "4 idle nodes", every=2)
    bad = nodes[0]  # Slurm gives a job the first idle nodes
    runs = {
        "unhealthy": submit(
            root,
            "launcher.job_name=badnode",
            "launcher.max_restarts=2",
            env={UNHEALTHY_NODES_ENV: bad},
            chain=2,
        ),
        "usr1": submit(root, "launcher.job_name=injob-usr1", "launcher.max_restarts=2", env=SLOW),
        "hang": submit(root, "launcher.job_name=hang-requeue", ranks=1),
    }
    faults = {"unhealthy": _unhealthy_node, "usr1": _usr1_at_step_10, "hang": _rank_1_stopped}
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {name: pool.submit(_drive, run, faults[name]) for name, run in runs.items()}
        try:
            yield {"bad": bad, **{name: (runs[name], futures[name]) for name in runs}}
        finally:
            cancel(*runs.values())  # a test that stopped early: end every job now, the threads then return


def test_unhealthy_node_is_excluded_from_the_next_chain_link_which_completes_elsewhere(side_by_side):
    """b) the node ``KILOCARD_FAULT_UNHEALTHY_NODES`` names fails the health check in link 1 of a chain of 2:
    BAD_NODE, blocklisted, and excluded from link 2 (queued since the submission), which completes on other
    nodes. Without the exclusion link 2 could start on the bad node and lose its whole allocation."""
    bad, (run, outcome) = side_by_side["bad"], side_by_side["unhealthy"]
    ends = outcome.result()
    first, final = ends["first"], ends["final"]
    (link2,) = run.later_links
    text = logs(run)
    blocklist = (run.run_dir / BLOCKLIST).read_text().splitlines()
    node, reason, job_id, _when = blocklist[0].split("\t")
    assert (node, job_id) == (bad, str(run.job_id)) and "fault injection" in reason, blocklist
    assert f"node(s) {bad} failed the health check" in text and "exiting BAD_NODE (77)" in text, text[-4000:]
    assert f"excluding node(s) {bad} from chain link job {link2}" in text, text[-4000:]
    assert first["Restarts"] == "0" and "the next chain link continues the run" in text, text[-4000:]
    assert final["JobState"] == "COMPLETED", text[-4000:]
    assert bad in scontrol("show", "hostnames", final["ExcNodeList"]).split()
    assert bad not in scontrol("show", "hostnames", final["NodeList"]).split()
    assert sorted(losses(run)) == list(range(1, ITERS + 1)) and (run.run_dir / "DONE").exists()


def test_usr1_before_the_time_limit_saves_and_requeues_under_ft_launcher(side_by_side):
    """Slurm's ``--signal=USR1@lead`` reaches every process of the step, the launcher too. The launcher
    ignores it; the ranks save, exit RETRY, and the job requeues. (Without the batch script's
    ``trap "" USR1`` the launcher died of it, ``srun: error: n1: task 0: User defined signal 1``, exit 138,
    and slurmstepd then ends the step, with ranks that may still be saving.)"""
    run, outcome = side_by_side["usr1"]
    final = outcome.result()["final"]
    text = logs(run)
    assert "exiting RETRY (75)" in text and "trainer exit code 75" in text, text[-4000:]
    assert "User defined signal 1" not in text and "ft_launcher exit code 0" in text, text[-4000:]
    assert final["JobState"] == "COMPLETED" and final["Restarts"] == "1", text[-4000:]
    assert sorted(losses(run)) == list(range(1, ITERS + 1)) and (run.run_dir / "DONE").exists()


def test_hung_rank_without_in_job_restarts_ends_the_step_and_the_job_requeues(side_by_side):
    """``launcher.max_restarts=0``: a SIGSTOPped rank never exits, so srun used to wait for it until the time
    limit. The healthy ranks' watchdog ends them FAULT after ``trainer.hang_timeout_s`` (20 s here); srun's
    ``--wait`` then kills the stopped rank, the step ends and the batch script requeues; the requeued job
    resumes from the last committed step and completes."""
    run, outcome = side_by_side["hang"]
    got = outcome.result()
    final = got["final"]
    text = logs(run)
    assert final["JobState"] == "COMPLETED" and (run.run_dir / "DONE").exists(), text[-4000:]
    assert int(final["Restarts"]) >= 1, text[-4000:]
    rec = recovery(run, got["stopped_at"])
    # watchdog 20 s + srun --wait 30 s + requeue (about 11 s here) + start-up: well under the 10 min limit
    assert rec["seconds_to_resume"] is not None and rec["seconds_to_resume"] < 240, rec
    assert sorted(losses(run)) == list(range(1, ITERS + 1))
