"""The run's event record, ``<run_dir>/events.jsonl``: what ``kilocard goodput`` needs besides metrics.jsonl.

Rank 0 (and, at the end of a local launch, ``kilocard run``) appends one JSON line per event, each with
``event`` and ``time`` (unix seconds):

- ``start``: a launch attempt began (``time``: the rank process's start), with ``restart``
  (``SLURM_RESTART_COUNT``, else torchrun's ``TORCHELASTIC_RESTART_COUNT``, else 0), ``job_id``
  (``SLURM_JOB_ID`` or null) and ``world_size``;
- ``resume``: the attempt continues from committed ``step`` (0 on a fresh start) of checkpoint ``tier``
  (``local``, ``persistent``, null on a fresh start); ``superseded_step`` and ``superseded_time`` name the
  newest metrics record it drops (steps an earlier attempt trained after that commit, trained again
  now), null when none;
- ``commit``: checkpoint ``step`` committed, ``seconds`` from the start of its save to the commit, ``tier``
  (``persistent``: the checkpoint directory; ``local``: every rank's node-local copy);
- ``exit``: rank 0 leaves with exit ``code`` (a killed rank 0 writes nothing);
- ``end``: the local launcher (``kilocard run``) saw the launch end with the run's ``code``, every rank's
  combined (``kilocard.exitcodes.from_exit_dir``): what ``kilocard runs`` reports, even when a rank was killed.

Lines are short and appended with one ``write`` (``O_APPEND``), so a torn last line is the only damage
a kill can do; readers skip it. Torch-free.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kilocard.base.safe_read import LINE_LIMIT, read_lines, type_name
from kilocard.rundir.names import EVENTS_FILE

PERSISTENT = "persistent"
"""Checkpoint tier of ``<run_dir>/checkpoints`` (or ``checkpoint.save``): the shared filesystem."""
LOCAL = "local"
"""Checkpoint tier in node-local storage (``checkpoint.non_persistent_*``, ``kilocard.train.local_ckpt``)."""


def append(run_dir: Path, event: str, when: float | None = None, **fields: Any) -> None:
    """Append one event line (``time`` = ``when`` or now) to the run's events.jsonl."""
    record = {"event": event, "time": time.time() if when is None else when, **fields}
    fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def attempt_fields(environ: Mapping[str, str]) -> dict[str, Any]:
    """``restart`` and ``job_id`` of this launch attempt, from Slurm's or torchrun's variables."""
    restart = environ.get("SLURM_RESTART_COUNT") or environ.get("TORCHELASTIC_RESTART_COUNT") or "0"
    return {"restart": int(restart) if restart.isdigit() else 0, "job_id": environ.get("SLURM_JOB_ID")}


class BadRecord(ValueError):
    """A whole line of a run's JSON-lines record file is not a record: the message names file and line."""


def json_lines(
    path: Path,
    required: tuple[str, ...] = (),
    skip_bad: Callable[[str], None] | None = None,
    check: Callable[[dict[str, Any]], str | None] | None = None,
) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (empty when absent): its whole lines, each an object holding
    ``required``. The text after the last newline is the torn tail of a write a killed rank never
    finished (or one still being written); it is dropped. Any other bad line raises ``BadRecord``, or with
    ``skip_bad`` is left out and its ``BadRecord`` message (naming file and line) passed to ``skip_bad``. ``check``
    says what is wrong with a parsed record's values (``None``: nothing), which makes it a bad line too."""
    if not path.exists() and not path.is_symlink():
        return []
    records = []
    for n, line in read_lines(path):
        if line is not None and not line.strip():
            continue
        try:
            if line is None:
                raise BadRecord(f"{path} line {n}: longer than {LINE_LIMIT} bytes; the file was edited or damaged")
            record = _record(path, n, line, required)
            why = check(record) if check is not None else None
            if why is not None:
                raise BadRecord(f"{path} line {n}: {why}; the file was edited or damaged")
            records.append(record)
        except BadRecord as e:
            if skip_bad is None:
                raise
            skip_bad(str(e))
    return records


def _record(path: Path, n: int, line: str, required: tuple[str, ...]) -> dict[str, Any]:
    """Line ``n`` of ``path`` as a record holding ``required``, else ``BadRecord`` naming file and line."""
    if "\x00" in line:  # what a power loss leaves: a block of NUL bytes where the data never reached the disk
        raise BadRecord(f"{path} line {n}: NUL bytes (a write lost in a crash or power loss)")
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadRecord(f"{path} line {n}: not JSON ({e.msg}); the file was edited or damaged") from None
    if not isinstance(record, dict):
        raise BadRecord(
            f"{path} line {n}: {type_name(record)}, not a record (a JSON object); the file was edited or damaged"
        )
    missing = [k for k in required if k not in record]
    if missing:
        raise BadRecord(f"{path} line {n}: a record without {', '.join(missing)}; the file was edited or damaged")
    return record


def read(run_dir: Path) -> list[dict[str, Any]]:
    """Every whole event line of the run (empty when there is none); a torn last line is skipped."""
    return json_lines(Path(run_dir) / EVENTS_FILE, required=("event", "time"))
