#!/usr/bin/env python
"""Benchmark: validate the ``moe_10t`` recipe (~10T params, 62,500 nodes x 8 GPUs).

Prints the median of 5 runs of ``validate(cfg)`` alone and of compose + ``validate`` together.
Usage: .venv/bin/python scripts/bench_validate.py [recipe] [override ...]
"""

from __future__ import annotations

import statistics
import sys
import time

from kilocard.config.compose import compose, to_run_config
from kilocard.perf.params import count_parameters
from kilocard.validate import validate

RUNS = 5


def main(argv) -> int:
    recipe = argv[0] if argv else "moe_10t"
    overrides = [f"recipe={recipe}", *argv[1:]]
    rc = to_run_config(compose(overrides))
    params = count_parameters(rc.model)
    report = validate(rc)  # warm-up (imports)
    lay = report.layout
    print(
        f"{recipe}: {params.total / 1e12:.2f}T params ({params.active / 1e9:.0f}B active), world {lay.world_size} "
        f"= {lay.nodes} x {lay.gpus_per_node}; {len(report.errors)} error(s), {len(report.issues)} issue(s)"
    )
    validate_s, total_s = [], []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        cfg = to_run_config(compose(overrides))
        t1 = time.perf_counter()
        validate(cfg)
        t2 = time.perf_counter()
        validate_s.append(t2 - t1)
        total_s.append(t2 - t0)
    print(f"validate only:        median {statistics.median(validate_s) * 1e3:8.2f} ms over {RUNS} runs")
    print(f"compose + validate:   median {statistics.median(total_s) * 1e3:8.2f} ms over {RUNS} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
