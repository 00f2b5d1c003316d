"""Faults injected into real training runs: two gloo CPU ranks under `kilocard run` (torchrun).

Each test interrupts the same 24-step tiny_gpt run (a committed step every 4) and checks what
kilocard promises for that fault (docs/faults.md): the exit code of the contract, how fast the
run gives up, which step a restart loads, and that the restarted loss curve equals the
uninterrupted run's step for step (deterministic mode, so equal means bit-equal). The hung-rank
run starts in the background as the module starts: it mostly waits, beside the other tests' runs.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import KilocardRun
from faults import (
    EVERY,
    ITERS,
    TINY,
    exit_codes,
    kill_rank,
    losses,
    rank_process,
    records,
    run_until,
    tracker,
    train_log,
)
from kilocard import exitcodes
from kilocard.rundir import checkpoint as ck

pytestmark = pytest.mark.slow

FAIL_FAST_S = 60
"""A dead rank ends the whole run within this many seconds (torchrun sees the death at once; the
surviving rank's gloo collective fails when its peer's socket closes)."""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: (run dir, [(step, loss)])."""
    runner = KilocardRun(tmp_path_factory.mktemp("reference"))
    code, out, run_dir = runner(*TINY, timeout=300)
    assert code == exitcodes.DONE, out[-3000:]
    curve = losses(run_dir)
    assert [s for s, _ in curve] == list(range(1, ITERS + 1))
    return run_dir, curve


def test_sigkill_mid_step_then_usr1_on_one_rank_then_deleted_shard_resumes_exactly(reference, kilocard_run):
    """SIGKILL of rank 1 in the middle of a step -> FAULT within FAIL_FAST_S, the last committed step
    intact; resumed, USR1 to rank 1 only -> both ranks save the same step and exit RETRY; a shard of
    that newest step deleted, with checkpoint.fallback_to_previous=true -> the previous committed
    step is loaded and the run finishes with the uninterrupted loss curve. The finished run then goes on
    to ``deleted_metadata_falls_back_and_a_torn_metrics_line_does_not_block_the_resume``."""
    args = [*TINY, "checkpoint.fallback_to_previous=true", "checkpoint.keep_last=3"]
    ckpts = lambda d: d / "checkpoints"  # noqa: E731

    code, out, run_dir, took = run_until(kilocard_run, args, lambda p, d, s: s > EVERY and kill_rank(p, 1) is None)
    assert code == exitcodes.FAULT, out[-3000:]
    assert took < FAIL_FAST_S, f"the run took {took:.0f}s to give up after a rank died"
    killed_at = tracker(run_dir)
    assert killed_at is not None and killed_at < ITERS
    ck.verify_step(ck.step_dir(ckpts(run_dir), killed_at))

    code, out, _, _ = run_until(
        kilocard_run,
        ["--resume", str(run_dir)],
        lambda p, d, s: s > killed_at + 1 and kill_rank(p, 1, signal.SIGUSR1) is None,
        after_step=records(run_dir)[-1]["step"],
    )
    assert code == exitcodes.RETRY, out[-3000:]
    stopped = tracker(run_dir)
    assert stopped is not None and killed_at < stopped < ITERS
    assert exit_codes(run_dir) == [exitcodes.RETRY, exitcodes.RETRY]
    assert f"committed step {stopped}; exiting RETRY" in train_log(run_dir)
    assert f"resumed from {ck.step_dir(ckpts(run_dir), killed_at)} (step {killed_at}," in train_log(run_dir)

    shard = sorted(ck.step_dir(ckpts(run_dir), stopped).glob("*.distcp"))[0]
    shard.unlink()
    previous = ck.committed_steps(ckpts(run_dir))[1]
    code, out, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    assert f"resumed from {ck.step_dir(ckpts(run_dir), previous)} (step {previous}," in train_log(run_dir)
    assert losses(run_dir) == reference[1]
    deleted_metadata_falls_back_and_a_torn_metrics_line_does_not_block_the_resume(reference, kilocard_run, run_dir)


