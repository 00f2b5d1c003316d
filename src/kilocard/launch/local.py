"""``kilocard run``: validate, write a run directory, train on local ranks with torchrun, summarise.

CPU ranks use gloo when there is no GPU. Every launch gets ``OMP_NUM_THREADS=1`` (unless set), a
per-run ``TMPDIR`` inside the run directory, a free rendezvous port and a hang guard: when the
metrics stop advancing for ``trainer.hang_timeout_s`` plus a grace period, the ranks are killed
and the run ends with FAULT. Rank output goes to ``<run_dir>/logs/train.log``; the terminal shows a
live progress line and, at the end, a summary table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from kilocard import exitcodes
from kilocard.train.dist_env import free_port
from kilocard.train.metrics import read_metrics
from kilocard.train.progress import progress_line, summary_table

EXIT_DIR_ENV = "KILOCARD_EXIT_DIR"
"""When set, every rank writes its exit code to ``$KILOCARD_EXIT_DIR/rank_<N>`` (torchrun hides them)."""

GRACE_S = 120.0
"""Extra seconds the launcher waits beyond trainer.hang_timeout_s before it kills silent ranks."""


def _validate(run_cfg) -> str | None:
    """Errors of ``kilocard.validate.validate`` as text, or ``None`` when valid (or no validator)."""
    try:
        from kilocard.validate import validate
    except ImportError:
        return None
    from kilocard.validate.paths import check_paths

    report = validate(run_cfg)
    report.issues.extend(check_paths(run_cfg))
    if report.valid:
        return None
    return "\n".join(f"  {i.field}: {i.message} (fix: {i.hint})" for i in report.errors)


def _new_run(overrides: Sequence[str], nproc: int | None) -> Path | None:
    from kilocard.config.compose import compose, to_run_config
    from kilocard.config.secrets import extract_secret_refs
    from kilocard.launch.rundir import RunDirError, create_run_dir

    overrides = list(overrides)
    if nproc is not None:
        if nproc < 1:
            print(f"kilocard run: error: --nproc {nproc}: must be >= 1", file=sys.stderr)
            return None
        overrides += [f"cluster.gpus_per_node={nproc}", "cluster.nodes=1", f"launcher.nproc={nproc}"]
    cfg = compose(overrides)
    extract_secret_refs(cfg)  # before anything is resolved or written
    errors = _validate(to_run_config(cfg))
    if errors:
        print(f"kilocard run: the config is invalid; nothing was started:\n{errors}", file=sys.stderr)
        return None
    try:
        return create_run_dir(cfg, overrides)
    except RunDirError as e:
        print(f"kilocard run: error: {e}", file=sys.stderr)
        return None


def _world_and_restarts(run_dir: Path) -> tuple[int, int] | None:
    """World size and ``launcher.max_restarts`` from the run's frozen config."""
    from kilocard.config.freeze import FrozenConfigError, load_verified

    try:
        rc, _ = load_verified(run_dir)
    except FrozenConfigError as e:
        print(f"kilocard run: error: {e}", file=sys.stderr)
        return None
    return rc.cluster.nodes * rc.cluster.gpus_per_node, rc.launcher.max_restarts


def run_command(overrides: Sequence[str], nproc: int | None = None, resume: str | None = None) -> int:
    """The ``kilocard run`` verb; returns an exit code of ``kilocard.exitcodes``."""
    if resume:
        if overrides:
            print("kilocard run: error: --resume takes no overrides (the run's frozen config is used)", file=sys.stderr)
            return exitcodes.BAD_CONFIG
        run_dir = Path(resume)
        if not run_dir.is_dir():
            print(f"kilocard run: error: --resume {resume}: no such run directory", file=sys.stderr)
            return exitcodes.BAD_CONFIG
    else:
        made = _new_run(overrides, nproc)
        if made is None:
            return exitcodes.BAD_CONFIG
        run_dir = made
    print(f"run dir: {run_dir}", flush=True)
    frozen = _world_and_restarts(run_dir)
    if frozen is None:
        return exitcodes.BAD_CONFIG
    world, max_restarts = frozen
    if resume and nproc is not None and nproc != world:
        print(
            f"kilocard run: error: --nproc {nproc} differs from the run's world size {world}; "
            f"resume onto another layout with a new run and checkpoint.load=<dir>",
            file=sys.stderr,
        )
        return exitcodes.BAD_CONFIG
    return launch(run_dir, world, max_restarts)


