"""Checkpoint files: the commit protocol on disk, the integrity check, and the choice of step to resume.

Layout of ``<checkpoint dir>``::

    step_0000010/             one step: dist_checkpointing files (.metadata, *.distcp, common.pt, ...)
                              + rng/rank_*.pt + trainer_state.json
    step_0000010/manifest.json   size and sha256 of every other file of the step, dot-files included
    latest_committed.txt      the newest committed step (temp file + fsync + rename)
    owner.json                the run that owns the directory (``claim_owner``); every manifest names it too

A step counts only once committed (``commit_step``, on rank 0 after every rank has written): the
manifest, then the tracker, then older steps are pruned to ``checkpoint.keep_last``. A step
directory without a manifest, or newer than the tracker, is never loaded. On load the manifest is
verified first; a missing, altered or unlisted file is an error naming the step and the file, with
the newest intact committed step and how to resume from it (or, with
``checkpoint.fallback_to_previous``, that step is used). A manifest that is not JSON (torn by a power
loss) fails its step's verification like any other damaged file.

One owner per checkpoint directory: the first run that writes into it records itself in ``owner.json``
(its run directory), and a run that is not the owner refuses to load or commit there
(``ForeignCheckpoint``). Losing the tracker never restarts a run from zero: ``recover_tracker`` points it
back at the newest step whose manifest verifies, or refuses. Torch-free: the ranks' side is
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

from kilocard.base.digest import sha256_file
from kilocard.base.safe_read import FileReadError, expect_shape, is_regular, read_json, read_text, require_field
from kilocard.config.schema import ModelConfig, PeftConfig, RunConfig
from kilocard.perf.params import padded_vocab_size
from kilocard.rundir.names import CHECKPOINTS_DIR, MANIFEST, OWNER, PEFT, STATE, TRACKER
from kilocard.validate.issues import Issue, error

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


def completed_step(run_dir: Path, run_cfg: RunConfig) -> int | None:
    """The run's committed step when it reached ``trainer.train_iters`` (the run is complete: a resume trains
    nothing), else ``None``: also when its tracker cannot be read, its last step fails its manifest, or the
    checkpoints belong to another run (the ranks then fall back, or refuse and say why)."""
    root = checkpoint_root(run_dir, run_cfg)
    try:
        step = latest_committed(root)
        if step is None or step < run_cfg.trainer.train_iters:
            return None
        if read_owner(root) not in (None, run_id(run_dir)):
            return None  # another run's checkpoints: the ranks refuse them (BAD_CONFIG)
        verify_step(step_dir(root, step))  # a damaged last step is not a finished run: the ranks fall back or refuse
    except CheckpointError:
        return None
    return step


class CheckpointError(Exception):
    """A checkpoint fails its integrity check or cannot be read (exit BAD_CKPT)."""


class ForeignCheckpoint(Exception):
    """The checkpoint directory belongs to another run (exit BAD_CONFIG: ``checkpoint.save`` points at it)."""


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


def write_manifest(sdir: Path, owner: str | None = None) -> dict[str, Any]:
    """Hash every file of a step directory into its manifest (with the ``owner`` run); return the manifest."""
    files = {rel: {"size": (sdir / rel).stat().st_size, "sha256": sha256_file(sdir / rel)} for rel in _step_files(sdir)}
    manifest = {"step": int(sdir.name.split("_")[-1]), "files": files, "run": owner}
    atomic_write(sdir / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(sdir: Path) -> dict[str, Any]:
    """The ``manifest.json`` of step directory ``sdir``, shape-checked (``{"step": int, "files": {relative path:
    {"size": int, "sha256": str}}}``, no path leaving the step directory); ``CheckpointError`` naming the file
    when it is missing, not JSON (torn by a power loss) or not a manifest."""
    mpath = sdir / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{sdir}: no {MANIFEST}; the step was never committed")
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


def check_files(sdir: Path) -> dict[str, Any]:
    """Raise ``CheckpointError`` naming the step and file unless every file of the manifest is there with its
    size (no hashing: cheap enough for a launcher); returns the manifest."""
    manifest = read_manifest(sdir)
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
    return manifest


def verify_step(sdir: Path) -> None:
    """Raise ``CheckpointError`` naming the step and file unless the files are exactly the manifest's."""
    manifest = check_files(sdir)
    step = manifest["step"]
    for rel, meta in manifest["files"].items():
        p = sdir / rel
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
    return sorted((s for s, d in _step_dirs(root) if s <= last and (d / MANIFEST).is_file()), reverse=True)


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, directory)`` of every ``step_N`` directory under ``root`` (other names skipped)."""
    out = []
    for d in root.glob("step_*"):
        try:
            out.append((int(d.name.split("_")[-1]), d))
        except ValueError:
            continue
    return out


def prune(root: Path, keep_last: int, newest: int) -> None:
    """Remove committed steps beyond the newest ``keep_last`` and uncommitted leftovers older than ``newest``."""
    keep = set(committed_steps(root)[: max(keep_last, 1)])
    for s, d in _step_dirs(root):
        if s not in keep and s <= newest:
            shutil.rmtree(d, ignore_errors=True)


def commit_step(root: Path, step: int, keep_last: int, owner: str | None = None) -> None:
    """Commit a step every rank has finished writing (rank 0): manifest (naming the ``owner`` run), then
    tracker, then prune."""
    write_manifest(step_dir(root, step), owner)
    atomic_write(root / TRACKER, f"{step}\n")
    prune(root, keep_last, step)


# --- one owner per checkpoint directory, and a lost tracker ----------------------------------------


def outside(root: Path, run_dir: Path) -> bool:
    """Whether the checkpoint directory ``root`` lies outside the run directory (it then gets its own lock)."""
    return not Path(root).resolve().is_relative_to(Path(run_dir).resolve())


def run_id(run_dir: Path) -> str:
    """How a run is named as a checkpoint directory's owner: its run directory, resolved."""
    return str(Path(run_dir).resolve())


