"""Reading a Slurm run's output one rank at a time (the verb is ``kilocard.commands.logs``).

The batch script writes every job of a run (requeues and chain links too) to
``<run_dir>/logs/slurm-<jobid>.out``; the training step runs under ``srun --label``, so each rank's
line starts with ``<rank>: ``. With in-job restarts (``launcher.max_restarts`` > 0) srun runs one
``ft_launcher`` per node, so the label is the node's; the launcher prefixes each line of its ranks with
the global rank (``ftlaunch.LINE_PREFIX``): ``<node>: [rank<rank>]: ``, and its own lines carry the node
label only. ``--rank N`` keeps rank N's lines and the batch script's own ``[kilocard ...]`` lines
(start, exit codes, requeues); ``--follow`` keeps reading until the run has a ``DONE`` or ``FAILED``
marker. A local run (``kilocard run``) writes ``<run_dir>/logs/train.log``: it is read the same way,
``--rank N`` keeps the lines its launcher labels ``[rankN]: `` (torchrun's or ft_launcher's ``--tee``,
``ftlaunch.LINE_PREFIX``; a rank started by hand tags its own ``[rank N]``), and ``--follow`` ends when no
live ``kilocard run`` holds the run directory's lock.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from kilocard.base.safe_read import FileReadError, open_regular, read_yaml, require_regular
from kilocard.config import load_run_config
from kilocard.launch import ftlaunch
from kilocard.launch.render import LOG_DIR
from kilocard.layout import world_size
from kilocard.rundir.freeze import CONFIG_FILE
from kilocard.rundir.lock import read_holder
from kilocard.rundir.progress import is_progress

#: ``srun --label`` prefix: the task rank, right-aligned to the width of the largest one.
LABEL = re.compile(r"^\s*(\d+): ")
#: In-job restarts: the node's ``srun --label``, then the launcher's prefix naming the rank.
RANK_TAG = re.compile(r"^\s*\d+: " + re.escape(ftlaunch.LINE_PREFIX).replace(re.escape("${rank}"), r"(\d+)"))
SCRIPT_LINE = "[kilocard "
FINISHED = ("DONE", "FAILED")


#: A local run's log (``kilocard run``): torchrun's own lines and every rank's, each labelled ``[rankN]: `` by
#: the launcher (a rank started by hand tags its own ``[rank N]``).
LOCAL_LOG = "train.log"
LOCAL_RANK_TAG = re.compile(r"^\[rank ?(\d+)\]")


def log_files(run_dir: Path) -> list[Path]:
    """The run's job logs in submission (job id) order, then a local run's ``train.log``."""
    files = sorted((run_dir / LOG_DIR).glob("slurm-*.out"), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    local = run_dir / LOG_DIR / LOCAL_LOG
    return [*files, local] if local.is_file() else files


def is_local(run_dir: Path) -> bool:
    """Whether ``run_dir`` was trained by ``kilocard run`` (its log is ``train.log``, no Slurm job logs)."""
    return (run_dir / LOG_DIR / LOCAL_LOG).is_file() and not any((run_dir / LOG_DIR).glob("slurm-*.out"))


def log_problem(run_dir: Path, follow: bool) -> str | None:
    """Why the run's logs cannot be read, or (``follow``) waited for (``None``: they can): a log that is not a
    regular file (a FIFO, a directory: named as what it is), or to follow, a local run's ``train.log`` missing
    while no ``kilocard run`` writes it (it would be waited for forever)."""
    logs = run_dir / LOG_DIR
    for path in [*logs.glob("slurm-*.out"), logs / LOCAL_LOG]:
        if path.exists() or path.is_symlink():
            try:
                require_regular(path)
            except FileReadError as e:
                return str(e)
    if not follow or (logs / LOCAL_LOG).exists() or any(logs.glob("slurm-*.out")):
        return None
    if _launcher_kind(run_dir) != "local":
        return None
    if live_local_holder(run_dir):
        return None  # its kilocard run is starting: the log comes
    why = "no kilocard run is writing this run (it never started, or the log was removed)"
    return f"{logs / LOCAL_LOG}: missing, and {why}"


def _launcher_kind(run_dir: Path) -> str | None:
    """``launcher.kind`` of the run's frozen config (read as YAML, without composing it); ``None`` when unknown."""
    try:
        launcher = read_yaml(run_dir / CONFIG_FILE).get("launcher")
    except (FileReadError, ValueError):
        return None
    kind = launcher.get("kind") if isinstance(launcher, dict) else None
    return kind if isinstance(kind, str) else None


