"""The step line rank 0 prints, what the local launcher picks out of train.log, and the summary's resume
command (no process, no torch)."""

from __future__ import annotations

from kilocard import exitcodes
from kilocard.launch.logs import rank0_progress
from kilocard.rundir.progress import eval_line, is_progress, log_due, progress_line, resume_command, summary_table

RECORD = {
    "step": 40,
    "train_iters": 400,
    "loss": 4.123456,
    "grad_norm": 1.23456,
    "lr": 0.0003,
    "consumed_samples": 320,
    "consumed_tokens": 320 * 2048,
    "step_time_s": 0.5,
    "tokens_per_s_per_gpu": 1234.5,
    "tflops_per_gpu": 412.3,
    "mfu": 0.4169,
    "peak_mem_bytes": 2**30,
    "mfu_peak": "h100-sxm5-80gb bf16 dense 989 TFLOP/s",
}


def test_the_step_line_carries_every_figure_of_the_step():
    assert progress_line(RECORD) == (
        "step 40/400 | loss 4.1235 | grad norm 1.235 | lr 3.000e-04 | samples 320 | tokens 655k | 0.500 s/step | "
        "1.23e+03 tok/s/gpu | 412 TFLOP/s/gpu | MFU 41.69% | ETA 0:03:00"
    )
    old = {k: v for k, v in RECORD.items() if k not in ("grad_norm", "consumed_tokens", "mfu")}  # a CPU rank, no peak
    assert progress_line(old).startswith("step 40/400 | loss 4.1235 | grad norm n/a | lr 3.000e-04 | samples 320 | 0.5")
    assert "MFU n/a" in progress_line(old)


def test_a_line_every_log_interval_and_at_the_last_step():
    assert [s for s in range(1, 26) if log_due(s, 25, 10)] == [10, 20, 25]
    assert [s for s in range(1, 4) if log_due(s, 3, 1)] == [1, 2, 3]


def test_the_launcher_shows_rank_0s_step_and_evaluation_lines_only():
    ev = eval_line({"step": 40, "split": "valid", "loss": 4.0, "eval_time_s": 0.5, "eval_iters": 2})
    assert is_progress(progress_line(RECORD)) and is_progress(ev) and not is_progress("step 4: committed")
    log = [
        "W1207 18:21:50.123000 4242 torch/distributed/run.py:792] step 1/3 | loss 1.0 (torchrun's own line)\n",
        f"[rank1]: {progress_line(RECORD)}\n",  # no rank but 0 prints one; a line of rank 1 is never shown
        "[rank0]: [    2.1s] kilocard.train: built model\n",
        f"[rank0]: {progress_line(RECORD)}\n",
        f"[rank0]: {ev}\n",
        f"[rank10]: {ev}\n",
    ]
    assert list(rank0_progress(log)) == [progress_line(RECORD), ev]


def test_a_retry_or_fault_summary_prints_the_resume_command(tmp_path):
    run_dir = tmp_path / "my run"
    assert resume_command(run_dir) == f"kilocard run --resume '{run_dir}'"
    for code in (exitcodes.RETRY, exitcodes.FAULT):
        table = summary_table([RECORD], run_dir, code, ckpt_root=tmp_path)
        assert table.splitlines()[-1].split(None, 2)[-1] == resume_command(run_dir)
    for code in (exitcodes.DONE, exitcodes.CRASH, exitcodes.BAD_CONFIG):
        assert "--resume" not in summary_table([RECORD], run_dir, code, ckpt_root=tmp_path)