def test_sigkill_during_checkpoint_save_never_loads_the_partial_step(reference, kilocard_run):
    """SIGKILL of rank 1 while a step (the second save or a later one) is being written: FAULT; it has no
    manifest and the tracker still names the step before; the resume loads that one (never the
    partial step), rewrites the rest and finishes with the uninterrupted loss curve; no
    uncommitted step directory is left behind."""
    partial_steps = []

    def kill_while_saving(proc, run_dir, step):
        rank1 = rank_process(proc.pid, 1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            target = max(2 * EVERY, (tracker(run_dir) or 0) + EVERY)
            sdir = ck.step_dir(run_dir / "checkpoints", target)
            if sdir.exists() and not (sdir / ck.MANIFEST).exists():
                rank1.kill()
                partial_steps.append(target)
                return True
            time.sleep(0.002)
        raise AssertionError("no save started within 60 s")

    code, out, run_dir, took = run_until(kilocard_run, list(TINY), kill_while_saving)
    assert code == exitcodes.FAULT, out[-3000:]
    assert took < FAIL_FAST_S
    ckpts, partial = run_dir / "checkpoints", partial_steps[0]
    assert tracker(run_dir) == partial - EVERY, "the step being written when the rank died was committed"
    assert not (ck.step_dir(ckpts, partial) / ck.MANIFEST).exists()
    assert ck.committed_steps(ckpts)[0] == partial - EVERY

    code, out, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    assert f"resumed from {ck.step_dir(ckpts, partial - EVERY)} (step {partial - EVERY}," in train_log(run_dir)
    leftovers = [d.name for d in ckpts.glob("step_*") if not (d / ck.MANIFEST).exists()]
    assert leftovers == []
    assert losses(run_dir) == reference[1]


def test_corrupted_byte_in_committed_shard_is_bad_ckpt_naming_step_and_file(reference, tmp_path):
    """One flipped byte in a shard of the newest committed step: the resume stops with BAD_CKPT (3)
    and a message naming the step and the file, before any training step (no new metrics)."""
    src, _ = reference
    run_dir = tmp_path / "copy"
    shutil.copytree(src, run_dir)
    shard = sorted(ck.step_dir(run_dir / "checkpoints", ITERS).glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    before = records(run_dir)

    code, out, _ = KilocardRun(tmp_path)("--resume", str(run_dir))
    assert code == exitcodes.BAD_CKPT, out[-3000:]
    assert f"checkpoint step {ITERS}: file {shard} fails its sha256 check" in out
    tracker_file = run_dir / "checkpoints" / ck.TRACKER
    assert f"step {ITERS - EVERY} is the newest committed step that passes; to resume from it, write " in out
    assert f"{ITERS - EVERY} into {tracker_file}" in out
    assert records(run_dir) == before

    # the fix the message names works with --resume (which takes no overrides)
    tracker_file.write_text(f"{ITERS - EVERY}\n")
    code, out, _ = KilocardRun(tmp_path)("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    assert losses(run_dir) == reference[1]


def _swap_two_weights(metadata: Path) -> None:
    """Swap where torch_dist's ``.metadata`` says two same-sized model weights lie (pickle load, swap, dump)."""
    md = pickle.loads(metadata.read_bytes())
    by_fqn = {k.fqn: k for k in md.storage_data}
    a, b = by_fqn["embedding.word_embeddings.weight"], by_fqn["output_layer.weight"]
    assert md.storage_data[a].length == md.storage_data[b].length
    md.storage_data[a], md.storage_data[b] = md.storage_data[b], md.storage_data[a]
    metadata.write_bytes(pickle.dumps(md))


def test_swapped_entries_of_torch_dist_metadata_are_bad_ckpt_naming_the_file(reference, tmp_path):
    """Two entries of the newest step's ``.metadata`` swapped (each weight then loads from the other's
    bytes, with no error from torch_dist): the resume stops with BAD_CKPT (3) naming ``.metadata``
    before any training step, instead of training on the wrong weights."""
    src, _ = reference
    run_dir = tmp_path / "copy"
    shutil.copytree(src, run_dir)
    metadata = ck.step_dir(run_dir / "checkpoints", ITERS) / ".metadata"
    _swap_two_weights(metadata)
    before = records(run_dir)

    code, out, _ = KilocardRun(tmp_path)("--resume", str(run_dir))
    assert code == exitcodes.BAD_CKPT, out[-3000:]
    assert f"checkpoint step {ITERS}: file {metadata} fails its sha256 check" in out
    assert records(run_dir) == before


def deleted_metadata_falls_back_and_a_torn_metrics_line_does_not_block_the_resume(reference, kilocard_run, run_dir):
    """On a finished run with checkpoint.fallback_to_previous=true (the run of the test above, which needs
    one: a run of its own would train the same 24 steps again), the newest step's ``.metadata`` deleted and
    the last line of metrics.jsonl torn (a rank killed mid-write): the resume loads the previous committed
    step, drops the torn line and the records past that step, and ends DONE with the uninterrupted loss curve."""
    assert ck.latest_committed(run_dir / "checkpoints") == ITERS and losses(run_dir) == reference[1]
    ckpts = run_dir / "checkpoints"
    (ck.step_dir(ckpts, ITERS) / ".metadata").unlink()
    metrics = run_dir / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes()[:-40])

    code, out, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    assert f"resumed from {ck.step_dir(ckpts, ITERS - EVERY)} (step {ITERS - EVERY}," in train_log(run_dir)
    assert (  # the fall back is said in the run's log, not silent
        f"checkpoint.fallback_to_previous: using step {ITERS - EVERY} instead of {ITERS}" in train_log(run_dir)
    )
    assert losses(run_dir) == reference[1]


HANG_S = 20
"""trainer.hang_timeout_s of the hung-rank run."""


def _hung_rank_run(runner: KilocardRun) -> tuple[int, str, Path, float]:
    """The run of ``test_hung_rank_is_detected_within_hang_timeout``: SIGSTOP of rank 1 after the first
    committed step; (code, output, run dir, seconds from the SIGSTOP to the end). The stopped rank is
    killed whatever happens."""
    stopped = []

    def freeze(proc, run_dir, step):
        if step <= EVERY:  # the first save is committed before step EVERY + 1 is reported
            return False
        p = rank_process(proc.pid, 1)
        p.suspend()
        stopped.append(p)
        return True

    try:
        return run_until(runner, [*TINY, f"trainer.hang_timeout_s={HANG_S}"], freeze)
    finally:
        for p in stopped:
            if p.is_running():
                p.kill()


@pytest.fixture(scope="module", autouse=True)
def hung_rank_run(tmp_path_factory) -> Iterator[Future]:
    """The hung-rank run, started in a thread as this module starts (future of ``_hung_rank_run``): it
    mostly waits (``HANG_S`` for the watchdog, then the launcher's stop wait for a rank that cannot stop),
    and that wait overlaps the other tests' runs instead of adding to them."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(_hung_rank_run, KilocardRun(tmp_path_factory.mktemp("hung")))


def test_hung_rank_is_detected_within_hang_timeout(hung_rank_run):
    """SIGSTOP of rank 1 (a hung rank): the other rank's watchdog sees no progress for
    trainer.hang_timeout_s and the run ends FAULT with a message saying so, well before the
    launcher's own grace period."""
    code, out, run_dir, took = hung_rank_run.result()
    assert code == exitcodes.FAULT, out[-3000:]
    assert took < HANG_S + FAIL_FAST_S, f"a hung rank went undetected for {took:.0f}s"
    assert f"(trainer.hang_timeout_s={HANG_S:g}); a rank hung or died; exiting FAULT" in out + train_log(run_dir)
    ck.verify_step(ck.step_dir(run_dir / "checkpoints", tracker(run_dir)))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 64 MiB tmpfs (root only): a filesystem that really runs out of space."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_stops_the_run_and_keeps_the_committed_step(small_tmpfs, kilocard_run):
    """checkpoint.save on a 64 MiB tmpfs; once step 2 is committed the filesystem is filled to the
    last byte (simulated disk full: a real ENOSPC, not a permission bit, which root ignores). The
    next save fails: the run stops with CRASH (1, a person must look), saying the disk is full and
    which committed step is intact, and that step stays committed and intact."""
    ckpts = small_tmpfs / "ckpt"
    filled = []

    def fill_after_first_commit(proc, run_dir, step):
        t = ckpts / ck.TRACKER
        if not t.exists():
            return False
        filled.append(int(t.read_text()))
        with open(small_tmpfs / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        return True

    code, out, run_dir, took = run_until(kilocard_run, [*TINY, f"checkpoint.save={ckpts}"], fill_after_first_commit)
    assert code == exitcodes.CRASH, out[-3000:]
    assert took < FAIL_FAST_S
    assert re.search(
        r"saving step \d+ under \S+ failed: the disk is full \(\d+ bytes free\); the last committed "
        r"step \d+ is intact",
        out + train_log(run_dir),
    ), out[-3000:]
    committed = int((ckpts / ck.TRACKER).read_text())
    assert committed == filled[0] or committed < ITERS
    ck.verify_step(ck.step_dir(ckpts, committed))
    assert ck.committed_steps(ckpts)[0] == committed


def test_non_finite_loss_crashes_and_is_never_committed(kilocard_run):
    """fp16 with the highest learning rate the domain table allows (10, no warm-up): the dynamic loss
    scale skips the first steps (their gradients overflow), then the first real update makes the next
    forward pass overflow fp16 and its loss NaN. Every step is a save step (checkpoint.save_interval=1):
    the step before is committed and intact, the NaN step is not (the loss of a step is read back and
    checked before that step is saved, even though the loop reads losses one step late). The run exits
    CRASH (1) naming the step and the fix (no traceback), and its metrics hold only finite losses."""
    code, out, run_dir = kilocard_run(
        "--nproc",
        "2",
        "recipe=tiny_gpt",
        "precision=fp16",
        "trainer.train_iters=40",
        "checkpoint.save_interval=1",
        "checkpoint.keep_last=2",
        "trainer.tensorboard=false",
        "optim.lr=10",
        "optim.min_lr=0",
        "optim.lr_warmup_iters=0",
    )
    assert code == exitcodes.CRASH, out[-3000:]
    text = out + train_log(run_dir)
    bad = re.search(r"error: step (\d+): loss is nan; lower optim\.lr or check the data", text)
    assert bad is not None, text[-3000:]
    step = int(bad.group(1))
    assert 1 < step < 40
    assert re.search(r"^exit +1 CRASH$", out, re.M) and re.search(rf"^last committed step +{step - 1}$", out, re.M)
    assert "kilocard/train/trainer.py" not in train_log(run_dir)  # no rank traceback (torchrun prints its own)
    ckpts = run_dir / "checkpoints"
    assert tracker(run_dir) == step - 1
    assert ck.committed_steps(ckpts)[0] == step - 1 and not ck.step_dir(ckpts, step).exists()
    ck.verify_step(ck.step_dir(ckpts, step - 1))
    curve = losses(run_dir)
    assert [s for s, _ in curve] == list(range(1, step)) and all(math.isfinite(v) for _, v in curve)
