"""kilocard's preflight inside a Slurm job: one task per node, before any rank starts.

It records what actually runs on the node (host, Python, torch, CUDA, NCCL, megatron-core,
Transformer Engine, kilocard, GPU model and count) into
``<run_dir>/provenance/job-<jobid>-<restart>-<node>.json`` and ends the job in seconds, with exit
code 2 (BAD_CONFIG: the batch script writes no retry) and a ``FAILED`` marker naming the node and
the reason, when the node cannot run the job: an import fails, the visible GPU count is not the one
the job asked for, or megatron-core is outside the supported range. Without it such a job fails
only after every rank has waited for an NCCL timeout, and a requeue would repeat that.

Standard library only at import time: it must be able to say that ``kilocard`` itself (or torch)
does not import. The batch script copies it into the run directory and runs it with the job's
``python``.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import platform
import socket
import sys
import time
import warnings
from importlib import metadata
from pathlib import Path

BAD_CONFIG = 2
#: (module, distribution): what every rank imports.
REQUIRED = (("torch", "torch"), ("megatron.core", "megatron-core"), ("kilocard", "kilocard"))
#: NVRx's ft_launcher module (kilocard.launch.ftlaunch.MODULE; this script imports only the standard library).
NVRX_LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"


def release(version: str) -> tuple[int, ...]:
    """``"0.19.2+abc"`` -> ``(0, 19, 2)``."""
    core = version.split("+", 1)[0]
    return tuple(int(p) for p in core.split(".") if p.isdigit())


def dist_version(dist: str, module: object) -> str | None:
    """The distribution's version, else the module's ``__version__``."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return getattr(module, "__version__", None)


def probe_imports(record: dict, problems: list[str]) -> dict[str, object]:
    """Import every required module, recording versions; a failure is a problem naming the module."""
    modules: dict[str, object] = {}
    warnings.simplefilter("ignore")  # import-time notices (no TE/Apex on CPU) would bury the verdict line
    for mod, dist in REQUIRED:
        try:
            modules[mod] = importlib.import_module(mod)
        except Exception as exc:  # noqa: BLE001 - any import failure is the finding itself
            problems.append(f"import {mod} failed: {type(exc).__name__}: {exc}")
            record[dist] = None
            continue
        record[dist] = dist_version(dist, modules[mod])
    if "kilocard" in modules:  # which copy runs: the run's snapshot (code/site), an image, a venv
        record["kilocard_path"] = str(Path(modules["kilocard"].__file__).resolve().parent)
    try:
        te = importlib.import_module("transformer_engine")
        record["transformer-engine"] = dist_version("transformer-engine", te)
    except Exception:  # noqa: BLE001 - optional: absent TE is recorded as null
        record["transformer-engine"] = None
    return modules


def probe_devices(torch: object, record: dict) -> int:
    """CUDA, NCCL, GPU model and count (0 without CUDA)."""
    cuda = getattr(torch, "cuda", None)
    record["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    count = cuda.device_count() if cuda is not None and cuda.is_available() else 0
    record["gpu_count"] = count
    record["gpu_model"] = cuda.get_device_name(0) if count else None
    try:
        nccl = cuda.nccl.version() if count else None
        record["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
    except Exception:  # noqa: BLE001 - NCCL missing on a CUDA build is recorded as null
        record["nccl"] = None
    return count


def check(args: argparse.Namespace) -> tuple[dict, list[str]]:
    """Probe this node; return its record and the problems found (empty: the node can run the job)."""
    record: dict = {
        "hostname": socket.gethostname(),
        # Slurm's name of the node (unique in the job even where hosts share a hostname)
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
    }
    problems: list[str] = []
    modules = probe_imports(record, problems)
    if "torch" in modules:
        count = probe_devices(modules["torch"], record)
        if count != args.gpus_per_node:
            problems.append(f"{count} GPU(s) visible, the job asked for {args.gpus_per_node} per node")
    mcore = record.get("megatron-core")
    if mcore and not (release(args.mcore_min) <= release(mcore) < release(args.mcore_below)):
        problems.append(f"megatron-core {mcore} is outside the supported range >={args.mcore_min},<{args.mcore_below}")
    if args.need_te and record.get("transformer-engine") is None:
        problems.append("transformer_engine is not importable and the config asks for FP8/TE")
    if args.need_nvrx:
        probe_nvrx(record, problems)
    return record, problems


def probe_nvrx(record: dict, problems: list[str]) -> None:
    """In-job restarts start NVRx's ft_launcher on every node: its launcher module must import."""
    try:
        importlib.import_module(NVRX_LAUNCHER)
        record["nvidia-resiliency-ext"] = dist_version("nvidia-resiliency-ext", None)
    except Exception as exc:  # noqa: BLE001 - any import failure is the finding itself
        record["nvidia-resiliency-ext"] = None
        problems.append(
            f"import {NVRX_LAUNCHER} failed ({type(exc).__name__}: {exc}) and launcher.max_restarts > 0 needs "
            "it (pip install 'kilocard[resiliency]' in the image, or launcher.max_restarts=0)"
        )


def write(run_dir: Path, record: dict, problems: list[str]) -> Path:
    """Write the node's record (with its verdict) under ``provenance/``; the FAILED marker on failure."""
    record["problems"] = problems
    out = run_dir / "provenance"
    out.mkdir(parents=True, exist_ok=True)
    job = record["slurm_job_id"] or "local"
    path = out / f"job-{job}-{record['restart']}-{record['node']}.json"
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    if problems:
        text = f"preflight failed on node {record['node']} (job {job}): " + "; ".join(problems)
        (run_dir / "FAILED").write_text(text + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """Probe, record, and exit 0 (node ready) or 2 (BAD_CONFIG, one line on stderr)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--gpus-per-node", type=int, required=True)
    ap.add_argument("--mcore-min", required=True, help="lowest supported megatron-core, e.g. 0.16.1")
    ap.add_argument("--mcore-below", required=True, help="first unsupported megatron-core, e.g. 0.20")
    ap.add_argument("--need-te", action="store_true", help="Transformer Engine must import (FP8)")
    ap.add_argument("--need-nvrx", action="store_true", help="NVRx's ft_launcher must import (in-job restarts)")
    args = ap.parse_args(argv)
    record, problems = check(args)
    path = write(args.run_dir, record, problems)
    if problems:
        print(f"kilocard preflight: {record['node']}: " + "; ".join(problems), file=sys.stderr)
        return BAD_CONFIG
    print(f"kilocard preflight: {record['node']} ready ({path.name})", file=sys.stderr)
    return 0


def exit_now(code: int) -> None:
    """End with ``code`` without the interpreter's teardown of the torch and Megatron-Core probed above (about
    1 CPU-s per node and job start; ``kilocard.base.quickexit``, which this script must not import)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
