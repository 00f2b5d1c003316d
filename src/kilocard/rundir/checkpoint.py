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

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.rundir.names import MANIFEST, TRACKER

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


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _step_files(sdir: Path) -> list[str]:
    """Every file of a step directory but its manifest, dot-files (torch_dist's ``.metadata``) included."""
    return [str(p.relative_to(sdir)) for p in sorted(sdir.rglob("*")) if p.is_file() and p != sdir / MANIFEST]


def write_manifest(sdir: Path) -> dict[str, Any]:
    """Hash every file of a step directory into its manifest; return the manifest."""
    files = {rel: {"size": (sdir / rel).stat().st_size, "sha256": sha256_file(sdir / rel)} for rel in _step_files(sdir)}
    manifest = {"step": int(sdir.name.split("_")[-1]), "files": files}
    atomic_write(sdir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_step(sdir: Path) -> None:
    """Raise ``CheckpointError`` naming the step and file unless the files are exactly the manifest's."""
    mpath = sdir / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{sdir}: no {MANIFEST}; the step was never committed")
    manifest = json.loads(mpath.read_text())
    step = manifest["step"]
    for rel, meta in manifest["files"].items():
        p = sdir / rel
        if not p.is_file():
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
    text = t.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{t}: expected a step number, found {text[:40]!r}")
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
    """Parallel layout and world size at save time (RNG states are per rank of this layout)."""
    padded_vocab_size: int
    """Vocabulary rows of the saved embedding."""
    config_sha256: str = ""
    """sha256 of the run config that wrote the step."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else the loop wants back (e.g. the stop reason)."""


def layout_of(run_cfg: RunConfig, world_size: int) -> dict[str, Any]:
    """The layout facts that decide whether per-rank state (RNG) maps one-to-one on resume."""
    p = run_cfg.parallel
    return {
        "world_size": world_size,
        "tp": p.tensor_model_parallel_size,
        "pp": p.pipeline_model_parallel_size,
        "vp": p.virtual_pipeline_model_parallel_size,
        "cp": p.context_parallel_size,
        "ep": p.expert_model_parallel_size,
        "etp": p.expert_tensor_parallel_size,
        "distributed_optimizer": p.use_distributed_optimizer,
    }


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
    own = latest_committed(save_root) if save_root is not None else None
    if own is not None:
        return save_root, _pick(save_root, committed_steps(save_root), fallback, own, _own_fix)
    newest = latest_committed(load_root) if load_root is not None else None
    if load_root is None or newest is None:
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
    wanted = newest if ckpt_step is None else ckpt_step
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
