"""What a dead or hung rank costs on the local Slurm cluster: in-job restart vs requeue.

For each fault (SIGKILL or SIGSTOP of rank 3, on the second node, once step 10 is recorded) and each
mode (``launcher.max_restarts=2``: NVRx ft_launcher restarts the ranks inside the allocation;
``launcher.max_restarts=0``: the batch script requeues the job) it submits tiny_gpt on 2 nodes x 2
CPU ranks (60 steps, a committed save every 5, ``trainer.hang_timeout_s=20``), injects the fault,
waits for the job to end (at most ``--cap`` seconds, then cancels it), and prints, from the run's own
records: seconds from the fault to the first step computed after it, steps computed again, and the
job's requeues. Needs a running local cluster (``scripts/slurm-up.sh``); runs one job at a time.

    python scripts/bench_faults_slurm.py [--root DIR] [--cap 240] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from slurm_runs import TERMINAL, cancel, inject, job, recovery, submit, wait_until  # noqa: E402

MODES = {"in-job (max_restarts=2)": ["launcher.max_restarts=2"], "requeue (max_restarts=0)": []}
FAULTS = {"kill": "SIGKILL", "stop": "SIGSTOP (hang)"}


def measure(root: Path, fault: str, mode: str, cap_s: float) -> dict:
    """One run: submit, inject ``fault`` into rank 3, wait for the end (or ``cap_s``), read the records."""
    run = submit(root, f"launcher.job_name=bench-{fault}-{'injob' if MODES[mode] else 'requeue'}", *MODES[mode])
    try:
        at = inject(run, rank=3, kind=fault)
        try:
            final = wait_until(lambda: (j := job(run.job_id)).get("JobState") in TERMINAL and j, cap_s, "the job", 1)
        except AssertionError:
            final = {"JobState": f"still {job(run.job_id).get('JobState')} after {cap_s:.0f} s (cancelled)"}
    finally:
        cancel(run)
    return {"fault": FAULTS[fault], "mode": mode, **recovery(run, at), "requeues": final.get("Restarts"),
            "state": final["JobState"], "run_dir": str(run.run_dir)}  # fmt: skip


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    head = "| fault | mode | seconds to first resumed step | steps recomputed | requeues | job state |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        secs = "not resumed" if r["seconds_to_resume"] is None else f"{r['seconds_to_resume']:.1f}"
        steps = "-" if r["steps_recomputed"] is None else r["steps_recomputed"]
        lines.append(f"| {r['fault']} | {r['mode']} | {secs} | {steps} | {r['requeues']} | {r['state']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every fault x mode once and print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=None, help="where the run directories go (default: a temp dir)")
    ap.add_argument("--cap", type=float, default=240.0, help="seconds a job may take after the fault")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    root = args.root or Path(tempfile.mkdtemp(prefix="bench-faults-"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = [measure(root, fault, mode, args.cap) for fault in FAULTS for mode in MODES]
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
