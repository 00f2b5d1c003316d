"""Real virtual environments for tests of what a job finds on its nodes.

``venv_without(tmp, exclude)`` makes a venv whose site-packages links every entry of kilocard's own
``.venv`` except those whose name starts with one of ``exclude`` (e.g. ``megatron`` drops
megatron-core, ``_kilocard``/``kilocard`` drops the editable kilocard): a real interpreter with a
real, smaller set of packages, the way a site venv lacking a dependency looks.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def site_packages(venv: Path) -> Path:
    """``venv/lib/pythonX.Y/site-packages``."""
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def venv_without(tmp: Path, exclude: tuple[str, ...]) -> Path:
    """A venv under ``tmp`` with kilocard's packages minus ``exclude`` (name prefixes); returns its root."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    src, dst = site_packages(Path(sys.prefix)), site_packages(venv)
    for entry in src.iterdir():
        name = entry.name.lower()
        if any(name.startswith(p) for p in exclude) or name.startswith("__editable__"):
            continue
        link = dst / entry.name
        if not link.exists():
            link.symlink_to(entry)
    return venv
