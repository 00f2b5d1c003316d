"""Checkpoint files: the commit protocol on disk, the integrity check, and the choice of step to resume.

Layout of ``<checkpoint dir>``::

    step_0000010/             one step: dist_checkpointing files (.metadata, *.distcp, common.pt, ...)
                              + rng/rank_*.pt + trainer_state.json
    step_0000010/manifest.json   size and sha256 of every other file of the step, dot-files included
    latest_committed.txt      the newest committed step (temp file + fsync + rename)

A step counts only once committed (``commit_step``, on rank 0 after every rank has written): the
manifest, then the tracker, then older steps are pruned to ``checkpoint.keep_last``. A step
directory without a manifest, or newer than the tracker, is never loaded. On load the manifest is
verified first; a missing, altered or unlisted file is an error naming the step and the file, with
the newest intact committed step and how to resume from it (or, with
``checkpoint.fallback_to_previous``, that step is used). Torch-free: the ranks' side is
``kilocard.train.ckpt_manager``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kilocard.base.digest import sha256_file
from kilocard.base.safe_read import FileReadError, expect_shape, is_regular, read_json, read_text, require_field
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.rundir.names import CHECKPOINTS_DIR, MANIFEST, STATE, TRACKER

NON_SHAPE_FIELDS = frozenset(
    {
        "name",
        "hidden_dropout",
        "attention_dropout",
        "init_method_std",
        "moe_aux_loss_coeff",
        "moe_token_dispatcher_type",
        "moe_router_load_balancing_type",
        "moe_grouped_gemm",
        "seq_length",
    }
)
"""Model fields a resume may change: they do not alter any parameter's shape or meaning."""


def checkpoint_root(run_dir: Path, run_cfg: RunConfig) -> Path:
    """Where this run's checkpoints are: ``checkpoint.save`` when set (absolute in a frozen config), else
    ``<run_dir>/checkpoints``. The one answer for the trainer that writes them and the summary that reads them."""
    save = run_cfg.checkpoint.save
    return Path(save) if save else Path(run_dir) / CHECKPOINTS_DIR


class CheckpointError(Exception):
    """A checkpoint fails its integrity check or cannot be read (exit BAD_CKPT)."""


class ModelMismatch(Exception):
    """The checkpoint holds a model of another shape than the config (exit BAD_CONFIG)."""


class DiskFull(Exception):
    """A checkpoint could not be written: no space left (exit CRASH; the last committed step is intact)."""


def step_dir(root: Path, step: int) -> Path:
    """Directory of ``step`` under the checkpoint root."""
    return root / f"step_{step:07d}"


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: temp file, fsync, rename, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _step_files(sdir: Path) -> list[str]:
    """Every file of a step directory but its manifest, dot-files (torch_dist's ``.metadata``) included."""
    return [str(p.relative_to(sdir)) for p in sorted(sdir.rglob("*")) if p.is_file() and p != sdir / MANIFEST]


