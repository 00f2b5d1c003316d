"""Run directories: created whole or not at all, never overwritten.

A run directory holds the frozen config (``config.yaml`` + ``config.sha256``), ``provenance.json``
(code version, library versions, host, command line) and, later, checkpoints, metrics and logs.
It is first written under a hidden temporary name and renamed into place, so a failure never
leaves a half-written run directory behind.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

import yaml
from omegaconf import DictConfig

from kilocard.config.schema import RunConfig
from kilocard.launch.abspaths import absolute, absolute_paths
from kilocard.paths import MAX_NAME_BYTES, checkout_root, data_dir
from kilocard.rundir.freeze import write_frozen

PROVENANCE_FILE = "provenance.json"
PROVENANCE_DIR = "provenance"
LIBRARIES = ("kilocard", "megatron-core", "torch", "hydra-core", "omegaconf", "transformer-engine", "numpy")


class RunDirError(Exception):
    """A run directory cannot be created (exists, not writable, bad name)."""


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries that decide results (``None`` when absent)."""
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def code_version() -> dict[str, object]:
    """Git commit and dirty flag of the kilocard source tree, when it is a checkout.

    Without a usable ``git`` the version is recorded as unknown, with the reason (``git_error``):
    that is no reason to refuse a run, and not the shared filesystem's fault.
    """
    src = checkout_root()
    if src is None or not (src / ".git").exists():
        return {"git_commit": None, "dirty": None}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True, timeout=10).stdout.strip()

    try:
        return {
            "git_commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"git_commit": None, "dirty": None, "git_error": f"git could not be run ({e})"}


def provenance(overrides: Sequence[str], config_sha256: str) -> dict[str, object]:
    """What was submitted, and the submitting host's view of the code and libraries.

    The job's nodes may run other versions (a container image, a cluster venv): what actually ran is
    recorded per node and restart by the in-job preflight under ``provenance/`` (``what_ran``).
    """
    return {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "overrides": list(overrides),
        "config_sha256": config_sha256,
        "submit_host": {
            "host": platform.node(),
            "python": platform.python_version(),
            "code": code_version(),
            "libraries": library_versions(),
        },
        "what_ran": f"{PROVENANCE_DIR}/job-<job id>-<restart>-<node>.json (one per node and restart, in-job preflight)",
    }


def default_name(job_name: str) -> str:
    """``<job_name>-<UTC timestamp>``."""
    return f"{job_name}-{_dt.datetime.now(_dt.UTC).strftime('%Y%m%d-%H%M%S')}"


def job_name(cfg: DictConfig | RunConfig) -> str:
    """The Slurm job name and run-directory prefix: ``launcher.job_name``, else the recipe's name."""
    return str(cfg.launcher.job_name or cfg.recipe.name)


def base_name(cfg: DictConfig | RunConfig) -> str:
    """The run directory's name before any ``-2`` suffix: ``launcher.run_name``, else ``default_name``."""
    return cfg.launcher.run_name or default_name(job_name(cfg))


def shipped_value(cluster: str, field: str) -> object:
    """``field`` of the cluster profile ``cluster`` as kilocard ships it (``None`` when no such profile)."""
    path = data_dir("conf") / "cluster" / f"{cluster}.yaml"
    if not path.is_file():
        return None
    return (yaml.safe_load(path.read_text()) or {}).get(field)


def shared_fs_problem(cfg: DictConfig | RunConfig) -> str | None:
    """Why no run directory can be made under ``cluster.shared_fs`` here (one line with the fix), or ``None``.

    Only the last directory of the root is ever made: a root whose parent does not exist is refused (a
    mistyped or unmounted parent is never created on the local disk). When that root is a shipped profile's
    own value (the GPU profiles' ``/lustre/fsw/...``), it is a placeholder: the line asks for the site's value.
    """
    value = str(cfg.cluster.shared_fs)
    root = Path(absolute(value, Path.cwd()))
    if root.is_dir() or root.parent.is_dir():
        return None
    if value == shipped_value(cfg.cluster.name, "shared_fs"):
        return (
            f"cluster.shared_fs: {value} is the {cfg.cluster.name} profile's placeholder, not a directory here; "
            "give your site's value (a site profile, or cluster.shared_fs=/path/to/runs)"
        )
    return (
        f"cluster.shared_fs: {value}: {root.parent} does not exist (kilocard makes only the last directory); "
        "create it, or choose a directory that exists"
    )


def _check_name(name: str, field: str) -> None:
    if not name or name.startswith(".") or "/" in name or any(c.isspace() for c in name):
        raise RunDirError(
            f"{field}: {name!r} is not a usable directory name (no '/', no whitespace, not starting with '.')"
        )
    if len(name.encode()) > MAX_NAME_BYTES:
        raise RunDirError(
            f"{field}: the run directory name is {len(name.encode())} bytes long ({name[:40]}...); "
            f"use at most {MAX_NAME_BYTES} (file systems allow 255 per name)"
        )


def runs_root(cfg: DictConfig | RunConfig) -> Path:
    """The directory run directories go in: ``cluster.shared_fs``, ``~`` expanded, absolute, symlinks resolved.
    The one answer for ``kilocard sbatch`` (its preview and the run it writes) and ``kilocard run``."""
    return Path(cfg.cluster.shared_fs).expanduser().resolve()


def create_run_dir(
    cfg: DictConfig,
    overrides: Sequence[str],
    root: Path | None = None,
    stage: Callable[[Path], None] | None = None,
) -> Path:
    """Create the run directory for ``cfg`` under ``root`` (default: ``cluster.shared_fs``).

    An explicit ``launcher.run_name`` that already exists is refused; an automatic name gets a
    ``-2``, ``-3`` ... suffix instead. Every path of the frozen config is made absolute against the
    cwd (``kilocard.launch.abspaths``). ``stage(tmp_dir)`` adds files (the job's code) before the
    directory is renamed into place, so its failure leaves nothing behind. Returns the final path.
    """
    root_given = root
    root = Path(root).expanduser() if root is not None else runs_root(cfg)
    cfg = absolute_paths(cfg, Path.cwd())  # the returned path stays as given; the frozen one is absolute
    explicit = cfg.launcher.run_name
    base = base_name(cfg)
    _check_name(base, "launcher.run_name" if explicit else "launcher.job_name")
    problem = shared_fs_problem(cfg) if root_given is None else None
    if problem:
        raise RunDirError(problem)
    try:
        root.mkdir(exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cluster.shared_fs: cannot create {root} ({e.strerror}); choose a writable path") from None
    tmp = root / f".{base}.tmp-{os.getpid()}"
    try:
        tmp.mkdir()
        digest = write_frozen(cfg, tmp)
        (tmp / PROVENANCE_FILE).write_text(json.dumps(provenance(overrides, digest), indent=1) + "\n")
        if stage is not None:
            stage(tmp)
        return _rename_into_place(tmp, root, base, explicit is not None)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunDirError(f"cluster.shared_fs: cannot write a run directory under {root} ({e.strerror})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _rename_into_place(tmp: Path, root: Path, base: str, explicit: bool) -> Path:
    for i in range(1, 1000):
        final = root / (base if i == 1 else f"{base}-{i}")
        if final.exists():
            if explicit:
                shutil.rmtree(tmp, ignore_errors=True)
                raise RunDirError(
                    f"launcher.run_name: {final} already exists; a run directory is never overwritten "
                    f"(resume it with --resume, or choose another launcher.run_name)"
                )
            continue
        try:
            os.rename(tmp, final)  # atomic; fails if another process took the name first
            return final
        except OSError:
            if explicit:
                raise
    raise RunDirError(f"launcher.run_name: no free name for {base!r} under {root}")
