#!/usr/bin/env python3
"""Benchmark `kilocard baselines` (fit, leave-one-source-out cross-validation, series); prints the median.

Target: the whole command under 60 s on a 2-core machine (issue 16). Wall and CPU time are printed per
run: on a shared machine the wall time rises with the load, the CPU time much less.

    .venv/bin/python scripts/bench_baselines.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

from kilocard.cli import main as kilocard


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    walls, cpus = [], []
    for _ in range(args.repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = kilocard(["baselines", "--format", "json"])
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        if rc != 0:
            raise SystemExit(f"kilocard baselines exit {rc}")
    print(f"kilocard baselines x{args.repeat}: wall " + ", ".join(f"{t:.1f}" for t in walls) + " s")
    print(
        f"median wall {statistics.median(walls):.1f} s, median CPU {statistics.median(cpus):.1f} s (target: under 60 s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
