"""Resolve ``data.data_path`` entries (indexed-dataset prefixes, optionally weighted) and tokenizer files.

A relative prefix is looked up in the current directory first, then under kilocard's shipped
root: the folder that holds ``conf/`` (the repository in a source checkout, the installed
package in a wheel). Absolute prefixes are used as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kilocard.base.safe_read import FileReadError, require_regular
from kilocard.config.domains import choices
from kilocard.data.errors import DataError
from kilocard.paths import data_dir

DATA_TYPES = choices("data.type")
"""``data.type``: Megatron-Core's mock dataset, or indexed ``.bin``/``.idx`` files (``data.data_path``)."""


def _has_files(prefix: Path) -> bool:
    return Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()


def shipped_root() -> Path:
    """The folder that holds kilocard's shipped ``conf/`` (and ``data/`` in a source checkout)."""
    return data_dir("conf").parent


def _candidates(name: str) -> list[Path]:
    path = Path(name).expanduser()
    return [path] if path.is_absolute() else [Path.cwd() / path, shipped_root() / path]


def find_file(name: str) -> Path | None:
    """The file ``name`` (cwd first, then the shipped root), or None when neither has it; ``DataError`` naming what
    is there when it is no regular file (a FIFO, a socket, a directory where a file is meant: not "no such file")."""
    for c in _candidates(name):
        if c.is_file():
            return c.resolve()
        if not c.is_dir() and (c.is_symlink() or c.exists()):  # a folder (linked or not) is looked into elsewhere
            try:
                require_regular(c)
            except FileReadError as e:
                raise DataError(f"{e}; fix: the path of a regular file") from None
    return None


def resolve_data_prefix(prefix: str) -> str:
    """Absolute path prefix of the ``.bin/.idx`` pair named ``prefix``; ``DataError`` if absent."""
    candidates = _candidates(prefix)
    for candidate in candidates:
        if _has_files(candidate):
            return str(candidate.resolve())
    looked = " and ".join(f"{c}.bin/.idx" for c in candidates)
    raise DataError(
        f"data.data_path: {prefix!r} not found (looked for {looked}); "
        f"fix: build it with `kilocard preprocess --input FILE.jsonl --output-prefix P` "
        f"and pass P_text_document"
    )


def parse_blend(data_path: Sequence[str | float | int]) -> tuple[list[str], list[float] | None]:
    """Megatron's ``blend`` from ``data.data_path``: ``[p]``, ``[p1, p2]`` or ``[w1, p1, w2, p2]``, resolved."""
    prefixes, weights = split_blend(data_path)
    return [resolve_data_prefix(p) for p in prefixes], weights


def split_blend(data_path: Sequence[str | float | int]) -> tuple[list[str], list[float] | None]:
    """The prefixes (as given) and weights of ``data.data_path``; ``DataError`` when the form is wrong."""
    items = [str(x) for x in data_path]
    if not items:
        raise DataError("data.data_path: empty for data.type=indexed; fix: data.data_path=[PREFIX] or data=tiny_corpus")
    if not is_number(items[0]):
        numbers = [x for x in items if is_number(x)]
        if numbers:
            raise DataError(f"data.data_path: {items} mixes weights and prefixes; fix: [w1, p1, w2, p2] or [p1, p2]")
        return items, None
    if len(items) % 2:
        raise DataError(f"data.data_path: {items} has an odd number of entries; fix: weighted form [w1, p1, w2, p2]")
    weights, prefixes = items[0::2], items[1::2]
    for w, p in zip(weights, prefixes, strict=False):
        if not is_number(w) or is_number(p) or float(w) < 0:
            raise DataError(f"data.data_path: pair ({w!r}, {p!r}) is not (weight >= 0, prefix); fix: [w1, p1, w2, p2]")
    return prefixes, [float(w) for w in weights]


def is_number(text: str) -> bool:
    """Whether ``text`` reads as a number (a blend weight, not a prefix)."""
    try:
        float(text)
    except ValueError:
        return False
    return True
