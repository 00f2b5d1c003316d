"""What a run directory says about its run: state, progress, speed and the command that continues it
(the verb is ``kilocard.commands.runs``).

Everything comes from the run directory alone: the frozen config (``train_iters``, the launcher, where
checkpoints go), ``metrics.jsonl`` (step, loss, measured MFU and step time), ``events.jsonl`` (launch
attempts and how each ended), the checkpoint tracker (the newest committed step), the lock holder
(a live ``kilocard run``), a Slurm run's ``DONE``/``FAILED`` markers and ``jobs.json``. Where ``squeue``
(and ``sacct``) answer, the Slurm queue adds ``running``, ``queued`` and ``chained``.

The state of a run, first match wins:

- ``running``: a live ``kilocard run`` holds the run directory here, or one of its jobs runs on Slurm;
- ``queued`` / ``chained``: a job of the run waits in Slurm's queue for resources / for the chain link
  before it (a ``Dependency`` reason);
- ``done``: the ``DONE`` marker, or the last launch ended DONE;
- ``failed``: the ``FAILED`` marker, or the last launch ended CRASH, BAD_CONFIG or BAD_CKPT (a person
  must look before it continues);
- ``retry``: the last launch ended RETRY (stopped by a signal after a committed save);
- ``fault``: the last launch ended FAULT or BAD_NODE (a rank died or hung), or it ended without any exit
  record (the launcher and rank 0 were killed);
- ``unknown``: a process on another host holds the run directory and Slurm cannot be asked;
- ``new``: written but never started (``kilocard sbatch`` without ``--submit``; ``submitted`` when its
  job ids are recorded but Slurm cannot be asked).

How a launch ended: the ``end`` event ``kilocard run`` writes with the run's code (every rank's code
combined), else rank 0's own ``exit`` event; a BUSY exit (a second writer turned away) is not the run's.
"""

from __future__ import annotations

import shlex
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kilocard import exitcodes
from kilocard.base.safe_read import FileReadError, is_regular, read_json, read_text
from kilocard.config.schema import RunConfig
from kilocard.launch.logs import live_local_holder
from kilocard.launch.sbatch import SCRIPT_FILE
from kilocard.launch.slurm import JOBS_FILE, accounting_states, queue_states, sbatch_argv
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events, progress
from kilocard.rundir.freeze import CONFIG_FILE, FrozenConfigError, load_verified
from kilocard.rundir.lock import read_holder
from kilocard.rundir.metrics import read_metrics
from kilocard.rundir.reproduction import excluded_steps

DONE_MARKER, FAILED_MARKER = "DONE", "FAILED"
"""The batch script's markers in a Slurm run directory (``slurm/train.sbatch.tmpl``)."""
STATES = ("running", "queued", "chained", "done", "failed", "retry", "fault", "unknown", "new", "submitted")
"""Every state a run can be listed in (the module docstring says when)."""
CONTINUES_ITSELF = frozenset({"running", "queued", "chained", "unknown", "done"})
"""States with no command to continue them: the run goes on by itself, or is complete."""
FAILED_CODES = frozenset({exitcodes.CRASH, exitcodes.BAD_CONFIG, exitcodes.BAD_CKPT})


@dataclass(frozen=True)
class RunInfo:
    """One run as ``kilocard runs`` lists it (``--format json``: these keys)."""

    run_dir: str
    """The run directory, as found under the root given."""
    state: str
    """One of ``STATES``."""
    detail: str
    """Why it is in that state, in a few words (the exit code, the holder, the Slurm job)."""
    launcher: str
    """``local`` (``kilocard run``) or ``slurm`` (a batch script)."""
    recipe: str
    """``recipe.name`` of the frozen config."""
    created: float
    """Unix time the run directory was written (its frozen config's)."""
    step: int | None
    """The newest trained step (``metrics.jsonl``); ``None`` before the first."""
    committed_step: int | None
    """The newest committed checkpoint step (the step a resume starts from); ``None`` when none."""
    train_iters: int
    """Steps the run trains (``trainer.train_iters``)."""
    loss: float | None
    """The loss of the newest step."""
    mfu: float | None
    """Measured MFU: the median over the steady-state steps (as ``kilocard report``), else over every step."""
    tflops_per_gpu: float | None
    """Measured TFLOP/s per GPU, the same median."""
    step_time_s: float | None
    """Measured seconds per step, the same median."""
    eta_s: float | None
    """Seconds of training left at the measured step time (``None`` when done or before the first step)."""
    wall_s: float | None
    """Seconds from the first launch to the newest record (to now while running)."""
    exit_code: int | None
    """How the last launch ended (``kilocard.exitcodes``); ``None`` when it did not record it."""
    job_ids: list[int]
    """The run's Slurm jobs (``jobs.json``)."""
    resume_command: str | None
    """The command that continues the run; ``None`` when it continues by itself or is done."""
    tracker_step: int | None = None
    """The step the checkpoint tracker names when that step has lost its manifest (or its folder), so that
    ``committed_step`` is an older one or none; ``None`` when the tracker's step is intact (the usual case). A
    resume refuses that step, or falls back with ``checkpoint.fallback_to_previous``."""

    def to_json(self) -> dict[str, Any]:
        """Every field, by name."""
        return asdict(self)