def write_manifest(sdir: Path) -> dict[str, Any]:
    """Hash every file of a step directory into its manifest; return the manifest."""
    files = {rel: {"size": (sdir / rel).stat().st_size, "sha256": sha256_file(sdir / rel)} for rel in _step_files(sdir)}
    manifest = {"step": int(sdir.name.split("_")[-1]), "files": files}
    atomic_write(sdir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(mpath: Path) -> dict[str, Any]:
    """A step's ``manifest.json``, shape-checked (``{"step": int, "files": {relative path: {"size": int,
    "sha256": str}}}``, no path leaving the step directory); ``CheckpointError`` naming the file otherwise."""
    try:
        manifest = read_json(mpath, dict)
        require_field(mpath, manifest, "step", int)
        for rel, meta in require_field(mpath, manifest, "files", dict).items():
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise FileReadError(mpath, "lists a file outside its step directory")
            expect_shape(mpath, meta, dict, "a file entry")
            require_field(mpath, meta, "size", int)
            require_field(mpath, meta, "sha256", str)
    except FileReadError as e:
        raise CheckpointError(f"{e} (a damaged manifest: the step cannot be verified)") from None
    return manifest


def verify_step(sdir: Path) -> None:
    """Raise ``CheckpointError`` naming the step and file unless the files are exactly the manifest's."""
    mpath = sdir / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{sdir}: no {MANIFEST}; the step was never committed")
    manifest = read_manifest(mpath)
    step = manifest["step"]
    for rel, meta in manifest["files"].items():
        p = sdir / rel
        if not is_regular(p):
            raise CheckpointError(f"checkpoint step {step}: file {p} is missing")
        if p.stat().st_size != meta["size"]:
            raise CheckpointError(
                f"checkpoint step {step}: file {p} has {p.stat().st_size} bytes, "
                f"manifest says {meta['size']} (truncated or altered)"
            )
        if sha256_file(p) != meta["sha256"]:
            raise CheckpointError(f"checkpoint step {step}: file {p} fails its sha256 check (corrupted)")
    for rel in _step_files(sdir):
        if rel not in manifest["files"]:
            raise CheckpointError(
                f"checkpoint step {step}: file {sdir / rel} is not in {MANIFEST} "
                f"(added after the commit, or written by a kilocard that did not hash it)"
            )


def latest_committed(root: Path) -> int | None:
    """The step in the tracker, or ``None`` when nothing was committed under ``root``."""
    t = root / TRACKER
    if not t.is_file():
        return None
    try:
        text = read_text(t, limit=4096).strip()
    except FileReadError as e:
        raise CheckpointError(str(e)) from None
    if not text.isdigit():
        raise CheckpointError(f"{t}: expected a step number, found {len(text)} other characters")
    return int(text)


def committed_steps(root: Path) -> list[int]:
    """Committed steps under ``root`` (manifest present, not newer than the tracker), newest first."""
    last = latest_committed(root)
    if last is None:
        return []
    steps = []
    for d in root.glob("step_*"):
        try:
            s = int(d.name.split("_")[-1])
        except ValueError:
            continue
        if s <= last and (d / MANIFEST).is_file():
            steps.append(s)
    return sorted(steps, reverse=True)


def prune(root: Path, keep_last: int, newest: int) -> None:
    """Remove committed steps beyond the newest ``keep_last`` and uncommitted leftovers older than ``newest``."""
    keep = set(committed_steps(root)[: max(keep_last, 1)])
    for d in root.glob("step_*"):
        try:
            s = int(d.name.split("_")[-1])
        except ValueError:
            continue
        if s not in keep and s <= newest:
            shutil.rmtree(d, ignore_errors=True)


def commit_step(root: Path, step: int, keep_last: int) -> None:
    """Commit a step every rank has finished writing (rank 0): manifest, then tracker, then prune."""
    write_manifest(step_dir(root, step))
    atomic_write(root / TRACKER, f"{step}\n")
    prune(root, keep_last, step)


# --- what a step holds -------------------------------------------------------------------------------


@dataclass
class TrainerState:
    """The non-tensor state of a committed step (``trainer_state.json``)."""

    step: int
    """Optimizer steps completed."""
    consumed_samples: int
    """Global samples trained on (the data position)."""
    scheduler: dict[str, Any]
    """OptimizerParamScheduler.state_dict()."""
    model: dict[str, Any]
    """The model config the weights belong to (``ModelConfig`` as a dict)."""
    layout: dict[str, Any]
    """The parallel layout at save time, ``kilocard.layout.Layout.to_json()`` (RNG states are per rank of it;
    ``Layout.from_json`` also reads the degrees-only dict that steps saved before held)."""
    padded_vocab_size: int
    """Vocabulary rows of the saved embedding."""
    config_sha256: str = ""
    """sha256 of the run config that wrote the step."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the loop wants back (e.g. the stop reason)."""


#: The type of each ``trainer_state.json`` field (checked before a ``TrainerState`` is built from it).
STATE_SHAPE: dict[str, tuple[type, ...]] = {
    "step": (int,),
    "consumed_samples": (int,),
    "scheduler": (dict,),
    "model": (dict,),
    "layout": (dict,),
    "padded_vocab_size": (int,),
    "config_sha256": (str,),
    "extra": (dict,),
}


def read_state(sdir: Path) -> TrainerState:
    """A committed step's ``trainer_state.json`` through the safe reader, each field shape-checked;
    ``CheckpointError`` naming the file otherwise."""
    path = sdir / STATE
    try:
        doc = read_json(path, dict)
        for key, types in STATE_SHAPE.items():
            if key in doc or key not in ("config_sha256", "extra"):
                require_field(path, doc, key, types)
    except FileReadError as e:
        raise CheckpointError(f"{e} (a damaged step: it cannot be loaded)") from None
    return TrainerState(**{k: v for k, v in doc.items() if k in STATE_SHAPE})


def model_differences(saved: dict[str, Any], current: ModelConfig) -> list[str]:
    """``field: saved -> current`` for every shape-relevant model field that differs."""
    now = asdict(current)
    return [
        f"model.{k}: {saved.get(k)!r} -> {now[k]!r}"
        for k in sorted(now)
        if k not in NON_SHAPE_FIELDS and saved.get(k) != now[k]
    ]


def newest_committed(save_root: Path, load_root: Path | None, ckpt_step: int | None = None) -> int:
    """The step ``load_root_and_step`` would try first, before any verification (0 when there is none or its
    tracker is unreadable): what a newer local-tier step must beat."""
    try:
        own = latest_committed(save_root)
        if own is not None:
            return own
        if load_root is None:
            return 0
        return ckpt_step if ckpt_step is not None else (latest_committed(load_root) or 0)
    except CheckpointError:
        return 0


def load_root_and_step(
    save_root: Path, load_root: Path | None, fallback: bool, ckpt_step: int | None = None
) -> tuple[Path | None, int | None]:
    """Where to resume from: this run's own newest committed step, else ``checkpoint.load``'s
    (its step ``ckpt_step`` when given). Returns ``(None, None)`` for a fresh start.

    Verifies the manifest (the caller runs this on rank 0 only). Raises ``CheckpointError`` naming the
    step and file and the newest intact committed step, unless ``fallback`` lets that step be used.
    """
    if save_root is not None and latest_committed(save_root) is not None:
        return save_root, _pick(save_root, committed_steps(save_root), fallback, latest_committed(save_root), _own_fix)
    if load_root is None or latest_committed(load_root) is None:
        if load_root is not None:
            raise CheckpointError(f"checkpoint.load: {load_root} holds no committed step ({TRACKER} missing)")
        return None, None
    steps = committed_steps(load_root)
    if ckpt_step is not None:
        if ckpt_step not in steps:
            raise CheckpointError(
                f"checkpoint.ckpt_step: step {ckpt_step} is not committed under {load_root} "
                f"(committed: {sorted(steps)})"
            )
        steps = [s for s in steps if s <= ckpt_step]
    wanted = latest_committed(load_root) if ckpt_step is None else ckpt_step
    return load_root, _pick(load_root, steps, fallback, wanted, _load_fix)


def _own_fix(root: Path, step: int) -> str:
    """How to resume a run from its own committed ``step``: ``kilocard run --resume`` takes no overrides,
    so the tracker is pointed at it (as Megatron-LM users edit ``latest_checkpointed_iteration.txt``)."""
    return (
        f"to resume from it, write {step} into {root / TRACKER} and resume again "
        f"(kilocard run --resume RUN_DIR, or resubmit the job); the steps after it are then trained again"
    )


def _load_fix(root: Path, step: int) -> str:
    """How to start from ``step`` of a ``checkpoint.load`` directory (which is not the run's own to rewrite)."""
    return f"to start from it, start a new run with checkpoint.ckpt_step={step} (checkpoint.load={root})"


def _pick(root: Path, steps: list[int], fallback: bool, wanted: int, fix: Callable[[Path, int], str]) -> int:
    """``wanted`` when it is the newest of ``steps`` (newest first) and passes verification.

    Otherwise the newest step that passes when ``fallback`` is on; when it is off, a ``CheckpointError``
    naming the failing file, that step and how to resume from it (``fix``).
    """
    first_error: CheckpointError | None = None
    if not steps or steps[0] != wanted:
        first_error = CheckpointError(
            f"checkpoint step {wanted}: {step_dir(root, wanted)} has no {MANIFEST} "
            f"although it is committed (deleted or moved?)"
        )
    for s in steps:
        try:
            verify_step(step_dir(root, s))
        except CheckpointError as e:
            first_error = first_error or e
            continue
        if first_error is None or fallback:
            return s
        raise CheckpointError(f"{first_error}; step {s} is the newest committed step that passes; {fix(root, s)}")
    raise CheckpointError(f"{first_error}; and no older committed step under {root} passes its integrity check")
