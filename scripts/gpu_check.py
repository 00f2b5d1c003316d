#!/usr/bin/env python
"""One prepared training check on a machine with one GPU: a reduced-depth Llama-3-8B-shaped model in
bf16 and in FP8, through kilocard's own trainer (``python -m kilocard.train``).

    python scripts/gpu_check.py --out gpu_check.json [--layers 4] [--steps 12] [--seq 4096]
    python scripts/gpu_check.py --out smoke.json --cpu-smoke      # tiny shape on a CPU rank: a dry run

Writes, per precision: median TFLOP/s per GPU (Megatron-LM's FLOPs count, ``megatron_current``),
MFU against the named dense peak of the GPU (kilocard.topology), peak CUDA memory, median step
time, and the loss at the first and last step; or, for a precision that could not run, why
(``transformer_engine`` missing, no FP8 on this GPU, a crash with its last error line). Exit 0 when
every precision that could be attempted ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

GPU_NAMES = {
    "H200": "h200-sxm-141gb",
    "H100 PCIe": "h100-pcie-80gb",
    "H100": "h100-sxm5-80gb",
    "A100-SXM4-40GB": "a100-sxm4-40gb",
    "A100": "a100-sxm4-80gb",
    "B200": "b200-sxm-180gb",
    "GB200": "gb200-nvl72",
}
"""Substring of ``torch.cuda.get_device_name()`` -> kilocard.topology GPU table key (first match wins)."""


def gpu_key() -> str | None:
    """The topology key of GPU 0, or ``None`` when there is no CUDA device or it is not in the table."""
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    for sub, key in GPU_NAMES.items():
        if sub in name:
            return key
    return None


def overrides(args: argparse.Namespace, precision: str, gpu: str | None) -> list[str]:
    """The run's overrides for one precision."""
    if args.cpu_smoke:
        return ["recipe=tiny_gpt", f"trainer.train_iters={args.steps}", "trainer.tensorboard=false"]
    out = [
        "recipe=llama3_8b",
        f"model.num_layers={args.layers}",
        f"model.seq_length={args.seq}",
        f"model.max_position_embeddings={args.seq}",
        "trainer.micro_batch_size=1",
        f"trainer.global_batch_size={args.gbs}",
        f"trainer.train_iters={args.steps}",
        "trainer.tensorboard=false",
        "trainer.deterministic=false",
        "cluster.nodes=1",
        "cluster.gpus_per_node=1",
        "parallel.tensor_model_parallel_size=1",
        "parallel.pipeline_model_parallel_size=1",
        "parallel.context_parallel_size=1",
        "parallel.use_distributed_optimizer=true",
        "checkpoint.save_interval=0",
        "data=mock",
        "precision=bf16" if precision == "bf16" else "precision=fp8",
    ]
    if gpu:
        out.append(f"cluster.gpu={gpu}")
    return out


def why_not(precision: str, cpu_smoke: bool) -> str | None:
    """Why ``precision`` cannot be attempted here, or ``None``."""
    if cpu_smoke or precision == "bf16":
        return None
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return "transformer_engine is not installed (FP8 needs Transformer Engine)"
    import torch

    if torch.cuda.get_device_capability(0) < (8, 9):
        return f"{torch.cuda.get_device_name(0)} has no FP8 tensor cores (compute capability < 8.9)"
    return None


def run_one(args: argparse.Namespace, precision: str, gpu: str | None, work: Path) -> dict[str, object]:
    """Train one configuration; return its figures or the reason it failed."""
    from kilocard.config.compose import compose
    from kilocard.launch.rundir import create_run_dir
    from kilocard.rundir.metrics import read_metrics

    reason = why_not(precision, args.cpu_smoke)
    if reason:
        return {"precision": precision, "ran": False, "reason": reason}
    ov = overrides(args, precision, gpu)
    run_dir = create_run_dir(compose(ov), ov, root=work)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if args.cpu_smoke:
        env["KILOCARD_BACKEND"] = "cpu"
    proc = subprocess.run(
        [sys.executable, "-m", "kilocard.train", str(run_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=args.timeout,
    )
    recs = read_metrics(run_dir)
    if proc.returncode != 0 or not recs:
        last = [l for l in (proc.stderr + proc.stdout).splitlines() if l.strip()][-1:] or ["(no output)"]
        return {
            "precision": precision,
            "ran": False,
            "exit_code": proc.returncode,
            "reason": last[0],
            "run_dir": str(run_dir),
        }
    steady = recs[2:] or recs
    med = lambda k: statistics.median(r[k] for r in steady)  # noqa: E731
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    return {
        "precision": precision,
        "ran": True,
        "steps": len(recs),
        "median_step_time_s": med("step_time_s"),
        "tflops_per_gpu": med("tflops_per_gpu"),
        "mfu": statistics.median(mfus) if mfus else None,
        "mfu_peak": recs[-1].get("mfu_peak"),
        "flops_convention": "megatron_current",
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in recs),
        "tokens_per_s_per_gpu": med("tokens_per_s_per_gpu"),
        "loss_first": recs[0]["loss"],
        "loss_last": recs[-1]["loss"],
        "overrides": ov,
        "run_dir": str(run_dir),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results file (JSON); a text table is printed too")
    ap.add_argument("--layers", type=int, default=4, help="Llama-3-8B layers kept (of 32)")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--gbs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on one CPU rank (checks the script itself)")
    args = ap.parse_args()
    if args.cpu_smoke:
        args.steps = min(args.steps, 3)
    gpu = None if args.cpu_smoke else gpu_key()
    work = Path(tempfile.mkdtemp(prefix="kilocard-gpu-check-"))
    precisions = ["fp32"] if args.cpu_smoke else ["bf16", "fp8"]
    results = [run_one(args, p, gpu, work) for p in precisions]
    report = {"gpu": gpu, "cpu_smoke": args.cpu_smoke, "results": results}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for r in results:
        if r["ran"]:
            mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            print(
                f"{r['precision']:5s} {r['tflops_per_gpu']:8.2f} TFLOP/s/GPU  MFU {mfu} of {r['mfu_peak']}  "
                f"peak mem {r['peak_mem_bytes'] / 2**30:.2f} GiB  step {r['median_step_time_s']:.3f} s  "
                f"loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}"
            )
        else:
            print(f"{r['precision']:5s} NOT RUN: {r['reason']}")
    print(f"results: {args.out}")
    return 0 if all(r["ran"] or "exit_code" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
