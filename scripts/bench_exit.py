#!/usr/bin/env python3
"""Benchmark the end of a process that imported torch and Megatron-Core: ``sys.exit`` (the interpreter's
teardown) against ``kilocard.base.quickexit.exit_now``; prints the median CPU time of each and their ratio.

    .venv/bin/python scripts/bench_exit.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

BODY = "import warnings; warnings.simplefilter('ignore'); import torch, megatron.core\n"
ENDS = {"sys.exit": "import sys; sys.exit(0)", "exit_now": "from kilocard.base.quickexit import exit_now; exit_now(0)"}


def cpu_of(code: str) -> float:
    """CPU seconds (user + system) of one ``python -c code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, env={"OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def positive(text: str) -> int:
    """``--repeat``: a whole number from 1 to 100."""
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number from 1 to 100")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=positive, default=5, help="runs of each end, interleaved (1 to 100)")
    args = ap.parse_args(argv)
    medians = {}
    for _ in range(args.repeat):  # interleaved, so a busy moment of the machine hits both alike
        for name, end in ENDS.items():
            medians.setdefault(name, []).append(cpu_of(BODY + end))
    for name, times in medians.items():
        print(f"{name:9s} median {statistics.median(times):.2f} CPU-s over {args.repeat} runs")
    saved = statistics.median(medians["sys.exit"]) - statistics.median(medians["exit_now"])
    ratio = statistics.median(medians["exit_now"]) / statistics.median(medians["sys.exit"])
    print(f"exit_now saves {saved:.2f} CPU-s per process (exit_now / sys.exit: {ratio:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
