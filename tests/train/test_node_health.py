"""The node health check (kilocard.train.health): its checks, the failed-rank bookkeeping, and the
collective verdict on two real gloo ranks."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from kilocard import exitcodes
from kilocard.base.net import free_port
from kilocard.config.compose import compose, to_run_config
from kilocard.rundir.names import BLOCKLIST, EXIT_DIR_ENV, FAILED_RANKS, UNHEALTHY_NODES_ENV
from kilocard.train import health

pytestmark = pytest.mark.integration  # the node health check runs on torch.distributed


def test_fault_injection_names_nodes():
    env = {UNHEALTHY_NODES_ENV: "n2, n5"}
    assert health.injected_problems("n5", env) and not health.injected_problems("n1", env)
    assert not health.injected_problems("n5", {})


def test_gpu_count_and_free_space(tmp_path):
    assert health.gpu_count_problems(8, 8) == []
    assert health.gpu_count_problems(8, 7) == ["7 GPU(s) visible, cluster.gpus_per_node=8"]
    assert health.disk_problems(tmp_path, 1) == []
    (msg,) = health.disk_problems(tmp_path, 10**18)  # a million TB: no filesystem here has that free
    assert "one checkpoint needs 1000000000.00 GB" in msg and str(tmp_path) in msg


class FakeNVML:
    """A stand-in for pynvml: NVML needs a GPU, and this machine has none (the real calls are the same names)."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, nvmlEventTypeXidCriticalError = 1, 0, 8

    class NVMLError(Exception):
        pass

    def __init__(self, ecc: int, remap: tuple[int, int, int, int], xids: list[int]):
        self.ecc, self.remap, self.xids = ecc, remap, list(xids)

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        return self.ecc

    def nvmlDeviceGetRemappedRows(self, handle):
        return self.remap

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, handle, kinds, events):
        pass

    def nvmlEventSetWait_v2(self, events, ms):
        if not self.xids:
            raise self.NVMLError("timeout")
        return type("Event", (), {"device": "h1", "eventData": self.xids.pop(0)})()

    def nvmlEventSetFree(self, events):
        pass

    def nvmlDeviceGetIndex(self, handle):
        return int(handle[1:])


def test_nvml_findings_name_the_gpu():
    bad = FakeNVML(ecc=3, remap=(0, 1, 1, 0), xids=[79])
    assert health.nvml_device_problems(bad, 0, "h0") == [
        "GPU 0: 3 uncorrected ECC error(s) since the driver loaded",
        "GPU 0: a row remap is pending (the GPU needs a reset)",
    ]
    assert health.nvml_xid_problems(bad, ["h0", "h1"]) == ["GPU 1: XID 79"]
    good = FakeNVML(ecc=0, remap=(0, 0, 0, 0), xids=[])
    assert health.nvml_device_problems(good, 0, "h0") == [] and health.nvml_xid_problems(good, ["h0"]) == []


def test_failed_rank_is_blamed_only_when_one_node_hosted_it(tmp_path):
    run_dir, exit_dir = tmp_path / "run", tmp_path / "exit"
    exit_dir.mkdir(parents=True)
    env = {"TORCHELASTIC_RESTART_COUNT": "1", "SLURM_JOB_ID": "7", "WORLD_SIZE": "4"}
    for rank, node in enumerate(["n1", "n1", "n2", "n2"]):
        health.leave_node_record(exit_dir, rank, node)
    for rank in (0, 1, 2):  # rank 3 was killed: no exit code
        (exit_dir / f"rank_{rank}").write_text(f"{exitcodes.FAULT}\n")
    (exit_dir / "node_4").write_text("n1\n")  # left by an earlier, larger launch: not this run's rank
    assert health.unrecorded_ranks(exit_dir, 4) == {3: "n2"}
    assert health.blame_previous_attempt(run_dir, exit_dir, env) == {}  # once
    assert (run_dir / FAILED_RANKS).read_text().startswith("n2\t3\t7\t0\t")
    (msg,) = health.blame_previous_attempt(run_dir, exit_dir, {**env, "TORCHELASTIC_RESTART_COUNT": "2"}).values()
    assert "hosted the failed rank of 2 in-job restarts" in msg
    (exit_dir / "rank_0").unlink()  # unrecorded ranks on two nodes: no node is blamed
    assert health.blame_previous_attempt(run_dir, exit_dir, env) == {}
    assert len((run_dir / FAILED_RANKS).read_text().splitlines()) == 2