def read_owner(root: Path) -> str | None:
    """The run recorded in ``root/owner.json`` (``None`` when there is none or it is unreadable)."""
    try:
        info = read_json(root / OWNER, dict)
    except FileReadError:
        return None
    return info.get("run") if isinstance(info.get("run"), str) else None


def has_steps(root: Path) -> bool:
    """Whether ``root`` holds a tracker or any step directory with a manifest (steps someone committed)."""
    return (root / TRACKER).exists() or any((d / MANIFEST).exists() for d in root.glob("step_*"))


def owner_of(root: Path) -> str | None:
    """Who owns ``root``: its owner file's run, else the run named in the newest step's manifest, else
    ``"unknown"`` when it holds committed steps without either (written before owners were recorded, or an
    import by ``kilocard convert``); ``None`` for a directory nobody has committed into."""
    recorded = read_owner(root)
    if recorded or not root.is_dir():
        return recorded
    for s in sorted(_manifested_steps(root), reverse=True):
        try:
            named = read_manifest(step_dir(root, s)).get("run")
        except CheckpointError:
            continue
        if isinstance(named, str):
            return named
    return "unknown" if has_steps(root) else None


def foreign_message(root: Path, owner: str, field: str = "checkpoint.save") -> str:
    """One line: the directory, its owner and the two ways on."""
    who = "a run that did not record its name" if owner == "unknown" else f"run {owner}"
    resume = f"kilocard run --resume {owner}" if owner != "unknown" else "kilocard run --resume <that run>"
    return (
        f"{field}: {root} belongs to {who} (its owner file or committed steps); a checkpoint directory has one "
        f"owner. "
        f"Continue that run ({resume}), or start from its weights with checkpoint.load={root} and a "
        f"checkpoint.save of this run's own (or none)"
    )


def fresh_save_issues(save: str | None) -> list[Issue]:
    """``CHECKPOINT_SAVE_OWNED``: a new run's ``checkpoint.save`` holds no other run's committed steps
    (a new run owns nothing yet; relative paths are from the current directory, as the run freezes them)."""
    if not save:
        return []
    root = Path(save).expanduser().absolute()
    owner = owner_of(root)
    if owner is None:
        return []
    return [
        error(
            "CHECKPOINT_SAVE_OWNED",
            "checkpoint.save",
            save,
            foreign_message(root, owner),
            f"kilocard run --resume {owner if owner != 'unknown' else '<that run>'}, or "
            f"checkpoint.load={root} checkpoint.save=null",
        )
    ]


