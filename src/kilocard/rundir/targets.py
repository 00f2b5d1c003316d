"""Where kilocard may write: the one authority every writer asks before it writes a byte.

Readers go through ``kilocard.base.safe_read``; writers through here. A target is refused with
``WriteTargetError`` (one line naming the option or field, the path, what is wrong and the fix; exit 2 at
the verbs' error boundary, before any work) when:

* it lies inside a checkpoint tree (``checkpoint_tree_of``): a committed step (a directory holding a
  manifest), a checkpoint directory (a tracker or an owner file) or a run directory's ``checkpoints/``.
  Nothing but the trainer's commits may be written there: a stray file fails its step's verification, and
  a run, a dataset or a plot written there belongs to no one;
* it lies in a system directory (``/dev``, ``/proc``, ``/sys``), which holds devices, not files;
* an output file would not be written exactly as given: an existing directory, device or FIFO, a
  missing folder, or a name without a file type the writer knows (matplotlib would append ``.png`` to
  ``/tmp`` and write ``/tmp.png``, and refuse ``out.txt`` with an internal error);
* an output directory exists and is not empty, is a file, or is a symlink;
* an output prefix names no file (empty, or ending in ``/``);
* a host path must go into pyxis' ``--container-mounts`` list and that list cannot carry it: ``,``
  separates mounts and ``:`` separates a mount's source from its destination, and ``/`` itself would
  mount the host's root over the container's (``mount_problem``; ``config_issues`` checks it at
  validate time).

``config_issues`` is what ``validate``, ``run`` and ``sbatch`` check of a new run's config: its
``checkpoint.save``, ``cluster.shared_fs``, ``data.path_to_cache`` and local checkpoint folder outside any
checkpoint tree (``checkpoint.save`` may be a
checkpoint directory itself: who owns it is ``rundir.checkpoint.fresh_save_issues``'), and its mount paths.
``write_file`` writes a checked file atomically (a temporary sibling renamed into place); ``one_writer`` makes
the processes that update one file take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from kilocard.config.schema import RunConfig
from kilocard.data.paths import is_number
from kilocard.rundir.freeze import HASH_FILE
from kilocard.rundir.names import CHECKPOINTS_DIR, MANIFEST, OWNER, TRACKER
from kilocard.validate.issues import Issue, error

PLOT_TYPES = (".png", ".svg", ".pdf")
"""File types a plot is written in (``--plot``): matplotlib's, chosen by the name's ending."""
SITE_TYPES = (".yaml", ".yml")
"""File types of a site baselines file (``baselines --site``)."""
SYSTEM_DIRS = ("/dev", "/proc", "/sys")
"""Directories of devices and kernel state: kilocard writes no file there."""
MOUNT_SEPARATORS = (",", ":")
"""Characters pyxis' ``--container-mounts`` list splits on (mounts, then source:destination:flags)."""


class WriteTargetError(Exception):
    """A target kilocard must not write: one line naming the option, the path, why, and the fix."""

    def __init__(self, field: str, path: object, what: str, fix: str):
        self.field, self.path = field, str(path)
        super().__init__(f"{field}: {path}: {what}; fix: {fix}")


def checkpoint_tree_of(path: str | os.PathLike[str]) -> Path | None:
    """The checkpoint directory (or step) that ``path`` lies in or is, else ``None``: a directory holding a
    tracker, an owner file or a manifest, or a run directory's ``checkpoints`` (nothing may be written there
    but the trainer's commits: a stray file fails its step's verification)."""
    p = Path(path).expanduser().absolute()
    for d in (p, *p.parents):
        d = d.resolve() if d.exists() else d
        if any((d / name).exists() for name in (TRACKER, OWNER, MANIFEST)):
            return d
        if d.name == CHECKPOINTS_DIR and (d.parent / HASH_FILE).exists():
            return d
    return None


def _resolved(path: str | os.PathLike[str]) -> Path:
    """``path`` absolute, with ``~`` expanded and the symlinks of its existing part resolved."""
    return Path(path).expanduser().resolve()


def _refuse_places(field: str, path: str | os.PathLike[str], shown: object) -> None:
    """Refuse ``path`` inside a checkpoint tree or a system directory."""
    tree = checkpoint_tree_of(path)
    if tree is not None:
        raise WriteTargetError(
            field,
            shown,
            f"lies inside the checkpoint directory {tree}, where nothing but committed steps may be written (a "
            "stray file fails a step's verification)",
            "choose a path outside it",
        )
    real = _resolved(path)
    for system in SYSTEM_DIRS:
        if real == Path(system) or real.is_relative_to(system):
            raise WriteTargetError(
                field, shown, f"lies in {system}, which holds devices, not files", "choose a folder of yours"
            )


