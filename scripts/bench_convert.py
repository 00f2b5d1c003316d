"""Benchmark: time and peak memory of ``kilocard convert`` in and out, for a 2-layer Llama.

Writes a random Hugging Face Llama directory (fp32, sharded safetensors, made from kilocard's own map:
no transformers needed), then runs ``kilocard convert hf-to-mcore`` and ``mcore-to-hf`` on it as
separate processes, as users run them. Prints each run's wall time, CPU time and peak RSS (the
child's ``ru_maxrss``), and the peak above a fixed cost: the same conversions of a tiny model of the
same recipe, whose tensors are negligible (interpreter, torch and Megatron-Core imports). The target:
under 10 s per conversion, and that increase under 2x the checkpoint size (one tensor at a time in
flight besides the model itself, never the whole checkpoint twice).

Usage: .venv/bin/python scripts/bench_convert.py [--hidden 1024] [--vocab 32000] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kilocard.config.schema import ModelConfig
from kilocard.convert import maps, st_io


def overrides(hidden: int, ffn: int, heads: int, groups: int, vocab: int, layers: int) -> list[str]:
    """The tiny_llama recipe reshaped to the benchmark model."""
    return [
        "recipe=tiny_llama",
        f"model.num_layers={layers}",
        f"model.hidden_size={hidden}",
        f"model.ffn_hidden_size={ffn}",
        f"model.num_attention_heads={heads}",
        f"model.num_query_groups={groups}",
        f"model.vocab_size={vocab}",
    ]


def write_hf(path: Path, m: ModelConfig) -> int:
    """A random fp32 Hugging Face Llama of model ``m`` under ``path``; returns its tensor bytes."""
    path.mkdir(parents=True)
    slots = {s.hf: s for s in maps.slots("llama", m)}
    gen = torch.Generator().manual_seed(0)
    st_io.write_sharded(
        path, list(slots), lambda n: torch.randn(slots[n].shape, generator=gen), lambda n: slots[n].shape, 4, 10**8
    )
    (path / st_io.CONFIG).write_text(json.dumps(maps.hf_config("llama", m, torch.float32)))
    return sum(4 * torch.Size(s.shape).numel() for s in slots.values())


def model_of(args: list[str]) -> ModelConfig:
    """The ModelConfig those overrides compose to."""
    from kilocard.config.compose import compose, to_run_config

    return to_run_config(compose(args)).model


def measured(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, peak RSS bytes) of ``kilocard ARGV`` in a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-m", "kilocard.cli", *argv], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"kilocard {' '.join(argv)} failed")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def convert_both(work: Path, name: str, args: list[str]) -> dict[str, tuple[float, float, int]]:
    """Import then export the model of ``args``; the measurements of each direction."""
    hf, ck, back = work / f"hf_{name}", work / f"ck_{name}", work / f"back_{name}"
    return {
        "hf-to-mcore": measured(["convert", "hf-to-mcore", str(hf), str(ck), *args]),
        "mcore-to-hf": measured(["convert", "mcore-to-hf", str(ck), str(back)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_convert_"))
    try:
        big = overrides(a.hidden, a.ffn, a.heads, a.groups, a.vocab, a.layers)
        tiny = overrides(64, 128, 4, 2, 258, a.layers)
        size = write_hf(work / "hf_big", model_of(big))
        write_hf(work / "hf_tiny", model_of(tiny))
        base = convert_both(work, "tiny", tiny)
        runs = convert_both(work, "big", big)
        print(f"model: {a.layers} layers, hidden {a.hidden}, vocab {a.vocab}; checkpoint {size / 1e6:.0f} MB (fp32)")
        print(f"{'direction':12} {'wall s':>7} {'cpu s':>6} {'peak RSS MB':>12} {'fixed MB':>9} {'above / ckpt':>13}")
        for d, (wall, cpu, rss) in runs.items():
            fixed = base[d][2]
            print(f"{d:12} {wall:7.1f} {cpu:6.1f} {rss / 1e6:12.0f} {fixed / 1e6:9.0f} {(rss - fixed) / size:12.2f}x")
        for d, (wall, cpu, rss) in base.items():
            print(f"{d:12} {wall:7.1f} {cpu:6.1f} {rss / 1e6:12.0f}   (the tiny 2-layer model: the fixed cost)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