def claim_owner(root: Path, run: str, inside: bool) -> None:
    """Make ``run`` the owner of ``root`` (rank 0, before any load or commit there).

    Raises ``ForeignCheckpoint`` when another run owns it and it lies outside the run directory. The run's
    own ``checkpoints`` (``inside``) is its by construction and adopted whoever is recorded: written by an
    older kilocard, or a run directory that was copied or moved (the owner is named by its path); a
    directory without an owner file whose steps name ``run`` gets the file.
    """
    owner = None if inside else owner_of(root)
    if owner is not None and owner != run:
        raise ForeignCheckpoint(foreign_message(root, owner))
    if read_owner(root) == run:
        return
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(root / OWNER, json.dumps({"run": run}) + "\n")


def _manifested_steps(root: Path) -> list[int]:
    """Steps under ``root`` whose directory holds a manifest (committed once, whatever the tracker says)."""
    return [s for s, d in _step_dirs(root) if (d / MANIFEST).exists()]


def recover_tracker(root: Path) -> str | None:
    """A lost tracker with committed steps left: point it at the newest step whose manifest verifies.

    Returns what was done, in words (``None`` when the tracker is there or nothing was ever committed).
    Raises ``CheckpointError`` when steps remain but none verifies: the run must not start again from zero.
    """
    if (root / TRACKER).exists() or not root.is_dir():
        return None
    steps = sorted(_manifested_steps(root), reverse=True)
    if not steps:
        return None
    errors = []
    for s in steps:
        try:
            verify_step(step_dir(root, s))
        except CheckpointError as e:
            errors.append(str(e))
            continue
        atomic_write(root / TRACKER, f"{s}\n")
        skipped = f" (newer steps fail verification: {'; '.join(errors)})" if errors else ""
        return (
            f"{root / TRACKER} was missing; recovered it: step {s} is the newest step whose manifest verifies{skipped}"
        )
    raise CheckpointError(
        f"{root / TRACKER} is missing and none of the committed steps {sorted(steps)} verifies ({errors[0]}); "
        f"refusing to start again from step 0 over them: restore the steps, or move {root} away to start fresh"
    )


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


def state_differences(state: TrainerState, model: ModelConfig, tp: int) -> list[str]:
    """``model_differences`` of a step's model and ``model``; when the fields agree, the embedding rows the step
    holds against those ``model.vocab_size`` pads to with tensor parallelism ``tp``."""
    diffs = model_differences(state.model, model)
    vocab = padded_vocab_size(model, tp)
    if not diffs and vocab != state.padded_vocab_size:
        diffs = [
            f"model.vocab_size: padded to {state.padded_vocab_size} at save, {vocab} with "
            f"tensor_model_parallel_size={tp}"
        ]
    return diffs


BASE_DIGEST = "base_digest"
"""Key of a LoRA step's ``names.PEFT`` record: the ``content_digest`` of the base step its adapters were trained on."""


def content_digest(sdir: Path) -> str:
    """A committed step's identity by content: the sha256 of its manifest's file list (every file's path, size
    and sha256), so another step written at the same path has another digest. ``CheckpointError`` without one."""
    files = read_manifest(sdir)["files"]
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def base_change(state: TrainerState, sdir: Path) -> str | None:
    """Why the base step the LoRA step ``sdir`` (with ``state``) names is no longer the one its adapters were
    trained on (its directory replaced by another run or import: another ``content_digest`` than the step
    recorded), or ``None``. Reads the base's manifest only; a step that recorded no digest is not compared."""
    saved = state.extra.get(PEFT) or {}
    base, recorded = Path(str(saved.get("base", ""))), saved.get(BASE_DIGEST)
    if recorded is None:
        return None
    try:
        now = content_digest(base)
    except CheckpointError as e:
        return f"the base step {base} its LoRA adapters were trained on cannot be used ({e})"
    if now == recorded:
        return None
    return (
        f"{base} is not the base the LoRA adapters of {sdir} were trained on: its content digest is {now[:16]}..., "
        f"the step recorded {str(recorded)[:16]}... (the directory was replaced)"
    )