def _alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def ended(run_dir: Path) -> bool:
    """Whether the run has ended: a Slurm run's ``DONE``/``FAILED`` marker, or for a local run no live
    ``kilocard run`` holding its lock (the launcher clears the holder when it ends; a killed one is dead)."""
    if any((run_dir / m).exists() for m in FINISHED):
        return True
    if not is_local(run_dir):
        return False
    return not live_local_holder(run_dir)


def live_local_holder(run_dir: Path) -> dict:
    """The holder of the run directory's lock when it is a live process on this host (a ``kilocard run``, or
    rank 0 of a job on this node); empty otherwise (the launcher clears the holder when it ends, and a
    killed one is dead)."""
    holder = read_holder(run_dir)
    return holder if holder and holder.get("host") == platform.node() and _alive(holder.get("pid")) else {}


def rank_labels(run_dir: Path) -> tuple[bool, int]:
    """(whether the run's frozen config restarts ranks in the job, so that its lines name ranks by ``RANK_TAG``;
    its world size); ``kilocard.config.ComposeError`` naming the file when it is missing or unreadable."""
    cfg = load_run_config(run_dir / CONFIG_FILE)
    return ftlaunch.in_job(cfg), world_size(cfg.cluster)


def select(lines: Iterable[str], rank: int | None, injob: bool = False) -> Iterator[str]:
    """All lines, or rank ``rank``'s lines plus the batch script's own; ``injob``: the lines come from
    one ``ft_launcher`` per node (``RANK_TAG``), not from one srun task per rank (``LABEL``)."""
    pattern = RANK_TAG if injob else LABEL
    for line in lines:
        if rank is not None and not LABEL.match(line) and (m := LOCAL_RANK_TAG.match(line)):
            if int(m.group(1)) == rank:  # a local run's train.log
                yield line
            continue
        if rank is None or line.startswith(SCRIPT_LINE):
            yield line
            continue
        m = pattern.match(line)
        if m and int(m.group(1)) == rank:
            yield line


class Reader:
    """Reads each log file from where it stopped last time (complete lines only)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.offsets: dict[Path, int] = {}

    def skip_existing(self) -> Reader:
        """Start after what the log files hold now (a launcher showing only this launch's lines)."""
        for path in log_files(self.run_dir):
            self.offsets[path] = path.stat().st_size
        return self

    def read_any(self) -> bool:
        """Whether any line has been read so far."""
        return any(self.offsets.values())

    def new_lines(self) -> list[str]:
        """Complete lines written since the last call, file by file."""
        out: list[str] = []
        for path in log_files(self.run_dir):
            with open_regular(path, limit=None) as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            out += data[:end].decode(errors="replace").splitlines(keepends=True)
        return out


def rank0_progress(lines: Iterable[str]) -> Iterator[str]:
    """Rank 0's step and evaluation lines (``kilocard.rundir.progress.is_progress``) among a local run's ``lines``,
    without their rank label and newline: what ``kilocard run`` shows on its terminal."""
    for line in lines:
        m = LOCAL_RANK_TAG.match(line)
        if m and int(m.group(1)) == 0:
            text = line[m.end() :].lstrip(":").strip()
            if is_progress(text):
                yield text
