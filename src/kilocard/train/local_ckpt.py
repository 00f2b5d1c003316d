"""The local (node-memory) checkpoint tier: every rank's own shard, every
``checkpoint.non_persistent_save_interval`` steps, beside the persistent ``dist_checkpointing`` saves.

Built on NVRx's ``LocalCheckpointManager`` (``nvidia_resiliency_ext.checkpointing.local``) holding
Megatron-Core's ``MCoreTensorAwareStateDict`` (Megatron-LM's own local checkpoint format) with the
``atomic`` algorithm: each rank writes what it holds to ``<root>/<session>/<rank>/iter_<step>_<rank>_local.pt``
(written as ``.dirty``, then renamed by NVRx). Besides the model and optimizer shards the file carries this
rank's RNG and the trainer state (data position, LR scheduler). kilocard adds a sha256 of each file
(``<file>.sha256``, computed while it is written), checked before a resume; a file that fails it is removed.

CPU-only limits (NVRx 0.4.1): replication (``CliqueReplicationStrategy``) and asynchronous local saves call
CUDA, so on CPU ranks the tier saves synchronously and without replication: a lost node loses its shard
and the resume falls back to the persistent tier. The ``fully_parallel`` algorithm needs CUDA too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from kilocard.base.digest import sha256_file
from kilocard.base.safe_read import read_text
from kilocard.train import ckpt_state as cs
from kilocard.train.megatron_adapter import UnsupportedConfig

ALGO = "atomic"
"""``MCoreTensorAwareStateDict`` algorithm: every rank keeps all it holds (``fully_parallel`` needs CUDA)."""
RANK_STATE = "kilocard"
"""Key of the per-rank extras (RNG, trainer state) in the saved state dict's common part."""
DIGEST_SUFFIX = ".sha256"
"""Suffix of the sidecar file holding a local checkpoint file's sha256."""


def default_root(environ: Mapping[str, str]) -> Path:
    """``checkpoint.non_persistent_local_ckpt_dir`` when null: node memory (``/dev/shm``), else ``$TMPDIR``,
    else ``/tmp`` (resolved on each node)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(environ.get("TMPDIR") or "/tmp")


def session_id(run_dir: Path) -> str:
    """The run's directory under the root: its name and a hash of its absolute path (two runs never share it)."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]
    return f"kilocard-{run_dir.name}-{digest}"


