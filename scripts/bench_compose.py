"""Benchmark: how long it takes to compose and print one recipe, in-process and through the CLI.

Prints medians of 5 runs:
  * in-process: ``compose(["recipe=NAME"])`` + ``OmegaConf.to_yaml`` (what ``kilocard show`` does
    after start-up; wall time and this process's CPU time, which a busy machine does not inflate),
    and compose + ``to_run_config`` (what every verb does);
  * console: wall time of a real ``kilocard show recipe=NAME`` subprocess (interpreter start-up and
    imports included);
  * catalog: ``kilocard recipes`` with an empty cache (every recipe composed) and with a warm one.

Usage: .venv/bin/python scripts/bench_compose.py [--recipe llama3_70b] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def report(label: str, samples: list[float]) -> None:
    print(
        f"{label:<52} median {statistics.median(samples) * 1e3:8.1f} ms   (min {min(samples) * 1e3:.1f}, "
        f"n={len(samples)})"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="llama3_70b")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    from omegaconf import OmegaConf

    from kilocard.config.compose import compose, to_run_config

    overrides = [f"recipe={args.recipe}"]
    compose(overrides)  # warm imports and caches once, as a long-lived process would be
    report(
        f"in-process compose + to_yaml ({args.recipe})",
        timed(lambda: OmegaConf.to_yaml(compose(overrides)), args.repeat),
    )
    report(
        "  same, CPU time of this process (load-independent)",
        timed(lambda: OmegaConf.to_yaml(compose(overrides)), args.repeat, clock=time.process_time),
    )
    report("in-process compose + to_run_config", timed(lambda: to_run_config(compose(overrides)), args.repeat))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    show = [sys.executable, "-m", "kilocard.cli", "show", *overrides]
    report(
        "console `kilocard show` (subprocess wall)",
        timed(lambda: subprocess.run(show, env=env, check=True, capture_output=True), args.repeat),
    )

    with tempfile.TemporaryDirectory() as cache:
        env_cache = {**env, "KILOCARD_CACHE_DIR": cache}
        table = [sys.executable, "-m", "kilocard.cli", "recipes"]
        cold = timed(lambda: subprocess.run(table, env=env_cache, check=True, capture_output=True), 1)
        report("console `kilocard recipes`, empty cache", cold)
        report(
            "console `kilocard recipes`, warm cache",
            timed(lambda: subprocess.run(table, env=env_cache, check=True, capture_output=True), args.repeat),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
