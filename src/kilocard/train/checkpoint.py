"""Checkpoints: save with ``megatron.core.dist_checkpointing`` (torch_dist), commit, verify, resume.

Layout of ``<checkpoint dir>``::

    step_0000010/             one step: dist_checkpointing files + rng/rank_*.pt + trainer_state.json
    step_0000010/manifest.json   size and sha256 of every file of the step (written last)
    latest_committed.txt      the newest committed step (temp file + fsync + rename)

A step counts only once committed, in this order: every rank has finished writing (barrier) →
rank 0 writes the manifest → rank 0 writes the tracker → only then older steps are pruned to
``checkpoint.keep_last``. A step directory without a manifest, or newer than the tracker, is never
loaded. On load the manifest is verified first; a missing or altered file is an error naming the
step and the file (or, with ``checkpoint.fallback_to_previous``, the previous committed step is used).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kilocard.config.schema import ModelConfig, RunConfig

TRACKER = "latest_committed.txt"
"""Name of the tracker file holding the newest committed step."""
MANIFEST = "manifest.json"
"""Per-step integrity manifest (relative path -> size, sha256)."""
STATE = "trainer_state.json"
"""Per-step trainer state: step, data position, LR scheduler, model config, layout."""
MODEL_ONLY = "model_only"
"""``TrainerState.extra`` key marking a step that holds model weights only (``kilocard convert hf-to-mcore``):
a run starts from it at step 0 with a fresh optimizer and LR schedule."""
OPTIM_SHARDING = "fully_reshardable"
"""DistributedOptimizer sharding type: reloadable onto any TP/PP/DP layout."""

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


def step_dir(root: Path, step: int) -> Path:
    """Directory of ``step`` under the checkpoint root."""
    return root / f"step_{step:07d}"


def _fsync_write(path: Path, text: str) -> None:
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


def write_tracker(root: Path, step: int) -> None:
    """Commit ``step`` under ``root``: write the tracker atomically (after the step's manifest)."""
    _fsync_write(root / TRACKER, f"{step}\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(sdir: Path) -> dict[str, Any]:
    """Hash every file of a step directory into its manifest; return the manifest."""
    files = {}
    for p in sorted(sdir.rglob("*")):
        if p.is_file() and p.name != MANIFEST and not p.name.startswith("."):
            rel = str(p.relative_to(sdir))
            files[rel] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    manifest = {"step": int(sdir.name.split("_")[-1]), "files": files}
    _fsync_write(sdir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_step(sdir: Path) -> None:
    """Raise ``CheckpointError`` naming the step and file unless every manifest entry matches."""
    mpath = sdir / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{sdir}: no {MANIFEST}; the step was never committed")
    manifest = json.loads(mpath.read_text())
    for rel, meta in manifest["files"].items():
        p = sdir / rel
        if not p.is_file():
            raise CheckpointError(f"checkpoint step {manifest['step']}: file {p} is missing")
        if p.stat().st_size != meta["size"]:
            raise CheckpointError(
                f"checkpoint step {manifest['step']}: file {p} has {p.stat().st_size} bytes, "
                f"manifest says {meta['size']} (truncated or altered)"
            )
        if _sha256(p) != meta["sha256"]:
            raise CheckpointError(f"checkpoint step {manifest['step']}: file {p} fails its sha256 check (corrupted)")


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


def rng_state() -> dict[str, Any]:
    """Every RNG of this rank: python, numpy, torch, CUDA, and Megatron's model-parallel tracker."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "tracker": get_cuda_rng_tracker().get_states(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def rng_file(sdir: Path, rank: int) -> Path:
    """Per-rank RNG file of a step."""
    return sdir / "rng" / f"rank_{rank:05d}.pt"


def model_sharded_state_dict(model: list[Any]) -> dict[str, Any]:
    """Model chunks only: ``model``, or ``model0``, ``model1``.. with virtual stages."""
    if len(model) == 1:
        return {"model": model[0].module.sharded_state_dict()}
    return {f"model{i}": m.module.sharded_state_dict() for i, m in enumerate(model)}


def sharded_state_dict(model: list[Any], optimizer: Any, is_loading: bool) -> dict[str, Any]:
    """Model chunks (``model_sharded_state_dict``) and the optimizer."""
    sd = model_sharded_state_dict(model)
    sd["optimizer"] = optimizer.sharded_state_dict(
        sd, is_loading=is_loading, metadata={"distrib_optim_sharding_type": OPTIM_SHARDING}
    )
    return sd


def init_optimizer_states(optimizer: Any) -> None:
    """Materialise empty torch-Adam states (a zero-grad step; params unchanged) before building a load dict."""
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(o, "_init_optimizer_states_with_dummy_values"):
            o._init_optimizer_states_with_dummy_values()
        else:
            inner = o.optimizer
            for g in inner.param_groups:
                for p in g["params"]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            saved_lr = [g["lr"] for g in inner.param_groups]
            for g in inner.param_groups:
                g["lr"] = 0.0
            if not inner.state:
                wds = [g.get("weight_decay", 0.0) for g in inner.param_groups]
                for g in inner.param_groups:
                    g["weight_decay"] = 0.0
                inner.step()
                for g, wd in zip(inner.param_groups, wds, strict=False):
                    g["weight_decay"] = wd
            for g, lr in zip(inner.param_groups, saved_lr, strict=False):
                g["lr"] = lr


def load_root_and_step(
    save_root: Path, load_root: Path | None, fallback: bool, ckpt_step: int | None = None
) -> tuple[Path | None, int | None]:
    """Where to resume from: this run's own newest committed step, else ``checkpoint.load``'s
    (its step ``ckpt_step`` when given). Returns ``(None, None)`` for a fresh start.

    Verifies the manifest (the caller runs this on rank 0 only). Raises ``CheckpointError`` naming the
    step and file, unless ``fallback`` finds an older committed step that passes.
    """
    if save_root is not None and latest_committed(save_root) is not None:
        return save_root, _pick(save_root, committed_steps(save_root), fallback)
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
    return load_root, _pick(load_root, steps, fallback, ckpt_step)


def _pick(root: Path, steps: list[int], fallback: bool, wanted: int | None = None) -> int:
    """The newest of ``steps`` (newest first) that passes verification; ``wanted`` defaults to the tracker's."""
    wanted = latest_committed(root) if wanted is None else wanted
    first_error: CheckpointError | None = None
    if not steps or steps[0] != wanted:
        first_error = CheckpointError(
            f"checkpoint step {wanted}: {step_dir(root, wanted)} has no {MANIFEST} "
            f"although it is committed (deleted or moved?)"
        )
        if not fallback or not steps:
            raise first_error
    for s in steps:
        try:
            verify_step(step_dir(root, s))
            return s
        except CheckpointError as e:
            if not fallback:
                raise
            first_error = first_error or e
    raise CheckpointError(f"{first_error}; and no older committed step under {root} passes its integrity check")