class _HashingWriter:
    """A binary file that hashes what is written through it (torch.save writes the zip stream here)."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.h = f, hashlib.sha256()

    def write(self, b: bytes) -> int:
        self.h.update(b)
        return self.f.write(b)

    def flush(self) -> None:
        self.f.flush()


def _manager_class() -> type:
    """NVRx's ``LocalCheckpointManager`` extended with the sha256 sidecar (NVRx is the optional ``resiliency``
    extra: without it the tier is refused with one line)."""
    try:
        from nvidia_resiliency_ext.checkpointing.local.ckpt_managers.local_manager import LocalCheckpointManager
    except ImportError as e:
        raise UnsupportedConfig(
            f"checkpoint.non_persistent_save_interval needs nvidia-resiliency-ext ({e}); install kilocard[resiliency] "
            "or set checkpoint.non_persistent_save_interval=null"
        ) from None

    class VerifiedLocalManager(LocalCheckpointManager):
        """``LocalCheckpointManager`` whose files carry a sha256 sidecar, written before the final rename."""

        def _save(self, state_dict: Any, ckpt_id: Any) -> None:
            self._ensure_dir()
            dirty = self._local_ckpt_path_from_id(ckpt_id, True)
            final = self._local_ckpt_path_from_id(ckpt_id, False)
            with open(dirty, "xb") as f:
                w = _HashingWriter(f)
                # torch.save takes any object with write and flush (its docs); its FileLike stub says IO[bytes]
                torch.save(state_dict, w)  # type: ignore[arg-type]
            final.with_name(final.name + DIGEST_SUFFIX).write_text(w.h.hexdigest() + "\n")
            dirty.rename(final)

        def _cleanup(self, iteration: int) -> None:
            super()._cleanup(iteration)
            for d in self.local_ckpt_dir.glob("iter_*" + DIGEST_SUFFIX):
                if int(d.name.split("_")[1]) < iteration:
                    d.unlink(missing_ok=True)

    return VerifiedLocalManager


class LocalTier:
    """One rank's local checkpoints (collective: every rank calls the same methods in the same order)."""

    def __init__(self, root: Path, run_dir: Path) -> None:
        self.root, self.session = root, session_id(run_dir)
        self.rank = dist.get_rank()
        self.manager = _manager_class()(root, session_id=self.session)
        self._cached: Any = None
        """``MCoreTensorAwareStateDict`` metadata of the first save (later saves skip the sharding check)."""

    @property
    def directory(self) -> Path:
        """This rank's directory of local checkpoint files."""
        return Path(self.manager.local_ckpt_dir)

    def save(self, step: int, model: list[Any], optimizer: Any, rank_state: dict[str, Any]) -> None:
        """Save ``step`` on every rank (model, optimizer, ``rank_state`` = RNG and trainer state); NVRx checks
        with a collective that every rank has it before older files are removed."""
        from megatron.core.dist_checkpointing.tensor_aware_state_dict import MCoreTensorAwareStateDict

        sd = cs.sharded_state_dict(model, optimizer, is_loading=False)
        tasd, self._cached = MCoreTensorAwareStateDict.from_state_dict(sd, algo=ALGO, cached_metadata=self._cached)
        tasd.common[RANK_STATE] = rank_state
        self.manager.save(tasd, step)

    def newest(self) -> tuple[int | None, list[str]]:
        """The newest step every rank holds intact (``None``: none) and, on rank 0, why newer ones are not usable.

        Each rank first checks its own files against their sha256 and removes those that fail (a torn or
        altered copy); NVRx's ``find_latest`` then all-gathers what each rank holds.
        """
        bad = self._drop_bad_files()
        problems: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(problems, bad)
        step = self.manager.find_latest()
        held = [max((i for i, _, _ in ids), default=-1) for ids in self.manager.globally_available_ids]
        notes = [f"rank {r}: {p}" for r, ps in enumerate(problems) for p in ps]
        if max(held, default=-1) > step:
            missing = [r for r, h in enumerate(held) if h < max(held)]
            notes.append(f"local step {max(held)} is missing on rank(s) {', '.join(map(str, missing))}")
        return (step if step >= 0 else None), notes

    def _drop_bad_files(self) -> list[str]:
        """Remove this rank's local files (and leftovers of unfinished saves) whose sha256 does not verify."""
        out: list[str] = []
        d = self.directory
        if not d.is_dir():
            return out
        for p in sorted(d.glob("iter_*_local*.pt")):
            if ".dirty" in p.suffixes:
                p.unlink(missing_ok=True)
                continue
            digest = p.with_name(p.name + DIGEST_SUFFIX)
            why = None
            if not digest.is_file():
                why = f"{p} has no {DIGEST_SUFFIX} (torn or foreign)"
            elif sha256_file(p) != read_text(digest, limit=4096, errors="replace").strip():
                why = f"{p} fails its sha256 check (corrupted)"
            if why:
                out.append(why)
                p.unlink(missing_ok=True)
                digest.unlink(missing_ok=True)
        return out

    def load(self, model: list[Any], optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """Load the step ``newest`` found: (state dict with ``model``/``optimizer`` as ``dist_checkpointing.load``
        returns it, this rank's ``rank_state``)."""
        tasd, _ = self.manager.load()
        rank_state = tasd.common.pop(RANK_STATE)
        cs.init_optimizer_states(optimizer)
        sd = cs.sharded_state_dict(model, optimizer, is_loading=True)
        return tasd.to_state_dict(sd, algo=ALGO), rank_state

    def discard_after(self, step: int) -> None:
        """Remove this rank's files of steps after ``step`` (a resume from an older step supersedes them) and
        start a fresh manager, so the next save of such a step does not collide."""
        d = self.directory
        if d.is_dir():
            for p in d.glob("iter_*"):
                if int(p.name.split("_")[1]) > step:
                    p.unlink(missing_ok=True)
        self.manager = _manager_class()(self.root, session_id=self.session)

    def remove(self) -> None:
        """Delete this rank's local files and, once empty, the run's directory (the run ended committed)."""
        shutil.rmtree(self.directory, ignore_errors=True)
        try:
            self.directory.parent.rmdir()
        except OSError:
            pass  # another rank's directory is still there (or already gone)
