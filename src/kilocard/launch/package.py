"""Code delivery of a Slurm job (``launcher.packaging``): where the job's ``python`` finds kilocard.

* ``snapshot`` (default): at sbatch time, kilocard's own wheel is built into ``<run_dir>/code/`` and
  unpacked (pure Python, what ``pip install --target`` does) into ``<run_dir>/code/site``, which the
  batch script puts first on ``PYTHONPATH``. The wheel comes from the checkout kilocard was imported
  from (``pip wheel --no-deps --no-build-isolation``, ~4 s, reused within one command while the
  sources are unchanged: a sweep builds once) or, when kilocard was installed from a wheel, is
  re-packed from the installed files. ``code/requirements.txt`` pins the dependencies at the submit
  host's versions (a record: the job takes them from its venv or image). Editing or deleting the
  checkout later never changes what the job (or a requeue of it) runs.
* ``image``: the profile's ``container_image`` was built by ``kilocard image`` and holds kilocard.
* ``none``: the job's environment already provides kilocard.

In every mode the run directory gets ``preflight.py`` (``slurm/preflight.py``), which the job runs on
every node before training.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from kilocard.base.safe_read import read_bytes
from kilocard.config.schema import PACKAGING_MODES
from kilocard.launch.rundir import RunDirError
from kilocard.paths import checkout_root, data_dir, pyproject_of, shipped_sources

PACKAGING = PACKAGING_MODES
CODE_DIR = "code"
SITE_DIR = "site"
REQUIREMENTS_FILE = "requirements.txt"
PREFLIGHT = "preflight.py"
#: Seconds a wheel build may take (measured ~4 s on 2 busy cores).
BUILD_TIMEOUT_S = 300
#: Files of an installed dist-info that describe the installation, not the package.
INSTALL_ONLY = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


class PackageError(RunDirError):
    """kilocard's code cannot be packaged into the run directory."""


#: Wheels built by this process, by checkout and source fingerprint: a sweep builds once.
_BUILT: dict[tuple[str, int], tuple[str, bytes]] = {}


def source_fingerprint(root: Path) -> int:
    """Hash of (path, mtime, size) of every file the wheel is built from (pyproject's hatch sources)."""
    files = []
    for rel in shipped_sources(root):
        top = root / rel
        for f in sorted(top.rglob("*")) if top.is_dir() else [top]:
            if f.is_file() and "__pycache__" not in f.parts:
                st = f.stat()
                files.append((str(f), st.st_mtime_ns, st.st_size))
    return hash(tuple(files))


def checkout_wheel(root: Path, dest: Path) -> Path:
    """``build_wheel``, reusing this process's last build while the checkout's sources are unchanged."""
    key = (str(root), source_fingerprint(root))
    if key not in _BUILT:
        with tempfile.TemporaryDirectory(prefix="kilocard-wheel-") as tmp:
            built = build_wheel(root, Path(tmp))
            _BUILT.clear()
            _BUILT[key] = (built.name, read_bytes(built, limit=1 << 30))
    name, data = _BUILT[key]
    (dest / name).write_bytes(data)
    return dest / name


def build_wheel(root: Path, dest: Path) -> Path:
    """``pip wheel`` of the checkout ``root`` into ``dest`` (no dependencies, no download); the wheel's path."""
    with tempfile.TemporaryDirectory(prefix="kilocard-wheel-") as tmp:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp, str(root)],
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                env={**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            )
        except subprocess.TimeoutExpired:
            raise PackageError(
                f"launcher.packaging=snapshot: building the wheel of {root} took over {BUILD_TIMEOUT_S} s"
            ) from None
        wheels = sorted(Path(tmp).glob("kilocard-*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            last = (proc.stderr.strip().splitlines() or ["no wheel written"])[-1]
            raise PackageError(
                f"launcher.packaging=snapshot: cannot build the wheel of {root} ({last}); fix the checkout "
                f"or use launcher.packaging=image/none"
            )
        return Path(shutil.copy2(wheels[0], dest / wheels[0].name))


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
        return list(pyproject_of(root)["project"]["dependencies"])
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
    wheel = checkout_wheel(root, code_dir) if root is not None else repack_installed(code_dir)
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