BASE_FIX = "restore the base the adapters were trained on, or train new adapters on this one"
"""How to go on when ``base_change`` says the base changed."""


def lora_base(state: TrainerState, sdir: Path) -> Path:
    """The base step of the LoRA step ``sdir``, verified against its manifest and ``base_change``:
    ``CheckpointError`` when it is damaged or is no longer the base the adapters were trained on. The one check
    of the ranks (``kilocard.train.ckpt_manager``) and the export (``kilocard.convert.peft_io``)."""
    base = Path(str((state.extra.get(PEFT) or {}).get("base", "")))
    verify_step(base)
    changed = base_change(state, sdir)
    if changed:
        raise CheckpointError(f"{changed}; {BASE_FIX}")
    return base


LORA_ONLY = "holds LoRA adapters only (trained with peft=lora)"
"""Why a LoRA step cannot continue without ``peft=lora`` (``peft_differences``)."""


def peft_differences(state: TrainerState, peft: PeftConfig) -> list[str]:
    """Why the adapters of a LoRA step (``names.PEFT`` in its extra) cannot go on under ``peft``: it needs
    ``peft=lora`` with the same ``dim`` and ``target_modules`` (their shape) and ``alpha`` (their scale,
    ``alpha / dim``: another one makes the loaded adapters another model; a step that did not record it is not
    compared); ``[]`` for any other step, or when they agree. The one check of ``validate``
    (``load_model_issues``) and the ranks (``kilocard.train.ckpt_manager``)."""
    saved = state.extra.get(PEFT)
    if not isinstance(saved, dict):
        return []
    if peft.type != "lora":
        return [LORA_ONLY]
    return [
        f"peft.{k}: {saved.get(k)!r} -> {getattr(peft, k)!r}"
        for k in ("dim", "target_modules", "alpha")
        if saved.get(k) != getattr(peft, k) and (k != "alpha" or k in saved)
    ]


def load_model_issues(cfg: RunConfig) -> list[Issue]:
    """The step ``checkpoint.load`` starts from (``checkpoint.ckpt_step``, else its newest committed one) exists
    (``CHECKPOINT_LOAD_EMPTY``) and holds the model of ``cfg`` (``CHECKPOINT_MODEL_MISMATCH``; its
    ``trainer_state.json``, which ``convert hf-to-mcore`` writes too): either would stop the ranks after the wait
    in the queue. A directory that does not exist is ``CHECKPOINT_LOAD_MISSING``'s; a damaged step is left to the
    run's own integrity check, which names the file (and may fall back to an older step)."""
    load, wanted = cfg.checkpoint.load, cfg.checkpoint.ckpt_step
    root = Path(load).expanduser().absolute() if load else None
    if not load or root is None or not root.is_dir():
        return []
    try:
        steps = committed_steps(root)
        step = wanted if wanted is not None else latest_committed(root)
    except CheckpointError as e:  # the tracker: not a step number, not UTF-8, not a file
        return [error("CHECKPOINT_LOAD_EMPTY", "checkpoint.load", load, str(e), _EMPTY_FIX)]
    if step is None or not steps or (wanted is not None and wanted not in steps):
        return [_no_step(load, root, step, steps)]
    try:
        state = read_state(step_dir(root, step))
    except CheckpointError:
        return []
    tp = cfg.parallel.tensor_model_parallel_size
    diffs = state_differences(state, cfg.model, tp) if tp >= 1 else model_differences(state.model, cfg.model)
    adapters = peft_differences(state, cfg.peft)
    out = []
    if diffs:
        out.append(
            error(
                "CHECKPOINT_MODEL_MISMATCH",
                "checkpoint.load",
                load,
                f"step {step} of {root} holds another model than this config: {'; '.join(diffs)}",
                "the recipe or model.* overrides the checkpoint was made with (`kilocard convert hf-to-mcore HF_DIR "
                "OUT recipe=<this recipe>` imports for this recipe), or another checkpoint.load",
            )
        )
    changed = base_change(state, step_dir(root, step)) if PEFT in state.extra and not adapters else None
    if changed:
        out.append(error("CHECKPOINT_BASE_CHANGED", "checkpoint.load", load, changed, BASE_FIX))
    if adapters:
        saved = state.extra[PEFT]
        out.append(
            error(
                "CHECKPOINT_MODEL_MISMATCH",
                "checkpoint.load",
                load,
                f"step {step} of {root} {'; '.join(adapters)}"
                if adapters == [LORA_ONLY]
                else f"step {step} of {root} holds adapters of another shape or scale: {'; '.join(adapters)}",
                f"peft=lora peft.dim={saved.get('dim')} peft.target_modules={saved.get('target_modules')} "
                f"peft.alpha={saved.get('alpha', '<as trained>')} to continue them, `kilocard convert mcore-to-hf` "
                "to merge them into the base, or another checkpoint.load",
            )
        )
    return out