def _kind(p: Path) -> str:
    if p.is_dir():
        return "a directory"
    return "a FIFO, device or socket" if p.exists() else "a broken symlink"


def output_file(field: str, path: str, types: Iterable[str] = PLOT_TYPES) -> Path:
    """``path`` as a file to (over)write exactly as given: its name ends in one of ``types``, it is a regular
    file or absent, its folder exists, and it lies outside any checkpoint tree and system directory."""
    kinds = tuple(types)
    listed = ", ".join(kinds)
    if not path or not path.strip():
        raise WriteTargetError(field, repr(path), "is empty", f"name a file ending in {listed}")
    p = Path(path).expanduser()
    if p.suffix.lower() not in kinds:
        raise WriteTargetError(
            field,
            path,
            f"does not end in {listed} (the file is written exactly as named; its ending says its format)",
            f"name a file ending in {listed}",
        )
    if p.is_symlink() or p.exists():
        if not p.is_file() or p.is_symlink():
            what = "a symlink" if p.is_symlink() else _kind(p)
            raise WriteTargetError(
                field, path, f"is {what}, not a file kilocard may replace", "name a new or regular file"
            )
    if not p.parent.is_dir():
        raise WriteTargetError(field, path, f"its folder {p.parent} is not a directory", "create the folder first")
    _refuse_places(field, p, path)
    return p


@contextlib.contextmanager
def write_file(path: Path, field: str) -> Iterator[Path]:
    """A temporary sibling of ``path`` (checked by ``output_file``) to write; renamed to ``path`` when the
    block ends without an error, removed otherwise. An ``OSError`` (a full disk, no permission) is a
    ``WriteTargetError`` naming the file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise WriteTargetError(
            field, path, f"cannot be written ({e.strerror or type(e).__name__})", "choose a writable folder"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


@contextlib.contextmanager
def one_writer(path: Path) -> Iterator[None]:
    """The block as the only writer of ``path`` among kilocard's processes: an exclusive OS lock on its folder
    (``flock``; a file renamed into place cannot carry the lock itself) for a read, change and rename of a file
    that other processes update too (``baselines --site FILE --add`` from jobs that end together). Where the
    file system has no locks, the block runs unlocked."""
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def output_dir(field: str, path: str) -> Path:
    """``path`` as a directory to fill: a new path or an empty directory, not a symlink, whose parent is (or
    can be made) a directory, outside any checkpoint tree and system directory."""
    if not path or not path.strip():
        raise WriteTargetError(field, repr(path), "is empty", "name a new directory")
    p = Path(path).expanduser()
    if p.is_symlink():
        raise WriteTargetError(field, path, "is a symlink", "give the output as a new directory path")
    if p.exists() and not p.is_dir():
        raise WriteTargetError(
            field, path, f"already exists as {'a file' if p.is_file() else _kind(p)}", "name a new directory"
        )
    if p.is_dir() and any(p.iterdir()):
        raise WriteTargetError(field, path, "already exists and is not empty", "name a new or empty directory")
    for parent in p.absolute().parents:
        if parent.exists() and not parent.is_dir():
            raise WriteTargetError(field, path, f"{parent} is not a directory", "name a directory under a folder")
    _refuse_places(field, p, path)
    return p


def output_prefix(field: str, prefix: str) -> str:
    """``prefix`` as the start of output file names (``PREFIX_text_document.bin``): it names a file (not
    empty, not ending in ``/``), outside any checkpoint tree and system directory."""
    if not prefix or not prefix.strip() or prefix.endswith(("/", os.sep)) or Path(prefix).name in ("", ".", ".."):
        raise WriteTargetError(
            field,
            repr(prefix),
            "names no file (the outputs would be hidden files named by the suffix alone)",
            "give a path such as data/corpus",
        )
    _refuse_places(field, Path(prefix).expanduser(), prefix)
    return prefix


# --- a new run's config ----------------------------------------------------------------------------


def mount_problem(path: str) -> str | None:
    """Why ``path`` cannot go into pyxis' ``--container-mounts`` list (``None`` when it can)."""
    bad = [c for c in MOUNT_SEPARATORS if c in path]
    if bad:
        return (
            f"holds {' and '.join(repr(c) for c in bad)}, which pyxis' --container-mounts list splits on (',' between "
            "mounts, ':' between source and destination)"
        )
    if os.path.normpath(Path(path).expanduser().absolute()) == "/":
        return "is /, and mounting the host's root over the container's would replace the image"
    return None


