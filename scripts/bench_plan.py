#!/usr/bin/env python3
"""Benchmark `kilocard plan` for Llama 3.1 405B on 16,384 H100s; prints the median wall time.

Target: under 10 s on a 2-core machine. Composition (Hydra) is timed apart from the search.

    .venv/bin/python scripts/bench_plan.py [--repeat 5] [overrides ...]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kilocard.config.compose import compose, to_run_config
from kilocard.planner.search import plan

DEFAULT = ["recipe=llama31_405b", "cluster.nodes=2048", "trainer.global_batch_size=2048"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("overrides", nargs="*", default=DEFAULT)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cfg = to_run_config(compose(args.overrides))
    compose_s = time.perf_counter() - t0
    times, result = [], None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        result = plan(cfg, top=10)
        times.append(time.perf_counter() - t0)
    assert result is not None
    print(f"overrides: {' '.join(args.overrides)}")
    print(
        f"compose: {compose_s:.2f} s; plan: {result.candidates} candidates, {result.validated} validated, "
        f"{len(result.top)} layouts"
    )
    print(
        f"plan median {statistics.median(times):.2f} s over {args.repeat} runs (min {min(times):.2f}, max "
        f"{max(times):.2f})"
    )
    print(f"plan + compose median {statistics.median(times) + compose_s:.2f} s (target < 10 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