_EMPTY_FIX = "the checkpoints folder of a run that saved a step, or `kilocard convert hf-to-mcore HF_DIR OUT`'s OUT"
"""How to give ``checkpoint.load`` a committed step to start from."""


def _no_step(load: str, root: Path, step: int | None, steps: list[int]) -> Issue:
    """``CHECKPOINT_LOAD_EMPTY``: ``checkpoint.load`` has no committed step, or not the ``ckpt_step`` asked for."""
    if not steps:
        what = f"holds no committed step (no {TRACKER} with a step that has its {MANIFEST})"
        return error("CHECKPOINT_LOAD_EMPTY", "checkpoint.load", load, f"checkpoint.load {root} {what}", _EMPTY_FIX)
    return error(
        "CHECKPOINT_LOAD_EMPTY",
        "checkpoint.ckpt_step",
        step,
        f"checkpoint.ckpt_step {step} is not a committed step of {root} (committed: {sorted(steps)})",
        f"checkpoint.ckpt_step=<one of {sorted(steps)}>, or checkpoint.ckpt_step=null for the newest",
    )


def newest_committed(save_root: Path, load_root: Path | None, ckpt_step: int | None = None, lora: bool = False) -> int:
    """The step the run would go on from with the step ``load_root_and_step`` tries first, before any verification
    (0 when there is none or its tracker is unreadable): what a newer local-tier step must beat. With ``lora``
    (``peft=lora``) a ``checkpoint.load`` step without adapters is the frozen base, and the run starts at step 0
    on it (``kilocard.train.ckpt_manager``), whatever step number it has."""
    try:
        own = latest_committed(save_root)
        if own is not None:
            return own
        if load_root is None:
            return 0
        step = ckpt_step if ckpt_step is not None else (latest_committed(load_root) or 0)
        if lora and step and PEFT not in read_state(step_dir(load_root, step)).extra:
            return 0
        return step
    except CheckpointError:
        return 0


def load_root_and_step(
    save_root: Path,
    load_root: Path | None,
    fallback: bool,
    ckpt_step: int | None = None,
    say: Callable[[str], None] | None = None,
) -> tuple[Path | None, int | None]:
    """Where to resume from: this run's own newest committed step, else ``checkpoint.load``'s
    (its step ``ckpt_step`` when given). Returns ``(None, None)`` for a fresh start.

    Verifies the manifest (the caller runs this on rank 0 only). Raises ``CheckpointError`` naming the
    step and file and the newest intact committed step, unless ``fallback`` lets that step be used; then
    ``say`` gets one line naming the step passed over, why, and the step used (the run's log).
    """
    own = latest_committed(save_root) if save_root is not None else None
    if own is not None:
        return save_root, _pick(save_root, committed_steps(save_root), fallback, own, _own_fix, say)
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
    return load_root, _pick(load_root, steps, fallback, wanted, _load_fix, say)


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


def _pick(
    root: Path,
    steps: list[int],
    fallback: bool,
    wanted: int,
    fix: Callable[[Path, int], str],
    say: Callable[[str], None] | None = None,
) -> int:
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
        if first_error is None:
            return s
        if fallback:
            if say is not None:
                say(f"warning: {first_error}; checkpoint.fallback_to_previous: using step {s} instead of {wanted}")
            return s
        raise CheckpointError(f"{first_error}; step {s} is the newest committed step that passes; {fix(root, s)}")
    raise CheckpointError(f"{first_error}; and no older committed step under {root} passes its integrity check")
