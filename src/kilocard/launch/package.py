"""Code delivery of a Slurm job (``launcher.packaging``): where the job's ``python`` finds kilocard.

* ``snapshot`` (default): at sbatch time, kilocard's own files are packed as they are into a wheel in
  ``<run_dir>/code/`` and unpacked (pure Python, what ``pip install --target`` does) into
  ``<run_dir>/code/site``, which the batch script puts first on ``PYTHONPATH``. From a checkout (an
  editable install) the wheel holds the files pyproject's wheel table names (``pack_checkout``: no build
  backend runs, so an install without hatchling submits too); from an installed wheel, the installed
  files (``repack_installed``). ``code/requirements.txt`` pins the dependencies at the submit host's
  versions (a record: the job takes them from its venv or image). Editing or deleting the checkout later
  never changes what the job (or a requeue of it) runs.
* ``image``: the profile's ``container_image`` was built by ``kilocard image`` and holds kilocard.
* ``none``: the job's environment already provides kilocard.

In every mode the run directory gets ``preflight.py`` (``slurm/preflight.py``), which the job runs on
every node before training.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from kilocard.config.schema import PACKAGING_MODES
from kilocard.launch.rundir import RunDirError
from kilocard.paths import checkout_root, data_dir

PACKAGING = PACKAGING_MODES
CODE_DIR = "code"
SITE_DIR = "site"
REQUIREMENTS_FILE = "requirements.txt"
PREFLIGHT = "preflight.py"
#: Files of an installed dist-info that describe the installation, not the package.
INSTALL_ONLY = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


class PackageError(RunDirError):
    """kilocard's code cannot be packaged into the run directory."""


def _wheel_sources(root: Path) -> tuple[dict, list[tuple[Path, str]]]:
    """The checkout's ``[project]`` table and every ``(file, name in the wheel)`` of its wheel.

    Read from the same ``[tool.hatch.build.targets.wheel]`` table the build backend reads (``packages``
    and ``force-include``), so the snapshot holds what ``pip install .`` installs, without running
    (or needing) the backend.
    """
    try:
        pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise PackageError(f"launcher.packaging=snapshot: cannot read {root / 'pyproject.toml'} ({e})") from None
    project = pyproject.get("project", {})
    target = pyproject.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})
    mapping = [(rel, Path(rel).name) for rel in target.get("packages", [])]
    mapping += list(target.get("force-include", {}).items())
    if not project.get("name") or not project.get("version") or not mapping:
        raise PackageError(
            f"launcher.packaging=snapshot: {root / 'pyproject.toml'} names no project, version or wheel "
            "packages; fix the checkout or use launcher.packaging=image/none"
        )
    files: list[tuple[Path, str]] = []
    for rel, dest in mapping:
        top = root / rel
        if not top.exists():
            raise PackageError(f"launcher.packaging=snapshot: {top} (in pyproject's wheel sources) does not exist")
        for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                files.append((f, (Path(dest) / f.relative_to(top)).as_posix() if top.is_dir() else dest))
    return project, files


def _metadata(project: dict) -> str:
    """A wheel's ``METADATA`` (core metadata 2.1) for ``project``: name, version, dependencies, extras."""
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}"]
    if project.get("description"):
        lines.append(f"Summary: {project['description']}")
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {r}" for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r}; extra == {extra!r}".replace("'", '"') for r in reqs]
    return "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def pack_checkout(root: Path, dest: Path) -> Path:
    """A wheel of the checkout ``root`` in ``dest``, packed from its files as they are (no build backend).

    ``pip install`` takes it (``METADATA``, ``WHEEL``, ``entry_points.txt``, a hashed ``RECORD``); nothing
    is compiled or generated, so an install without hatchling (``pip install -e .``) packs it too.
    """
    project, files = _wheel_sources(root)
    name, version = str(project["name"]).replace("-", "_"), str(project["version"])
    info = f"{name}-{version}.dist-info"
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    scripts = project.get("scripts", {})
    extra = {
        f"{info}/METADATA": _metadata(project).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kilocard.launch.package\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    if scripts:
        extra[f"{info}/entry_points.txt"] = (
            "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        ).encode()
    record = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f, arcname in files:
            data = f.read_bytes()
            zf.writestr(arcname, data)
            record.append(_record_line(arcname, data))
        for arcname, data in extra.items():
            zf.writestr(arcname, data)
            record.append(_record_line(arcname, data))
        zf.writestr(f"{info}/RECORD", "".join(record) + f"{info}/RECORD,,\n")
    return wheel


def repack_installed(dest: Path) -> Path:
    """A wheel of the installed kilocard distribution (its package files and metadata) in ``dest``."""
    dist = metadata.distribution("kilocard")
    files = [f for f in dist.files or [] if "__pycache__" not in f.parts and f.name not in INSTALL_ONLY]
    info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
    if info is None or not any(f.parts[0] == "kilocard" for f in files):
        raise PackageError(
            "launcher.packaging=snapshot: kilocard is neither a checkout nor an installed wheel; "
            "use launcher.packaging=image or none"
        )
    wheel = dest / f"kilocard-{dist.version}-py3-none-any.whl"
    names = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            if f.parts[0] in ("kilocard", info):
                zf.write(f.locate(), str(f))
                names.append(str(f))
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*names, f"{info}/RECORD"]))
    return wheel


def declared_requirements() -> list[str]:
    """kilocard's dependencies as declared: the checkout's pyproject.toml, else the installed metadata."""
    root = checkout_root()
    if root is not None:  # an editable install's metadata may predate the checkout's pyproject
        return list(tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"])
    return [r for r in metadata.requires("kilocard") or [] if "extra ==" not in r]


def pinned_requirements() -> list[str]:
    """kilocard's dependencies at this host's installed versions (``name==version``), one per line."""
    lines = []
    for req in declared_requirements():
        name = re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]
        try:
            lines.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"# {name}: not installed on the submit host (declared {req})")
    return lines


def mcore_range() -> tuple[str, str]:
    """The supported megatron-core range ``(lowest, first unsupported)`` as kilocard declares it."""
    req = next((r for r in declared_requirements() if r.startswith("megatron-core")), "")
    low, high = re.search(r">=\s*([\w.]+)", req), re.search(r"<\s*([\w.]+)", req)
    if low is None or high is None:
        raise PackageError(f"kilocard's metadata declares no megatron-core range (got {req!r}); reinstall kilocard")
    return low.group(1), high.group(1)


def write_snapshot(code_dir: Path) -> Path:
    """Build (or re-pack) kilocard's wheel into ``code_dir``, unpack it into ``code_dir/site``; the wheel."""
    code_dir.mkdir()
    root = checkout_root()
    wheel = pack_checkout(root, code_dir) if root is not None else repack_installed(code_dir)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(code_dir / SITE_DIR)
    (code_dir / REQUIREMENTS_FILE).write_text(
        f"# kilocard's dependencies as installed on the submit host ({wheel.name}); a record, not installed\n"
        + "\n".join(pinned_requirements())
        + "\n"
    )
    return wheel


def stage_code(run_dir: Path, packaging: str) -> None:
    """Put what the job runs into ``run_dir``: ``preflight.py`` always, the snapshot when asked for."""
    if packaging not in PACKAGING:
        raise PackageError(f"launcher.packaging: {packaging!r} is not one of {', '.join(PACKAGING)}")
    shutil.copy2(data_dir("slurm") / PREFLIGHT, run_dir / PREFLIGHT)
    if packaging == "snapshot":
        write_snapshot(run_dir / CODE_DIR)
