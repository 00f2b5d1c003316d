"""Where a run's wall time went, from its own records: the figures of ``kilocard goodput``.

Reads ``events.jsonl`` (launch attempts, resumes, committed checkpoints, exits; ``kilocard.rundir.events``)
and ``metrics.jsonl`` (one record per step with ``step_time_s`` and ``time``, the unix time at the end
of the step's period) and returns a ``RunGoodput``; prints nothing. Definitions:

- ``wall_s``: from the first attempt's start to the last thing the run recorded;
- ``productive_s``: the step times of the training records kept (every step once: a step trained again
  after a fault counts once, in the attempt that kept it);
- ``eval_s``: the seconds of every evaluation recorded (``trainer.eval_interval``: the validation and test
  records of metrics.jsonl, which are no steps), neither productive nor lost;
- ``checkpoint_s``: the seconds of every committed save, per tier (``persistent``: the checkpoint
  directory; ``local``: the node-local tier, ``checkpoint.non_persistent_save_interval``);
- a fault is an attempt that a later attempt followed although it did not end DONE (0) or RETRY (75).
  Its ``step`` is the newest step it recorded; the fault time is estimated as the last thing the
  attempt recorded (a step's end, a commit, or its start), so ``seconds_to_detect`` (to rank 0's exit;
  to the next attempt's start when rank 0 left no exit) is an upper bound. ``seconds_to_resume`` runs
  from the fault to the end of the first step computed after it, ``steps_recomputed`` counts the
  steps after the resumed commit (of either tier: ``resumed_step``, ``resumed_tier``) that had been
  recorded before the fault, and ``seconds_lost`` is all
  the wall time from the later of that commit and the attempt's first step to the start of the first
  step after the fault: the work redone, the detection, the restart and the resume;
- ``predicted``: the Young/Daly figures (``kilocard.perf.goodput``) for the run's GPU count, its measured
  median persistent save time and its checkpoint interval (``checkpoint.save_interval`` x (median step time
  + evaluation seconds per step)); the predicted goodput also leaves out the measured evaluation share.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kilocard import exitcodes
from kilocard.layout import world_size
from kilocard.perf.goodput import Goodput, goodput
from kilocard.rundir import events
from kilocard.rundir.freeze import load_verified
from kilocard.rundir.metrics import read_evals, read_metrics

CLEAN_EXITS = frozenset({exitcodes.DONE, exitcodes.RETRY})
"""Exit codes of an attempt that ended as planned (finished, or stopped after a committed save)."""


class NoRecords(Exception):
    """The directory holds no events.jsonl: not a kilocard run directory, or one that never trained."""


@dataclass(frozen=True)
class Fault:
    """Time lost to one fault (see the module docstring for each definition)."""

    step: int
    """The newest step the failed attempt recorded."""
    kind: str
    """``rank_lost`` (rank 0 exited FAULT: another rank died or hung), ``crash``, ``signal``, ``killed``
    (rank 0 recorded no exit: it, or its node, died), or ``exit_<code>``."""
    seconds_to_detect: float
    """From the fault (estimated) to rank 0's exit (or the next attempt's start)."""
    seconds_to_resume: float | None
    """From the fault to the end of the first step computed after it; ``None`` when none was."""
    steps_recomputed: int
    """Steps recorded after the resumed commit and before the fault, trained again."""
    seconds_lost: float | None
    """Wall time from the resumed commit (or the attempt's first step) to the first step after the fault."""
    resumed_step: int = 0
    """The committed step the next attempt resumed from (0: from scratch)."""
    resumed_tier: str | None = None
    """Its tier (``events.LOCAL`` or ``events.PERSISTENT``; ``None`` from scratch or when not recorded)."""

    def to_json(self) -> dict[str, Any]:
        """The fault as ``kilocard goodput --format json`` prints it."""
        return {
            "step": self.step,
            "kind": self.kind,
            "seconds_to_detect": self.seconds_to_detect,
            "seconds_to_resume": self.seconds_to_resume,
            "steps_recomputed": self.steps_recomputed,
            "seconds_lost": self.seconds_lost,
        }


@dataclass(frozen=True)
class RunGoodput:
    """Where a run's wall time went."""

    wall_s: float
    """First attempt's start to the last record."""
    productive_s: float
    """Sum of the kept step times."""
    checkpoint_local_s: float
    """Seconds of saves to the node-local tier."""
    checkpoint_persistent_s: float
    """Seconds of committed saves to the checkpoint directory."""
    faults: tuple[Fault, ...]
    """One entry per fault, oldest first."""
    attempts: int
    """Launch attempts recorded."""
    steps: int
    """Steps kept in metrics.jsonl."""
    median_step_s: float | None
    """Median kept step time."""
    median_save_s: float | None
    """Median persistent save time."""
    median_local_save_s: float | None
    """Median local-tier save time (``None``: no local save)."""
    predicted: Goodput | None
    """Young/Daly figures for this run (GPU count, measured persistent save time); ``None`` without saves or steps."""
    checkpoint_interval_s: float | None
    """``checkpoint.save_interval`` x (the median step time + evaluation seconds per step); ``None`` when saves
    are off."""
    eval_s: float = 0.0
    """Seconds of the recorded evaluations (validation and test)."""
    evals: int = 0
    """Evaluations recorded."""

    @property
    def eval_share(self) -> float:
        """Evaluation's share of step plus evaluation time."""
        busy = self.productive_s + self.eval_s
        return self.eval_s / busy if busy > 0 else 0.0

    @property
    def goodput(self) -> float:
        """Productive share of the wall time."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def predicted_goodput(self) -> float | None:
        """1 - Young/Daly's expected lost fraction at this run's checkpoint interval."""
        if self.predicted is None or not self.checkpoint_interval_s:
            return None
        return (1.0 - self.predicted.lost_at(self.checkpoint_interval_s)) * (1.0 - self.eval_share)

    def to_json(self) -> dict[str, Any]:
        """The report as ``kilocard goodput --format json`` prints it (the contract: exactly these keys)."""
        return {
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "goodput": self.goodput,
            "checkpoint_s": {"local": self.checkpoint_local_s, "persistent": self.checkpoint_persistent_s},
            "eval_s": self.eval_s,
            "faults": [f.to_json() for f in self.faults],
        }


@dataclass(frozen=True)
class _Attempt:
    """One launch attempt's events and the metrics records that ended inside it."""

    start: float
    end: float | None
    """The next attempt's start (``None`` for the last)."""
    evts: list[dict[str, Any]]
    records: list[dict[str, Any]]

    def event(self, name: str) -> dict[str, Any] | None:
        """The attempt's first ``name`` event."""
        return next((e for e in self.evts if e["event"] == name), None)


def report(run_dir: Path) -> RunGoodput:
    """Where the wall time of the run in ``run_dir`` went; raises ``NoRecords`` when it has no events."""
    evts = sorted(events.read(run_dir), key=lambda e: e["time"])
    starts = [e["time"] for e in evts if e["event"] == "start"]
    if not starts:
        raise NoRecords(f"{run_dir} has no launch attempt in events.jsonl (expected a run directory that trained)")
    records = [r for r in read_metrics(run_dir) if "time" in r]
    evals = [r for r in read_evals(run_dir) if "eval_time_s" in r]
    eval_s = sum(r["eval_time_s"] for r in evals)
    attempts = _attempts(starts, evts, records)
    commits = [e for e in evts if e["event"] == "commit"]
    last = max([evts[-1]["time"], *(r["time"] for r in records), *(r["time"] for r in evals if "time" in r)])
    step_times = [r["step_time_s"] for r in records]
    saves = _save_seconds(commits, events.PERSISTENT)
    local_saves = _save_seconds(commits, events.LOCAL)
    median_step = statistics.median(step_times) if step_times else None
    median_save = statistics.median(saves) if saves else None
    return RunGoodput(
        wall_s=last - starts[0],
        productive_s=sum(step_times),
        checkpoint_local_s=sum(local_saves),
        checkpoint_persistent_s=sum(saves),
        faults=tuple(f for i in range(len(attempts) - 1) if (f := _fault(attempts, i, commits)) is not None),
        attempts=len(attempts),
        steps=len(records),
        median_step_s=median_step,
        median_save_s=median_save,
        median_local_save_s=statistics.median(local_saves) if local_saves else None,
        eval_s=eval_s,
        evals=len(evals),
        **_prediction(run_dir, evts, median_step, median_save, eval_s / len(records) if records else 0.0),
    )


def _save_seconds(commits: list[dict[str, Any]], tier: str) -> list[float]:
    """Seconds of every committed save of ``tier`` (a commit without a tier is persistent: older records)."""
    return [e["seconds"] for e in commits if e.get("tier", events.PERSISTENT) == tier]


def _attempts(starts: list[float], evts: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[_Attempt]:
    """Split events and records by attempt: everything from one start up to the next."""
    out = []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else None
        inside = lambda t, t0=t0, t1=t1: t >= t0 and (t1 is None or t < t1)  # noqa: E731
        out.append(
            _Attempt(
                start=t0,
                end=t1,
                evts=[e for e in evts if inside(e["time"])],
                records=[r for r in records if inside(r["time"])],
            )
        )
    return out


def _kind(code: int | None) -> str:
    """A fault's kind from rank 0's exit code (``None``: rank 0 recorded none)."""
    if code is None:
        return "killed"
    return {exitcodes.FAULT: "rank_lost", exitcodes.CRASH: "crash"}.get(
        code, "signal" if code > 128 else f"exit_{code}"
    )


def _fault(attempts: list[_Attempt], i: int, commits: list[dict[str, Any]]) -> Fault | None:
    """Attempt ``i``'s fault (``None`` when it ended cleanly); attempt ``i + 1`` resumed after it."""
    failed, nxt = attempts[i], attempts[i + 1]
    exit_event = failed.event("exit")
    code = exit_event["code"] if exit_event else None
    if code in CLEAN_EXITS:
        return None
    resume = nxt.event("resume") or {}
    resumed = int(resume.get("step") or 0)
    recorded = [(r["step"], r["time"]) for r in failed.records]
    recorded += [(e["step"], e["time"]) for e in failed.evts if e["event"] == "commit"]
    if resume.get("superseded_step") is not None:
        recorded.append((resume["superseded_step"], resume["superseded_time"]))
    fault_t = max([failed.start, *(t for _, t in recorded)])
    step = max([resumed, *(s for s, _ in recorded)])
    detected = exit_event["time"] if exit_event else nxt.start
    first = next((r for r in nxt.records if r["step"] == resumed + 1), None)
    commit_t = max((e["time"] for e in commits if e["step"] == resumed and e["time"] <= fault_t), default=failed.start)
    progress_from = min((r["time"] - r["step_time_s"] for r in failed.records), default=failed.start)
    return Fault(
        step=step,
        kind=_kind(code),
        seconds_to_detect=detected - fault_t,
        seconds_to_resume=first["time"] - fault_t if first else None,
        steps_recomputed=step - resumed,
        seconds_lost=(first["time"] - first["step_time_s"]) - max(commit_t, progress_from) if first else None,
        resumed_step=resumed,
        resumed_tier=resume.get("tier"),
    )


def _prediction(
    run_dir: Path,
    evts: list[dict[str, Any]],
    median_step: float | None,
    median_save: float | None,
    eval_per_step: float = 0.0,
) -> dict[str, Any]:
    """``predicted`` and ``checkpoint_interval_s``: Young/Daly for the run's GPUs and measured save time
    (a checkpoint interval in wall time: steps and the evaluations between them, ``eval_per_step``)."""
    cfg, _ = load_verified(Path(run_dir))
    save = cfg.checkpoint.save_interval
    interval = save * (median_step + eval_per_step) if save and median_step else None
    world = next((e.get("world_size") for e in reversed(evts) if e["event"] == "start"), None)
    gpus = world or world_size(cfg.cluster)
    predicted = goodput(gpus, median_save) if median_save is not None else None
    return {"predicted": predicted, "checkpoint_interval_s": interval}