def _mounted(cfg: RunConfig) -> list[tuple[str, str]]:
    """``(field, host path)`` of every path the batch script mounts into the container (``launch.render``)."""
    c, ck, d = cfg.cluster, cfg.checkpoint, cfg.data
    out = [(f"cluster.container_mounts[{i}]", m.split(":")[0]) for i, m in enumerate(c.container_mounts)]
    out += [(f"cluster.container_mounts[{i}]", m) for i, m in enumerate(c.container_mounts) if "," in m]
    out += [("cluster.shared_fs", str(c.shared_fs))]
    out += [(f"checkpoint.{k}", str(v)) for k, v in (("save", ck.save), ("load", ck.load)) if v]
    out += [("data.path_to_cache", str(d.path_to_cache))] if d.path_to_cache else []
    out += [
        (f"data.data_path[{i}]", os.path.dirname(os.path.normpath(Path(str(p)).expanduser().absolute())))
        for i, p in enumerate(d.data_path)
        if isinstance(p, str) and not is_number(p)
    ]
    if os.path.isabs(d.tokenizer):
        out.append(("data.tokenizer", os.path.dirname(d.tokenizer)))
    return out


def mount_issues(cfg: RunConfig) -> list[Issue]:
    """``MOUNT_PATH``: with a container image, every host path the job mounts is one pyxis can carry."""
    if not cfg.cluster.container_image:
        return []
    out, seen = [], set()
    for field, path in _mounted(cfg):
        problem = mount_problem(path)
        if problem and field not in seen:
            seen.add(field)
            out.append(
                error(
                    "MOUNT_PATH",
                    field,
                    path,
                    f"{path} must be mounted into the container, but it {problem}",
                    "a path without ',' or ':' that is not / (a folder under it)",
                )
            )
    return out


def _inside_issue(field: str, value: str, root: Path) -> list[Issue]:
    """``WRITE_TARGET``: a new run's ``field`` lies inside the checkpoint tree ``root``."""
    return [
        error(
            "WRITE_TARGET",
            field,
            value,
            f"{value} lies inside the checkpoint directory {root}, where nothing but that run's committed steps may "
            "be written (a stray file fails a step's verification)",
            f"a {field} outside it (to start from those weights: checkpoint.load={root})",
        )
    ]


def save_issues(save: str | None) -> list[Issue]:
    """``WRITE_TARGET``: a new run's ``checkpoint.save`` is not inside a checkpoint tree. It may be a checkpoint
    directory itself (a tracker or an owner file, not a step): whose it is, is ``CHECKPOINT_SAVE_OWNED``'s."""
    if not save:
        return []
    root = checkpoint_tree_of(save)
    if root is None:
        return []
    own = Path(save).expanduser().absolute()
    own = own.resolve() if own.exists() else own
    a_step = (root / MANIFEST).exists()
    a_runs_checkpoints = root.name == CHECKPOINTS_DIR and (root.parent / HASH_FILE).exists()
    if root == own and not a_step and not a_runs_checkpoints:
        return []
    return _inside_issue("checkpoint.save", save, root)


def config_issues(cfg: RunConfig) -> list[Issue]:
    """What a new run's config may write: ``checkpoint.save``, and the other folders its job writes into
    (``cluster.shared_fs``, ``data.path_to_cache``, ``checkpoint.non_persistent_local_ckpt_dir``), outside any
    checkpoint tree, and (with a container image) mount paths pyxis can carry."""
    out = save_issues(cfg.checkpoint.save)
    written = {
        "cluster.shared_fs": cfg.cluster.shared_fs,
        "data.path_to_cache": cfg.data.path_to_cache,
        "checkpoint.non_persistent_local_ckpt_dir": cfg.checkpoint.non_persistent_local_ckpt_dir,
    }
    for field, value in written.items():
        tree = checkpoint_tree_of(str(value)) if value else None
        if tree is not None:
            out += _inside_issue(field, str(value), tree)
    return out + mount_issues(cfg)


__all__ = [
    "PLOT_TYPES",
    "SITE_TYPES",
    "WriteTargetError",
    "checkpoint_tree_of",
    "config_issues",
    "mount_issues",
    "mount_problem",
    "output_dir",
    "output_file",
    "output_prefix",
    "save_issues",
    "write_file",
]
