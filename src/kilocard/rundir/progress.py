"""Human-readable progress: the live line per step and the end-of-run summary table."""

from __future__ import annotations

import re
import shlex
import statistics
from pathlib import Path
from typing import Any

from kilocard import exitcodes
from kilocard.base.safe_read import is_regular, read_text
from kilocard.rundir.metrics import FLOPS_CONVENTION
from kilocard.rundir.names import TRACKER


def resume_command(run_dir: Path) -> str:
    """The command that continues a local run from its last committed step: ``kilocard run --resume RUN_DIR``."""
    return f"kilocard run --resume {shlex.quote(str(run_dir))}"


RESUMABLE = (exitcodes.RETRY, exitcodes.FAULT)
"""Exit codes after which the summary says how to continue (a crash or a bad config needs a look first)."""


def _eta(r: dict[str, Any]) -> str:
    left = max(0, int(r.get("train_iters", r["step"])) - int(r["step"])) * float(r["step_time_s"])
    m, s = divmod(int(round(left)), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}"


def _mfu(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.2f}%"


def _tokens(n: float) -> str:
    """``40960`` -> ``41k``, ``1.2e9`` -> ``1.2G``: a count of tokens, three figures."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def _grad_norm(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def progress_line(r: dict[str, Any]) -> str:
    """Step ``r``'s line, what rank 0 prints every ``trainer.log_interval`` steps (Megatron-LM's
    ``iteration N | ...``): ``step 5/20 | loss 4.1234 | grad norm 1.234 | lr 3.000e-04 | samples 40 | tokens 10.2k |
    0.210 s/step | 1.2e+03 tok/s/gpu | 0.004 TFLOP/s/gpu | MFU 7.75% | ETA 0:00:03`` (``is_progress`` knows it)."""
    samples = r.get("consumed_samples")
    consumed = "" if samples is None else f"samples {samples} | "
    tokens = r.get("consumed_tokens")
    consumed += "" if tokens is None else f"tokens {_tokens(tokens)} | "
    gn = _grad_norm(r.get("grad_norm"))
    return (
        f"step {r['step']}/{r.get('train_iters', '?')} | loss {r['loss']:.4f} | grad norm {gn}"
        f" | lr {r.get('lr', float('nan')):.3e} | {consumed}{r['step_time_s']:.3f} s/step | "
        f"{r['tokens_per_s_per_gpu']:.3g} tok/s/gpu | {r['tflops_per_gpu']:.3g} TFLOP/s/gpu | "
        f"MFU {_mfu(r.get('mfu'))} | ETA {_eta(r)}"
    )


def eval_line(r: dict[str, Any]) -> str:
    """``step 10 | valid loss 4.1234 (10 rounds, 0.52 s)``: one evaluation record (``is_progress`` knows it)."""
    rounds = r.get("eval_iters", "?")
    return f"step {r['step']} | {r['split']} loss {r['loss']:.4f} ({rounds} rounds, {r['eval_time_s']:.2f} s)"


STEP_LINE = re.compile(r"^step \d+/\S+ \| loss ")
"""A step line (``progress_line``) as rank 0 prints it."""
EVAL_LINE = re.compile(r"^step \d+ \| \w+ loss ")
"""An evaluation line (``eval_line``) as rank 0 prints it."""


def is_progress(line: str) -> bool:
    """Whether ``line`` (without its rank label) is a step or an evaluation line."""
    return bool(STEP_LINE.match(line) or EVAL_LINE.match(line))


def log_due(step: int, train_iters: int, log_interval: int) -> bool:
    """Whether step ``step`` gets a line: every ``trainer.log_interval`` steps and the last one."""
    return step % log_interval == 0 or step >= train_iters


def _eval_rows(evals: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The summary's last validation and test losses."""
    rows = []
    for split, name in (("valid", "validation loss (last)"), ("test", "test loss")):
        mine = [r for r in evals if r["split"] == split]
        if mine:
            rows.append((name, f"{mine[-1]['loss']:.4f} at step {mine[-1]['step']}"))
    return rows


def summary_table(
    records: list[dict[str, Any]],
    run_dir: Path,
    code: int,
    *,
    ckpt_root: Path,
    first_new_step: int = 0,
    evals: list[dict[str, Any]] | None = None,
) -> str:
    """The table ``kilocard run`` ends with (medians over this launch's steps, first step excluded; the last
    validation and test losses of ``evals``, the run's evaluation records); ``ckpt_root``: the run's
    checkpoint directory (``kilocard.rundir.checkpoint.checkpoint_root``)."""
    tracker = ckpt_root / TRACKER
    committed = read_text(tracker, limit=4096, errors="replace").strip() if is_regular(tracker) else None
    rows = [
        ("run dir", str(run_dir)),
        ("exit", f"{code} {exitcodes.describe(code)}".strip()),
        ("last committed step", committed if committed else "none"),
    ]
    new = [r for r in records if r["step"] > first_new_step] or records
    if new:
        steady = new[1:] or new
        med = lambda k: statistics.median(r[k] for r in steady)  # noqa: E731
        mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
        rows += [
            ("steps", f"{new[0]['step']}..{new[-1]['step']} of {new[-1].get('train_iters', '?')}"),
            ("loss first -> last", f"{new[0]['loss']:.4f} -> {new[-1]['loss']:.4f}"),
            ("step time (median)", f"{med('step_time_s'):.3f} s"),
            ("tokens/s per GPU (median)", f"{med('tokens_per_s_per_gpu'):.4g}"),
            ("TFLOP/s per GPU (median)", f"{med('tflops_per_gpu'):.4g} ({FLOPS_CONVENTION} FLOPs)"),
            ("MFU (median)", f"{_mfu(statistics.median(mfus)) if mfus else 'n/a'} of {new[-1].get('mfu_peak', '?')}"),
            ("peak memory (rank 0)", f"{max(r['peak_mem_bytes'] for r in new) / 2**20:.0f} MiB"),
        ]
    rows += _eval_rows(evals or [])
    if code in RESUMABLE:
        rows.append(("continue with", resume_command(run_dir)))
    width = max(len(k) for k, _ in rows)
    lines = ["", "summary", "-" * (width + 40)] + [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join(lines)