class BadRunDir(ValueError):
    """A directory that cannot be read as a run (its frozen config, records or tracker): the message says why."""


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` looks like a run directory (it holds a frozen config)."""
    return (path / CONFIG_FILE).exists() or (path / CONFIG_FILE).is_symlink()


def candidates(root: Path) -> list[Path]:
    """The directories under ``root`` that may be runs (hidden ones, e.g. a run being written, left out)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def read_run(run_dir: Path, queue: dict[int, tuple[str, str]] | None = None, now: float | None = None) -> RunInfo:
    """``RunInfo`` of ``run_dir`` with ``queue`` (``launch.slurm.queue_states``; ``None``: Slurm not asked);
    ``BadRunDir`` naming what cannot be read."""
    try:
        return _read(run_dir, queue, time.time() if now is None else now)
    except BadRunDir:
        raise
    except (FrozenConfigError, events.BadRecord, ck.CheckpointError, FileReadError, ValueError) as e:
        raise BadRunDir(str(e)) from None
    except OSError as e:  # a folder of the run that cannot be listed or looked into (no permission)
        where = e.filename if e.filename is not None else run_dir
        raise BadRunDir(f"{where}: cannot be read ({e.strerror or type(e).__name__})") from None


def _read(run_dir: Path, queue: dict[int, tuple[str, str]] | None, now: float) -> RunInfo:
    cfg, _ = load_verified(run_dir)
    records = read_metrics(run_dir)
    evts = events.read(run_dir)
    ids = job_ids(run_dir)
    root = ck.checkpoint_root(run_dir, cfg)
    tracker, intact = ck.latest_committed(root), ck.committed_steps(root)
    committed = intact[0] if intact else None
    state, detail, code = state_of(run_dir, evts, ids, queue)
    steady = _steady(cfg, records, evts)
    step = records[-1]["step"] if records else None
    step_time = _median(steady, "step_time_s")
    left = cfg.trainer.train_iters - (step if step is not None else (committed or 0))
    starts = [e["time"] for e in evts if e["event"] == "start"]
    last = max([e["time"] for e in evts] + [r.get("time", 0) for r in records], default=None)
    return RunInfo(
        run_dir=str(run_dir),
        state=state,
        detail=detail,
        launcher="slurm" if is_slurm(run_dir) else "local",
        recipe=str(cfg.recipe.name),
        created=(run_dir / CONFIG_FILE).stat().st_mtime,
        step=step,
        committed_step=committed,
        tracker_step=tracker if tracker != committed else None,
        train_iters=cfg.trainer.train_iters,
        loss=records[-1].get("loss") if records else None,
        mfu=_median(steady, "mfu"),
        tflops_per_gpu=_median(steady, "tflops_per_gpu"),
        step_time_s=step_time,
        eta_s=None if state == "done" or step_time is None else max(left, 0) * step_time,
        wall_s=None if not starts or last is None else (now if state == "running" else last) - starts[0],
        exit_code=code,
        job_ids=ids,
        resume_command=resume_command(run_dir, cfg, state),
    )


def _steady(cfg: RunConfig, records: list[dict[str, Any]], evts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steady-state records (``kilocard report``'s rule), or every record when none is."""
    resumed = [int(e.get("step") or 0) for e in evts if e["event"] == "resume"]
    left_out = excluded_steps(cfg, (r["step"] for r in records), resumed)
    return [r for r in records if r["step"] not in left_out] or records


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)]
    return float(statistics.median(values)) if values else None


def is_slurm(run_dir: Path) -> bool:
    """Whether the run is a Slurm run (``kilocard sbatch`` wrote its batch script)."""
    return (run_dir / SCRIPT_FILE).exists()


def job_ids(run_dir: Path) -> list[int]:
    """The run's Slurm job ids: those recorded in ``jobs.json``, then the job holding the run directory
    (a script submitted by hand) when it is another."""
    path = run_dir / JOBS_FILE
    ids = read_json(path, dict).get("job_ids", []) if path.exists() else []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRunDir(f"{path}: job_ids is not a list of job ids; the file was edited or damaged")
    held = str(read_holder(run_dir).get("slurm_job_id") or "")
    return ids + [int(held)] if held.isdigit() and int(held) not in ids else ids


def last_code(evts: list[dict[str, Any]]) -> tuple[int | None, bool]:
    """How the last launch ended: (its code, whether it started at all). The launcher's ``end`` event wins
    over rank 0's ``exit``; a BUSY exit (a second writer turned away) is skipped."""
    starts = [i for i, e in enumerate(evts) if e["event"] == "start"]
    if not starts:
        return None, False
    after = [e for e in evts[starts[-1] :] if e["event"] in ("end", "exit") and e.get("code") != exitcodes.BUSY]
    for kind in ("end", "exit"):
        codes = [e.get("code") for e in after if e["event"] == kind and isinstance(e.get("code"), int)]
        if codes:
            return codes[-1], True
    return None, True


def slurm_state(ids: list[int], queue: dict[int, tuple[str, str]] | None) -> tuple[str, str] | None:
    """``running``/``queued``/``chained`` with the job named, from Slurm's queue; ``None`` when no job of
    the run is in it (or Slurm was not asked)."""
    mine = [(i, *queue[i]) for i in ids if queue and i in queue]
    running = [i for i, s, _ in mine if s in ("RUNNING", "COMPLETING", "CONFIGURING")]
    waiting = [(i, r) for i, s, r in mine if s in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED")]
    more = f", {len(waiting)} more job(s) queued" if waiting else ""
    if running:
        return "running", f"Slurm job {running[-1]} running{more}"
    if waiting:
        job, reason = waiting[0]
        if reason.startswith("Dependency"):
            return "chained", f"Slurm job {job} waits for the chain link before it"
        return "queued", f"Slurm job {job} pending ({reason})"
    return None


def state_of(
    run_dir: Path,
    evts: list[dict[str, Any]],
    ids: list[int],
    queue: dict[int, tuple[str, str]] | None,
) -> tuple[str, str, int | None]:
    """(state, detail, last exit code) of the run: the rules of the module docstring, in order."""
    code, started = last_code(evts)
    holder = live_local_holder(run_dir)
    if holder:
        return "running", f"pid {holder.get('pid')} on this host holds the run directory", code
    queued = slurm_state(ids, queue)
    if queued:
        return (*queued, code)
    if (run_dir / DONE_MARKER).exists():
        return "done", "DONE marker", code
    if (run_dir / FAILED_MARKER).exists():
        return "failed", f"FAILED marker: {_first_line(run_dir / FAILED_MARKER)}", code
    if code is not None:
        return _by_code(code), _code_words(code, ids), code
    if started:
        held = read_holder(run_dir)
        if held and queue is None and held.get("slurm_job_id"):
            return (
                "unknown",
                f"held by Slurm job {held.get('slurm_job_id')} on {held.get('host')} (squeue not here)",
                code,
            )
        return "fault", "ended without an exit record (the launcher and rank 0 were killed)", code
    if ids:
        state = "new" if queue is not None else "submitted"
        final = accounting_states(ids[-1:]).get(ids[-1]) if queue is not None else None
        return state, f"Slurm job {ids[-1]} never started" + (f" ({final})" if final else ""), code
    return "new", "never started", code


def _by_code(code: int) -> str:
    if code == exitcodes.DONE:
        return "done"
    if code == exitcodes.RETRY:
        return "retry"
    if code in FAILED_CODES:
        return "failed"
    return "fault"  # FAULT, BAD_NODE, a rank killed by a signal (> 128)


def _code_words(code: int, ids: list[int]) -> str:
    name = exitcodes.describe(code) or ("killed by a signal" if code > 128 else "")
    job = f" (Slurm job {ids[-1]})" if ids else ""
    return f"exit {code} {name}".rstrip() + job


def _first_line(path: Path) -> str:
    text = read_text(path, limit=4096, errors="replace").strip() if is_regular(path) else ""
    return text.splitlines()[0] if text else "(empty)"


def resume_command(run_dir: Path, cfg: RunConfig, state: str) -> str | None:
    """The command that continues the run (``None`` in ``CONTINUES_ITSELF``): ``kilocard run --resume`` for a
    local run; for a Slurm run its batch script again (after removing a ``FAILED`` marker, which stops every
    later job)."""
    if state in CONTINUES_ITSELF:
        return None
    if not is_slurm(run_dir):
        return progress.resume_command(run_dir)  # what the run's own summary says
    argv = sbatch_argv(run_dir / SCRIPT_FILE, cfg.launcher.secret_env, parsable=False)
    submit = " ".join(shlex.quote(a) for a in argv)
    if (run_dir / FAILED_MARKER).exists():
        return f"rm {shlex.quote(str(run_dir / FAILED_MARKER))} && {submit}"
    return submit


def slurm_jobs(run_dirs: list[Path]) -> list[int]:
    """Every job id recorded in ``run_dirs`` (unreadable ``jobs.json`` files skipped: the run says so later)."""
    out: list[int] = []
    for d in run_dirs:
        try:
            out += job_ids(d)
        except (BadRunDir, OSError, ValueError):
            continue
    return out


def read_all(run_dirs: list[Path]) -> tuple[list[RunInfo], list[tuple[Path, str]]]:
    """Every run of ``run_dirs``, newest first, and ``(dir, why)`` of each that cannot be read. Slurm's queue
    is asked once for all of them (when a run has a job)."""
    ids = slurm_jobs(run_dirs)
    queue = queue_states(ids) if ids else {}
    runs, bad = [], []
    for d in run_dirs:
        try:
            runs.append(read_run(d, queue))
        except BadRunDir as e:
            bad.append((d, str(e)))
    return sorted(runs, key=lambda r: r.created, reverse=True), bad
