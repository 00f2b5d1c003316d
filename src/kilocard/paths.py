"""Where kilocard's shipped data lives: ``conf/``, ``recipes/``, ``slurm/`` and ``baselines/``.

In an installed wheel they sit inside the package (``kilocard/conf`` ...); in a source checkout
(editable install) they are the repository's top-level folders.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

#: Longest run directory name kilocard creates: file systems allow 255 bytes per name, less the
#: temporary name's ``.`` prefix and ``.tmp-<pid>`` suffix and a ``-NNN`` suffix for automatic names.
MAX_NAME_BYTES = 200

_PKG = Path(__file__).resolve().parent
_REPO = _PKG.parent.parent


def checkout_root() -> Path | None:
    """The source checkout kilocard is imported from (``<root>/src/kilocard``), or ``None`` if installed."""
    pyproject = _REPO / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    return _REPO if project.get("name") == "kilocard" else None


def data_dir(name: str) -> Path:
    """Return the shipped folder ``name`` (``conf``, ``recipes``, ``slurm`` or ``baselines``)."""
    for base in (_PKG, _REPO):
        candidate = base / name
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"kilocard data folder {name!r} not found in {_PKG} or {_REPO}")


def cache_dir() -> Path:
    """Where kilocard caches what it computed (the recipe table, site refits): ``KILOCARD_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/kilocard``, else ``~/.cache/kilocard``."""
    if os.environ.get("KILOCARD_CACHE_DIR"):
        return Path(os.environ["KILOCARD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kilocard"