def test_verdict_and_blocklist(tmp_path):
    bad = health.merge_verdicts([("n1", ["a"], {}), ("n1", ["a"], {"n2": "twice"}), ("n3", [], {})])
    assert bad == {"n1": ["a"], "n2": ["twice"]}
    health.append_blocklist(tmp_path, {"n1": ["no\tspace\nleft"]}, "42")
    health.append_blocklist(tmp_path, {"n2": ["x"], "n1": ["again"]}, "43")
    assert health.blocklisted(tmp_path) == ["n1", "n2"]
    node, reason, job, _ = (tmp_path / BLOCKLIST).read_text().splitlines()[0].split("\t")
    assert (node, reason, job) == ("n1", "no space left", "42")
    assert health.verdict_code(True, ["n1"], ["n2"], 2) == exitcodes.BAD_NODE
    assert health.verdict_code(False, [], ["n2"], 2) == exitcodes.FAULT
    assert health.verdict_code(True, ["n1", "n3"], ["n2"], 2) == exitcodes.CRASH


def test_a_node_this_job_blocklisted_is_named_again(tmp_path):
    """A restarted attempt (or a requeue whose exclusion failed) that finds a node this job blocklisted in its
    allocation ends BAD_NODE again: the node of job 42 is named for job 42 only, and a node not in the job is not."""
    health.append_blocklist(tmp_path, {"n1": ["hosted the failed rank of 2 in-job restarts"]}, "42")
    health.append_blocklist(tmp_path, {"n2": ["x"]}, "41")
    found = health.listed_by_job(tmp_path, ["n1", "n2", "n3"], "42")
    assert list(found) == ["n1"] and "hosted the failed rank of 2" in found["n1"], found
    assert health.listed_by_job(tmp_path, ["n3"], "42") == {} and health.listed_by_job(tmp_path, ["n1"], "43") == {}
    assert health.listed_by_job(tmp_path / "none", ["n1"], "42") == {}


def _rank(rank: int, port: int, run_dir: Path, exit_dir: Path, env: dict, out) -> None:
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ[EXIT_DIR_ENV] = str(exit_dir)
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    cfg = to_run_config(compose(["recipe=tiny_gpt", "launcher.max_excluded_nodes=1"]))
    out.put((rank, health.check(cfg, run_dir, os.environ, on_gpu=False)))
    dist.destroy_process_group()


def run_two_ranks(tmp_path: Path, env: dict) -> dict[int, int | None]:
    run_dir, exit_dir = tmp_path / "run", tmp_path / "exit"
    exit_dir.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(exist_ok=True)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, run_dir, exit_dir, env, out)) for r in range(2)]
    for p in procs:
        p.start()
    codes = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return codes


@pytest.mark.slow
def test_two_ranks_agree_on_the_verdict_and_blocklist_the_node(tmp_path):
    """Two real gloo ranks on one node: healthy -> None on both; injected -> both BAD_NODE, one blocklist line;
    the same job's ranks started again on that node -> BAD_NODE again, still one line;
    a second bad node past launcher.max_excluded_nodes=1 -> both CRASH, nothing more blocklisted."""
    base = {"SLURMD_NODENAME": "nA", exitcodes.INJOB_ENV: "2", "SLURM_JOB_ID": "9"}
    assert run_two_ranks(tmp_path, base) == {0: None, 1: None}
    assert sorted(p.name for p in (tmp_path / "exit").iterdir()) == ["node_0", "node_1"]
    assert run_two_ranks(tmp_path, {**base, UNHEALTHY_NODES_ENV: "nA"}) == {0: 77, 1: 77}
    assert health.blocklisted(tmp_path / "run") == ["nA"]
    # the launcher restarted the ranks on the node anyway: BAD_NODE again, and no second line
    assert run_two_ranks(tmp_path, base) == {0: 77, 1: 77}
    assert len((tmp_path / "run" / BLOCKLIST).read_text().splitlines()) == 1
    crash = {**base, "SLURMD_NODENAME": "nB", UNHEALTHY_NODES_ENV: "nB"}
    assert run_two_ranks(tmp_path, crash) == {0: exitcodes.CRASH, 1: exitcodes.CRASH}
    assert health.blocklisted(tmp_path / "run") == ["nA"]
