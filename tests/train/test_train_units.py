"""Trainer pieces without ranks: rank environment, exit-code aggregation, hang guard, throughput figures."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from kilocard import exitcodes
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.local import torchrun_command
from kilocard.rundir.metrics import Throughput
from kilocard.train.dist_env import alone, init_process_group, resolve, step_delay


def test_slurm_variables_are_accepted():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    r = resolve(env)
    assert (r.rank, r.world_size, r.local_rank) == (5, 8, 1) and env["RANK"] == "5"


def test_torchrun_variables_win_and_missing_master_is_named():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "SLURM_PROCID": "7"}
    assert resolve(env).rank == 1
    with pytest.raises(ValueError, match="MASTER_PORT: not set"):
        resolve({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "n1"})


def test_single_process_defaults():
    env: dict = {}
    r = resolve(env)
    assert (r.rank, r.world_size) == (0, 1) and "MASTER_PORT" not in env and alone(env)
    assert not alone({"WORLD_SIZE": "1", "MASTER_PORT": "29500"})  # torchrun's one rank meets its agent's store


@pytest.mark.integration  # a real gloo process group
def test_a_lone_rank_binds_no_port():
    """A single process (``python -m kilocard.train RUN``) meets in an in-memory store: a port picked before
    torch imports could be taken by another process's connection before the bind (EADDRINUSE in a full run)."""
    import datetime

    import torch
    import torch.distributed as dist

    env: dict = {}
    resolve(env)
    init_process_group("gloo", env, datetime.timedelta(seconds=30))
    try:
        assert isinstance(dist.distributed_c10d._get_default_store().underlying_store, dist.HashStore)
        t = torch.ones(2)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_rank_exit_codes_decide_the_run_code(tmp_path):
    for name, code in (("rank_0", "75"), ("rank_1", "75")):
        (tmp_path / name).write_text(code)
    assert exitcodes.from_exit_dir(str(tmp_path), 1) == exitcodes.RETRY
    (tmp_path / "rank_1").write_text("3")
    assert exitcodes.from_exit_dir(str(tmp_path), 1) == exitcodes.BAD_CKPT
    assert exitcodes.from_exit_dir(str(tmp_path / "none"), 1) == exitcodes.CRASH
    assert exitcodes.from_exit_dir(str(tmp_path), exitcodes.FAULT) == exitcodes.FAULT


def test_every_rank_recording_done_under_a_failed_launcher_is_a_fault(tmp_path):
    for name in ("rank_0", "rank_1"):
        (tmp_path / name).write_text("0")
    assert exitcodes.from_exit_dir(str(tmp_path), 0) == exitcodes.DONE
    assert exitcodes.from_exit_dir(str(tmp_path), 1) == exitcodes.FAULT


