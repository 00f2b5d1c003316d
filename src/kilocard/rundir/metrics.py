"""Per-step metrics: throughput, TFLOP/s per GPU, MFU, memory; written to metrics.jsonl and TensorBoard.

metrics.jsonl holds two kinds of record: one per training step (``step``, ``loss``, ``step_time_s``, ...),
and one per evaluation (``trainer.eval_interval``): ``{"step", "split": "valid"|"test", "loss", "time",
"eval_time_s", "eval_iters"}``, written after the record of the step it evaluated. ``read_metrics``
returns the training records only (what progress, the summary, goodput and the launcher count as
steps), ``read_evals`` the evaluation records; TensorBoard and the trackers get ``train/<key>``,
``valid/<key>`` and ``test/<key>`` scalars.

FLOPs per step follow Megatron-LM's count (``kilocard.perf.flops``, convention ``megatron_current``).
MFU divides the achieved model FLOP/s per GPU by the dense peak of ``cluster.gpu`` in the dtype the
GEMMs run in (``kilocard.topology``); both names go into every record and the summary.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilocard.config.schema import RunConfig
from kilocard.perf.flops import CURRENT, flops_per_iteration
from kilocard.rundir.events import json_lines
from kilocard.rundir.names import METRICS_FILE
from kilocard.topology import compute_dtype, gpu_spec

FLOPS_CONVENTION = CURRENT
"""FLOPs convention of every TFLOP/s and MFU figure the trainer reports."""


NOT_SCALARS = frozenset({"step", "time", "split"})
"""Record keys that are no TensorBoard scalar: the step is the x axis, the unix time its wall time."""


@dataclass(frozen=True)
class Throughput:
    """Constants that turn a step time into throughput figures."""

    flops_per_step: float
    """Model FLOPs of one optimizer step (the global batch), FLOPS_CONVENTION."""
    tokens_per_step: int
    """Tokens of one global batch."""
    world_size: int
    """Ranks (GPUs) the step runs on."""
    peak_flops: float | None
    """Dense peak FLOP/s of one GPU in the run's compute dtype; ``None`` when the GPU is unknown."""
    peak_name: str
    """What the peak is, e.g. ``h100-sxm5-80gb bf16 dense 989.0 TFLOP/s``."""

    @classmethod
    def for_run(cls, run_cfg: RunConfig, world_size: int) -> Throughput:
        """Throughput constants of ``run_cfg`` on ``world_size`` ranks."""
        pr = run_cfg.precision
        dtype = compute_dtype(pr.bf16, pr.fp16, pr.fp8, pr.fp4)
        spec = gpu_spec(run_cfg.cluster.gpu)
        peak = spec.peak_flops.get(dtype) if spec else None
        name = (
            f"{run_cfg.cluster.gpu} {dtype} dense {peak / 1e12:.4g} TFLOP/s"
            if peak
            else f"{run_cfg.cluster.gpu} {dtype}: no peak in kilocard.topology (MFU not computed)"
        )
        t = run_cfg.trainer
        return cls(
            flops_per_step=flops_per_iteration(run_cfg, FLOPS_CONVENTION),
            tokens_per_step=t.global_batch_size * run_cfg.model.seq_length,
            world_size=world_size,
            peak_flops=peak,
            peak_name=name,
        )

    def figures(self, step_time_s: float) -> dict[str, float | None]:
        """tokens/s per GPU, TFLOP/s per GPU and MFU for one step of ``step_time_s``."""
        flops_per_gpu = self.flops_per_step / self.world_size / step_time_s
        return {
            "tokens_per_s_per_gpu": self.tokens_per_step / self.world_size / step_time_s,
            "tflops_per_gpu": flops_per_gpu / 1e12,
            "mfu": flops_per_gpu / self.peak_flops if self.peak_flops else None,
        }