def torchrun_command(run_dir: Path, nproc: int, port: int, max_restarts: int = 0) -> list[str]:
    """The torchrun command line for ``nproc`` local ranks of ``run_dir``.

    With ``max_restarts`` > 0 torchrun restarts every rank after a failure; each restart resumes
    from the last committed step (``python -m kilocard.train`` always does).
    """
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        f"--max-restarts={max_restarts}",
        "-m",
        "kilocard.train",
        str(run_dir),
    ]


def rank_env(run_dir: Path) -> dict:
    """Environment of the ranks: one thread per rank, a per-run TMPDIR, exit codes written to the run dir."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    tmp = run_dir / "tmp"
    exit_dir = run_dir / "logs" / "exit"
    for d in (tmp, exit_dir):
        d.mkdir(parents=True, exist_ok=True)
    for f in exit_dir.glob("rank_*"):
        f.unlink()
    env["TMPDIR"] = str(tmp)
    env[EXIT_DIR_ENV] = str(exit_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(run_dir: Path, nproc: int, max_restarts: int = 0) -> int:
    """Start torchrun for ``run_dir``, show progress, guard against hangs, print the summary."""
    from kilocard.config.freeze import load_verified

    run_cfg, _ = load_verified(run_dir)
    env = rank_env(run_dir)
    log = run_dir / "logs" / "train.log"
    start_step = len(read_metrics(run_dir))
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            torchrun_command(run_dir, nproc, free_port(), max_restarts),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        code = _watch(proc, run_dir, run_cfg.trainer.hang_timeout_s + GRACE_S)
    code = _rank_exit_code(run_dir / "logs" / "exit", proc.returncode if code is None else code)
    records = read_metrics(run_dir)
    print(summary_table(records, run_dir, code, first_new_step=start_step), flush=True)
    if code not in (exitcodes.DONE, exitcodes.RETRY):
        _print_tail(log)
    return code


def _watch(proc: subprocess.Popen, run_dir: Path, silence_s: float) -> int | None:
    """Show a live line until the ranks exit; kill them and return FAULT if the metrics go silent."""
    tty = sys.stdout.isatty()
    seen, last_change = 0, time.monotonic()
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            records = read_metrics(run_dir)
            if len(records) != seen:
                seen, last_change = len(records), time.monotonic()
                print(("\r" if tty else "") + progress_line(records[-1]), end="" if tty else "\n", flush=True)
            elif time.monotonic() - last_change > silence_s:
                print(f"\nkilocard run: no progress for {silence_s:.0f}s; stopping the ranks (FAULT)", file=sys.stderr)
                _kill(proc)
                return exitcodes.FAULT
    except KeyboardInterrupt:
        print("\nkilocard run: interrupted; asking the ranks to save and stop", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    if tty and seen:
        print()
    return None


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _rank_exit_code(exit_dir: Path, launcher_code: int) -> int:
    """The run's exit code from the ranks' own codes (torchrun reports 1 for any failure)."""
    codes = []
    for f in exit_dir.glob("rank_*"):
        text = f.read_text().strip()
        if text.lstrip("-").isdigit():
            codes.append(int(text))
    if launcher_code == exitcodes.FAULT:
        return exitcodes.FAULT
    if not codes:
        return launcher_code if launcher_code == 0 else exitcodes.CRASH
    for severe in (exitcodes.BAD_CONFIG, exitcodes.BAD_CKPT, exitcodes.CRASH, exitcodes.FAULT, exitcodes.RETRY):
        if severe in codes:
            return severe
    if any(c != 0 for c in codes):
        return exitcodes.CRASH
    return exitcodes.DONE if launcher_code == 0 else exitcodes.FAULT


def _print_tail(log: Path, lines: int = 30) -> None:
    """The ranks' own error lines (once each), else the log's last lines (torchrun's report hides them)."""
    text = log.read_text(errors="replace").splitlines()
    errors = list(
        dict.fromkeys(
            l
            for l in text
            if "kilocard.train: error" in l or "kilocard.train: crashed" in l or "kilocard.train: no progress" in l
        )
    )
    keep = errors or [l for l in text if "UserWarning" not in l and "warnings.warn" not in l][-lines:]
    print(f"--- from {log} ---", file=sys.stderr)
    print("\n".join(keep), file=sys.stderr)