@pytest.mark.integration  # a real child process
def test_exitcodes_module_prints_the_run_code_for_the_batch_script(tmp_path):
    import subprocess
    import sys

    (tmp_path / "rank_0").write_text("75")
    out = subprocess.run(
        [sys.executable, "-m", "kilocard.exitcodes", str(tmp_path), "0"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "75"


def test_under_a_restarting_launcher_only_a_fault_exits_non_zero():
    from kilocard.train.entry import launcher_status

    injob = {exitcodes.INJOB_ENV: "2"}
    assert launcher_status(exitcodes.FAULT, injob) == exitcodes.FAULT
    for code in (exitcodes.DONE, exitcodes.RETRY, exitcodes.BAD_CONFIG, exitcodes.BAD_CKPT, exitcodes.CRASH):
        assert launcher_status(code, injob) == 0
        assert launcher_status(code, {}) == code


def test_torchrun_command_runs_the_train_module(tmp_path):
    cmd = torchrun_command(tmp_path, 4, 12345)
    assert (
        "--nproc-per-node=4" in cmd
        and "--master-port=12345" in cmd
        and cmd[-3:] == ["-m", "kilocard.train", str(tmp_path)]
    )


@pytest.mark.integration  # a real child process
def test_watchdog_exits_fault_with_a_clear_message():
    code = (
        "from kilocard.train.signals import Watchdog; import time; w = Watchdog(0.3, 3).start(); "
        "w.beat('step 7')\ndef stuck_in_a_collective():\n    time.sleep(5)\nstuck_in_a_collective()"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == exitcodes.FAULT
    assert "[rank 3] kilocard.train: no progress for" in p.stderr and "in step 7" in p.stderr
    # every thread's stack follows, so the log names the call the rank hung in
    assert re.search(r"line \d+ in stuck_in_a_collective", p.stderr), p.stderr


_HUNG_WITH_A_MANAGER = """
import multiprocessing as mp, os, sys, time
from kilocard.train.signals import Watchdog
queue = mp.get_context("spawn").Manager().Queue()  # as Megatron-Core's checkpoint writer starts one
writer = mp.get_context("fork").Process(target=time.sleep, args=(120,))  # a writer stuck in the save
writer.start()
print(*[p.pid for p in mp.active_children()], flush=True)
w = Watchdog(0.3, 0).start()
w.beat("step 3")
w.beat("saving step 3")
time.sleep(30)
"""


@pytest.mark.integration  # a real child process
def test_watchdog_exit_leaves_no_spawned_process_behind(tmp_path):
    """The processes a hung rank started (the checkpoint writer's spawned Manager, a forked writer) die with
    it: an orphan would hold the rank's output open (Slurm waits 60 s for it) and stay on the node."""
    import time

    import psutil

    out = tmp_path / "children"
    with open(out, "w") as f:  # a file, not a pipe: an orphan would hold a pipe open
        cmd = [sys.executable, "-c", _HUNG_WITH_A_MANAGER]
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == exitcodes.FAULT, p.stderr
    children = [int(pid) for pid in out.read_text().split()]
    assert len(children) == 2, "the Manager and the writer were started"
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        alive = [c for c in alive if psutil.pid_exists(c) and psutil.Process(c).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.05)
    for c in alive:
        psutil.Process(c).kill()
    assert not alive, f"spawned process(es) {alive} outlived the rank"


def test_throughput_names_its_peak_and_uses_megatron_flops():
    from kilocard.perf.flops import flops_per_iteration

    rc = to_run_config(compose(["recipe=tiny_gpt", "cluster.gpu=h100-sxm5-80gb", "precision=bf16"]))
    t = Throughput.for_run(rc, world_size=8)
    assert t.peak_name == "h100-sxm5-80gb bf16 dense 989 TFLOP/s"
    f = t.figures(step_time_s=2.0)
    assert f["tflops_per_gpu"] == pytest.approx(flops_per_iteration(rc, "megatron_current") / 8 / 2.0 / 1e12)
    assert f["mfu"] == pytest.approx(f["tflops_per_gpu"] * 1e12 / 989e12)
    assert f["tokens_per_s_per_gpu"] == pytest.approx(rc.trainer.global_batch_size * rc.model.seq_length / 8 / 2.0)


@pytest.mark.integration  # TensorBoard's writer is torch.utils.tensorboard
def test_metrics_writer_tensorboard_scalars_read_back(tmp_path):
    """Every numeric field of a record is a ``train/<key>`` scalar at its step, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kilocard.rundir.metrics import MetricsWriter, read_metrics

    w = MetricsWriter(tmp_path, tensorboard=True, resume_step=0)
    for step in (1, 2, 3):
        w.write({"step": step, "loss": 10.0 - step, "mfu": None, "mfu_peak": "cpu", "step_time_s": 0.5 * step})
    w.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert sorted(acc.Tags()["scalars"]) == ["train/loss", "train/step_time_s"]
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 9.0), (2, 8.0), (3, 7.0)]
    assert [e.value for e in acc.Scalars("train/step_time_s")] == [0.5, 1.0, 1.5]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


_FORK_THEN_DIE = """
import multiprocessing as mp, os, signal, sys, time
from kilocard.train.signals import die_with_parent_in_forks
if sys.argv[1] == "guard":
    assert die_with_parent_in_forks()
child = mp.get_context("fork").Process(target=time.sleep, args=(120,))
child.start()
print(child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the rank dies mid-save: no cleanup runs
"""


@pytest.mark.integration  # a real child process
@pytest.mark.parametrize("guard", [True, False])
def test_forked_helpers_die_with_their_rank(guard, tmp_path):
    """A process forked by a rank (as Megatron-Core's checkpoint writers are) is SIGKILLed when the
    rank dies, so it cannot keep the rank's sockets open; without the guard it outlives the rank
    (the control case, which shows the test can fail)."""
    import time

    import psutil

    out = tmp_path / "child_pid"
    with open(out, "w") as f:  # a file, not a pipe: an orphaned child would hold a pipe open
        subprocess.run([sys.executable, "-c", _FORK_THEN_DIE, "guard" if guard else "none"], stdout=f, timeout=60)
    child = int(out.read_text().split()[0])
    deadline = time.monotonic() + (10 if guard else 2)
    while (
        time.monotonic() < deadline
        and psutil.pid_exists(child)
        and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    ):
        time.sleep(0.05)
    alive = psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE
    if alive:
        psutil.Process(child).kill()
    assert alive is not guard


@pytest.mark.integration  # a real child process
def test_checkpoint_files_and_names_import_without_torch():
    """The launchers and the progress table read what the ranks write (tracker, manifest, metrics, exit
    codes) by the same names, without importing torch: ``kilocard.rundir.names`` and the file layer."""
    code = (
        "import sys, kilocard.rundir.names, kilocard.rundir.checkpoint, kilocard.rundir.progress,"
        " kilocard.rundir.goodput_report, kilocard.rundir.lock, kilocard.train.signals;"
        "print('torch' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


def test_recorded_exit_code_is_what_the_launcher_reads(tmp_path, monkeypatch):
    """A rank's ``record_exit`` (entry and watchdog alike) lands where ``kilocard run`` looks for it."""
    from kilocard.rundir.names import EXIT_DIR_ENV
    from kilocard.train.signals import record_exit

    monkeypatch.setenv(EXIT_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    record_exit(exitcodes.BAD_CKPT)
    assert (tmp_path / "rank_3").read_text() == "3\n"
    assert exitcodes.from_exit_dir(str(tmp_path), 1) == exitcodes.BAD_CKPT


def test_step_delay_injection_is_seconds_or_one_line_naming_the_variable():
    """KILOCARD_FAULT_STEP_DELAY_S (tests that need a run to outlast a Slurm signal): unset is no delay."""
    assert step_delay({}) == 0.0 and step_delay({"KILOCARD_FAULT_STEP_DELAY_S": "0.25"}) == 0.25
    for bad in ("-1", "soon", "nan", "inf", "1e308", "3601"):
        with pytest.raises(ValueError, match=rf"KILOCARD_FAULT_STEP_DELAY_S='{bad}': expected seconds from 0 to 3600;"):
            step_delay({"KILOCARD_FAULT_STEP_DELAY_S": bad})
