"""Stop with SIGUSR1 reaching ONE rank, resume, and get the uninterrupted run's losses bit for bit.

Two CPU ranks (DP2, distributed optimizer), deterministic mode, the shipped tiny corpus: a straight 20-step run
versus the same run stopped by USR1 (sent to rank 1 only) after a few steps, committed, exited RETRY (75) and
continued with ``kilocard run --resume``.
"""

from __future__ import annotations

import json
import signal

import psutil
import pytest

from kilocard import exitcodes

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

ARGS = [
    "recipe=tiny_gpt",
    "data=tiny_corpus",
    "parallel.use_distributed_optimizer=true",
    "trainer.train_iters=20",
    "trainer.tensorboard=true",
    "--nproc",
    "2",
]
METRIC_KEYS = {
    "step",
    "loss",
    "step_time_s",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "lr",
    "grad_norm",
    "peak_mem_bytes",
}


def records(run_dir):
    """metrics.jsonl as a list of dicts."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rank_process(launcher: psutil.Process, rank: int) -> psutil.Process:
    """The ``python -m kilocard.train`` process of ``rank`` under the launcher."""
    for child in launcher.children(recursive=True):
        try:
            if "kilocard.train" in " ".join(child.cmdline()) and child.environ().get("RANK") == str(rank):
                return child
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"rank {rank} process not found")


def stop_one_rank_after(kilocard_run, step: int):
    """Start a run, send SIGUSR1 to rank 1 once ``step`` is reported; return (code, output, run dir)."""
    proc = kilocard_run.start(*ARGS)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= step:
            rank_process(psutil.Process(proc.pid), 1).send_signal(signal.SIGUSR1)
            break
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    return proc.returncode, out, kilocard_run.run_dir_of(out)


def test_usr1_on_one_rank_saves_same_step_and_resume_is_bit_exact(kilocard_run):
    code, out, straight = kilocard_run(*ARGS)
    assert code == exitcodes.DONE, out[-3000:]
    assert out.splitlines()[0].startswith("run dir: ")
    assert "summary" in out and "TFLOP/s per GPU" in out and "MFU" in out
    ref = records(straight)
    assert [r["step"] for r in ref] == list(range(1, 21)) and METRIC_KEYS <= set(ref[0])
    assert list((straight / "tensorboard").glob("events.out.tfevents.*"))

    code, out, run_dir = stop_one_rank_after(kilocard_run, 1)
    assert code == exitcodes.RETRY, out[-3000:]
    stopped_at = int((run_dir / "checkpoints" / "latest_committed.txt").read_text())
    assert 1 <= stopped_at < 20
    log = (run_dir / "logs" / "train.log").read_text()
    assert f"committed step {stopped_at}; exiting RETRY" in log
    assert sorted(p.read_text().strip() for p in (run_dir / "logs" / "exit").glob("rank_*")) == ["75", "75"]

    code, out, _ = kilocard_run("--resume", str(run_dir))
    assert code == exitcodes.DONE, out[-3000:]
    assert "resumed from" in (run_dir / "logs" / "train.log").read_text()
    resumed = records(run_dir)
    assert [r["step"] for r in resumed] == list(range(1, 21))
    assert [r["loss"] for r in resumed] == [r["loss"] for r in ref]
    assert [r["grad_norm"] for r in resumed] == [r["grad_norm"] for r in ref]


def test_bf16_run_saves_and_a_load_continues_its_curve(kilocard_run):
    """bf16 on the local layer spec (CPU ranks): a step with optimizer state is saved, and a run loading
    step 3 continues the straight run's losses exactly (the spec's norms are cast with the rest of the
    model, so Megatron-Core's bf16 optimizer maps all of its parameters). fp16's save is covered by
    test_faults_train's non-finite-loss run."""
    args = ["recipe=tiny_gpt", "precision=bf16", "trainer.train_iters=6", "checkpoint.save_interval=3"]
    args += ["trainer.tensorboard=false", "--nproc", "2"]
    code, out, straight = kilocard_run(*args)
    assert code == exitcodes.DONE, out[-3000:]
    assert (straight / "checkpoints" / "latest_committed.txt").read_text().strip() == "6"

    code, out, loaded = kilocard_run(*args, f"checkpoint.load={straight / 'checkpoints'}", "checkpoint.ckpt_step=3")
    assert code == exitcodes.DONE, out[-3000:]
    ref = {r["step"]: r["loss"] for r in records(straight)}
    assert {r["step"]: r["loss"] for r in records(loaded)} == {s: ref[s] for s in (4, 5, 6)}


def test_fp16_step_saved_while_the_loss_scale_skips_steps_continues_its_curve(kilocard_run):
    """fp16's dynamic loss scale skips the first steps (their gradients overflow) until it has come down: a step
    saved among them holds no optimizer moments, and a run loading it continues the straight run's losses
    exactly, through the first real update (the loss scale and the still-fresh optimizer are the saved ones)."""
    args = ["recipe=tiny_gpt", "precision=fp16", "trainer.train_iters=20", "checkpoint.save_interval=10"]
    args += ["trainer.tensorboard=false", "--nproc", "2"]
    code, out, straight = kilocard_run(*args)
    assert code == exitcodes.DONE, out[-3000:]
    ref = records(straight)
    assert ref[9]["grad_norm"] is None and ref[-1]["grad_norm"] is not None  # step 10 skipped; a later one not

    code, out, loaded = kilocard_run(*args, f"checkpoint.load={straight / 'checkpoints'}", "checkpoint.ckpt_step=10")
    assert code == exitcodes.DONE, out[-3000:]
    got = records(loaded)
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in got] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in ref[10:]
    ]
