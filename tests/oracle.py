"""The reference oracle: Megatron-LM's own formulas from the megatron-core 0.19.2 wheel in ``.oracle/``.

``scripts/install_oracle.sh`` (called by ``scripts/setup.sh``) installs that wheel apart from the
pinned megatron-core 0.16.1. Its ``megatron.training`` package imports all of megatron-core 0.19,
which cannot load beside 0.16.1 in one process, so ``load_megatron_training_module(name)`` reads
``megatron/training/<name>.py`` with ``ast`` and executes only its top-level functions, classes and
constants, the standard-library imports they use, and the functions it imports from sibling
``megatron.training`` files (extracted the same way, recursively). Anything else a function
reaches for is absent, so such a call fails loudly with ``NameError`` rather than passing quietly.
"""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ORACLE_DIR = Path(__file__).resolve().parent.parent / ".oracle"
TRAINING_DIR = ORACLE_DIR / "megatron" / "training"
ORACLE_VERSION = "0.19.2"


def oracle_available() -> bool:
    """True when ``.oracle/`` holds megatron-core's ``megatron/training`` sources."""
    return (TRAINING_DIR / "theoretical_memory_usage.py").is_file()


def _module_file(dotted: str, package: str) -> Path | None:
    """File of a ``megatron.training`` module named absolutely or relative to ``package``."""
    if dotted.startswith("."):
        level = len(dotted) - len(dotted.lstrip("."))
        base = package.split(".")[: len(package.split(".")) - level + 1]
        dotted = ".".join(base + ([dotted.lstrip(".")] if dotted.lstrip(".") else []))
    if not dotted.startswith("megatron.training"):
        return None
    parts = dotted.split(".")[2:]
    cands = [TRAINING_DIR.joinpath(*parts[:-1], parts[-1] + ".py")] if parts else []
    for cand in cands + [TRAINING_DIR.joinpath(*parts, "__init__.py")]:
        if cand.is_file():
            return cand
    return None


def _package_of(path: Path) -> str:
    rel = path.relative_to(ORACLE_DIR).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts if parts[-1] == "__init__" and parts.pop() is not None else parts[:-1])


def _definitions(path: Path, wanted: set[str] | None, ns: dict[str, object], seen: set[tuple]) -> None:
    """Execute ``wanted`` (or all) top-level definitions of ``path`` into ``ns``, imports resolved.

    Only the imports that bind a name the kept definitions use are resolved (recursively).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package_of(path)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign))]
    keep = [n for n in defs if wanted is None or _bound_names(n) & wanted]
    used = {x.id for n in keep for x in ast.walk(n) if isinstance(x, ast.Name)}
    if wanted is not None:  # constants the kept definitions read
        keep = [
            n
            for n in defs
            if n in keep or (not isinstance(n, (ast.FunctionDef, ast.ClassDef)) and _bound_names(n) & used)
        ]
        used |= {x.id for n in keep for x in ast.walk(n) if isinstance(x, ast.Name)}
    for node in imports:
        bound = {(a.asname or a.name).split(".")[0] for a in node.names}
        if bound & used:
            _resolve_import(node, package, ns, seen)
    for node in keep:
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), ns)
        except Exception as e:  # a definition built from a dropped import: recorded, never used
            if wanted is not None and _bound_names(node) & wanted:
                raise
            ns.setdefault("__oracle_skipped__", {}).update({n: repr(e) for n in _bound_names(node)})


def _bound_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _resolve_import(node: ast.AST, package: str, ns: dict[str, object], seen: set[tuple]) -> None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in sys.stdlib_module_names:
                ns[alias.asname or top] = (
                    __import__(alias.name)
                    if alias.asname is None
                    else sys.modules.get(alias.name) or __import__(alias.name, fromlist=["_"])
                )
        return
    assert isinstance(node, ast.ImportFrom)
    mod = "." * node.level + (node.module or "")
    top = (node.module or "").split(".")[0]
    if node.level == 0 and top in sys.stdlib_module_names and top != "__future__":
        m = __import__(node.module, fromlist=["_"])
        for alias in node.names:
            if hasattr(m, alias.name):
                ns[alias.asname or alias.name] = getattr(m, alias.name)
        return
    src = _module_file(mod, package)
    if src is None:
        return
    for alias in node.names:
        key = (str(src), alias.name)
        if key in seen:
            continue
        seen.add(key)
        sub: dict[str, object] = {"__name__": f"oracle.{alias.name}"}
        try:
            _definitions(src, {alias.name}, sub, seen)
        except Exception:  # not loadable without megatron-core 0.19: the name stays absent
            continue
        if alias.name in sub:
            ns[alias.asname or alias.name] = sub[alias.name]


@cache
def _load(name: str, only: frozenset[str] | None) -> types.ModuleType:
    path = TRAINING_DIR / f"{name.replace('.', '/')}.py"
    if not path.is_file():
        raise FileNotFoundError(f"oracle has no megatron/training/{name}.py under {ORACLE_DIR}")
    mod = types.ModuleType(f"oracle.megatron.training.{name}")
    mod.__file__ = str(path)
    _definitions(path, set(only) if only else None, mod.__dict__, set())
    return mod


def load_megatron_training_module(name: str, only: Iterable[str] | None = None) -> types.ModuleType:
    """``megatron.training.<name>`` of megatron-core 0.19.2; skip the test if the oracle is absent.

    ``only`` names the functions to load (what they use comes along); without it every top-level
    definition that loads without megatron-core 0.19 is there. For ``training`` (which imports
    all of megatron-core) pass ``only=["num_floating_point_operations"]``.
    """
    if not oracle_available():
        import pytest

        pytest.skip(
            f"the megatron-core {ORACLE_VERSION} oracle is not installed in {ORACLE_DIR} "
            "(run scripts/install_oracle.sh)"
        )
    return _load(name, frozenset(only) if only else None)
