"""The local (node-memory) checkpoint tier in real runs: two gloo CPU ranks of tiny_gpt under `kilocard run`,
persistent saves every 10 steps and local saves every 2 (NVRx's LocalCheckpointManager, one directory per
rank under a node-local root). A rank SIGKILLed right after local step 6 is resumed from local step 6,
not from scratch, with the uninterrupted loss curve bit for bit; a corrupted local copy on one rank makes
the resume fall back to the persistent step, logged; ``kilocard goodput`` reports both tiers' time."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faults import kill_rank, losses, run_dir_of, train_log
from kilocard import exitcodes
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events
from kilocard.train import local_ckpt as lc

pytestmark = pytest.mark.slow

ITERS, EVERY, LOCAL_EVERY = 20, 10, 2
"""Steps, steps between persistent saves, steps between local saves."""


def args(local_root: Path) -> list[str]:
    """The run every test here starts (the same config as the uninterrupted reference)."""
    return [
        "--nproc",
        "2",
        "recipe=tiny_gpt",
        f"trainer.train_iters={ITERS}",
        f"checkpoint.save_interval={EVERY}",
        f"checkpoint.non_persistent_save_interval={LOCAL_EVERY}",
        f"checkpoint.non_persistent_local_ckpt_dir={local_root}",
        "trainer.tensorboard=false",
    ]


def local_commits(run_dir: Path) -> list[int]:
    """Steps of the local saves recorded in events.jsonl."""
    return [e["step"] for e in events.read(run_dir) if e["event"] == "commit" and e.get("tier") == events.LOCAL]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run with both tiers: (run dir, [(step, loss)])."""
    from conftest import KilocardRun

    work = tmp_path_factory.mktemp("reference")
    code, out, run_dir = KilocardRun(work)(*args(work / "local"), timeout=300)
    assert code == exitcodes.DONE, out[-3000:]
    assert local_commits(run_dir) == [s for s in range(LOCAL_EVERY, ITERS, LOCAL_EVERY) if s % EVERY]
    assert list((work / "local").iterdir()) == [], "a run that ended DONE leaves no local copy behind"
    return run_dir, losses(run_dir)


def fault_after_local_step(kilocard_run, local_root: Path, step: int) -> tuple[Path, int]:
    """Start the run and SIGKILL rank 1 as soon as events.jsonl records local step ``step``; returns the run
    dir (the run ended FAULT) and the newest local step recorded (``step``, or the next if the kill lands late)."""
    proc = kilocard_run.start(*args(local_root))
    assert proc.stdout is not None
    run_dir = None
    while run_dir is None:
        line = proc.stdout.readline()
        assert line, "kilocard run printed no run dir"
        run_dir = run_dir_of(line, kilocard_run.workdir)
    drain = threading.Thread(target=proc.communicate, daemon=True)
    drain.start()
    deadline = time.monotonic() + 240
    while step not in local_commits(run_dir):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the fault"
        time.sleep(0.005)
    kill_rank(proc, 1)
    assert proc.wait(timeout=120) == exitcodes.FAULT
    drain.join(timeout=60)
    return run_dir, max(local_commits(run_dir))


def goodput_json(run_dir: Path) -> dict:
    cli = [sys.executable, "-m", "kilocard.cli", "goodput", str(run_dir), "--format", "json"]
    return json.loads(subprocess.run(cli, capture_output=True, text=True, check=True).stdout)


def test_killed_rank_resumes_from_local_step_6_bit_exact_and_goodput_counts_both_tiers(reference, kilocard_run):
    root = kilocard_run.workdir / "local"
    run_dir, newest = fault_after_local_step(kilocard_run, root, 6)
    assert newest in (6, 8) and ck.latest_committed(run_dir / "checkpoints") is None  # nothing persistent yet

    code, out, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    log = train_log(run_dir)
    assert f"resumed from local step {newest} ({root / lc.session_id(run_dir)}, " in log
    assert losses(run_dir) == reference[1]
    assert list(root.iterdir()) == []

    got = goodput_json(run_dir)
    assert got["checkpoint_s"]["local"] > 0 and got["checkpoint_s"]["persistent"] > 0
    [fault] = got["faults"]
    assert fault["kind"] == "rank_lost" and fault["step"] >= newest
    assert fault["step"] - fault["steps_recomputed"] == newest  # recomputed from local step 6, not from 0
    text = subprocess.run(
        [sys.executable, "-m", "kilocard.cli", "goodput", str(run_dir)], capture_output=True, text=True
    )
    assert f"resumed from local step {newest} in" in text.stdout


def test_corrupted_local_copy_on_one_rank_falls_back_to_the_persistent_step(reference, kilocard_run):
    root = kilocard_run.workdir / "local"
    run_dir, newest = fault_after_local_step(kilocard_run, root, 12)
    assert ck.latest_committed(run_dir / "checkpoints") == EVERY
    copy = root / lc.session_id(run_dir) / "1" / f"iter_{newest:07d}_1_local.pt"
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))

    code, out, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    log = train_log(run_dir)
    assert f"local tier not used (rank 1: {copy} fails its sha256 check (corrupted)" in log
    assert f"resumed from {ck.step_dir(run_dir / 'checkpoints', EVERY)} (step {EVERY}," in log
    assert losses(run_dir) == reference[1]
    [fault] = goodput_json(run_dir)["faults"]
    assert fault["step"] - fault["steps_recomputed"] == EVERY