def peak_memory_bytes() -> int:
    """CUDA max allocated bytes on GPU ranks; peak RSS of the process on CPU ranks."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.max_memory_allocated())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


class MetricsWriter:
    """metrics.jsonl (append, one line per step) plus TensorBoard scalars; used on one rank."""

    def __init__(self, run_dir: Path, tensorboard: bool, resume_step: int, trackers: Any = None) -> None:
        self.path = run_dir / METRICS_FILE
        self.superseded: dict[str, Any] | None = self._truncate_after(resume_step)
        """The newest record dropped on resume (a step trained again now), ``None`` when none was."""
        self._file = open(self.path, "a", buffering=1)
        self._trackers = trackers
        """``kilocard.train.tracking.Trackers`` (W&B, MLflow) or ``None``."""
        self._tb: Any = None
        if tensorboard:
            from tensorboard.compat.proto.summary_pb2 import Summary
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=resume_step + 1)
            self._summary = Summary

    def _truncate_after(self, step: int) -> dict[str, Any] | None:
        """Drop records of steps after the resumed one (they are trained again) and a torn last line;
        return the newest dropped record (``None`` when nothing was dropped)."""
        if not self.path.exists():
            return None
        records = json_lines(
            self.path, ("step",), skip_bad=warn_skipped, check=record_problem
        )  # a damaged line is dropped from the file here
        keep = [r for r in records if r.get("step", 0) <= step]
        dropped = [r for r in records if r.get("step", 0) > step and not is_eval(r)]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
        os.replace(tmp, self.path)
        return max(dropped, key=lambda r: r["step"]) if dropped else None

    def write(self, record: dict[str, Any]) -> None:
        """Append one record: a JSON line, and its numbers as ``<split>/<key>`` TensorBoard scalars.

        The scalars go out as ONE merged ``Summary`` event per step (what TensorBoard reads the same
        as one ``add_scalar`` per value): ten ``add_scalar`` calls cost about 1.2 ms a step, the
        merged event about 35 us (``scripts/bench_train_overhead.py`` counts every bit of it).
        """
        self._file.write(json.dumps(record) + "\n")
        if self._tb is None and self._trackers is None:
            return
        values = scalars(record)
        if self._tb is not None:
            Summary = self._summary
            summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
            self._tb.file_writer.add_summary(summary, record["step"])
        if self._trackers is not None:
            self._trackers.log(values, record["step"])

    def close(self) -> None:
        """Flush and close both outputs."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._trackers is not None:
            self._trackers.close()


def is_eval(record: dict[str, Any]) -> bool:
    """Whether ``record`` is an evaluation's (it names its ``split``), not a training step's."""
    return "split" in record


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A record's numbers as ``<split>/<key>`` scalars, ``train/<key>`` for a step (what TensorBoard and the
    trackers get)."""
    prefix = record.get("split", "train")
    return {
        f"{prefix}/{k}": float(v)
        for k, v in record.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in NOT_SCALARS
    }


_WARNED: set[str] = set()
"""Skipped lines already warned about in this process (the launcher reads the file twice a second)."""


def warn_skipped(message: str) -> None:
    """Say once on stderr that a damaged metrics line (named) is skipped."""
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"kilocard: warning: {message}; the line is skipped", file=sys.stderr, flush=True)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The training-step records of a run's metrics.jsonl (empty when absent); a torn last line is not a
    record, and a damaged line (NUL bytes from a power loss, not JSON) is skipped with a warning naming it."""
    return [r for r in _records(run_dir) if not is_eval(r)]


def read_evals(run_dir: Path, split: str | None = None) -> list[dict[str, Any]]:
    """The evaluation records of a run's metrics.jsonl, of ``split`` only when given."""
    return [r for r in _records(run_dir) if is_eval(r) and (split is None or r["split"] == split)]


NONNEGATIVE = (
    "time",
    "loss",
    "lr",
    "step_time_s",
    "consumed_samples",
    "consumed_tokens",
    "tokens_per_s_per_gpu",
    "tflops_per_gpu",
    "mfu",
    "peak_mem_bytes",
    "eval_time_s",
)
"""Record fields that are finite numbers >= 0 when present (``mfu`` may be null: a GPU without a known peak)."""
NULLABLE = ("mfu",)
"""Of ``NONNEGATIVE``, the fields a record may hold as null."""
SPLIT_NAMES = ("valid", "test")
"""``split`` of an evaluation record."""


def record_problem(record: dict[str, Any]) -> str | None:
    """What makes a metrics.jsonl record unusable (``None``: nothing): a step that is no step number, an unknown
    split, or a NaN, infinite or negative figure (``tflops_per_gpu: NaN``, ``step_time_s: -1``): every reader
    (progress, summary, report, goodput) would average it in silently."""
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"step {json.dumps(step)[:20]} is not a step number"
    if "split" in record and record["split"] not in SPLIT_NAMES:
        return f"split {json.dumps(record['split'])[:20]} is not one of {', '.join(SPLIT_NAMES)}"
    for key in NONNEGATIVE:
        if key not in record or (key in NULLABLE and record[key] is None):
            continue
        v = record[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{key} is not a number"
        if not math.isfinite(v) or v < 0:
            return f"{key} is {v}, not a finite number >= 0"
    return None


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return json_lines(Path(run_dir) / METRICS_FILE, ("step",), skip_bad=warn_skipped, check=record_problem)
