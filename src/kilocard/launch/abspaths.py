"""Every path of a config made absolute before it is frozen into a run directory.

A relative path means "from where I ran the command". Frozen as it is, it would later be read
from wherever the ranks happen to run: torchrun's ranks inherit the cwd of whoever resumes, and the
batch script ``cd``\\ s into the run directory. A relative ``checkpoint.save`` then points to an empty
directory on resume, and the run silently trains from step 0 over its own metrics. So each path is
resolved against the submitting command's cwd once, when the run directory is written.

Data prefixes and a tokenizer file follow the trainer's own lookup (``kilocard.data.paths``): the
cwd first, then kilocard's shipped root (a prefix found in neither is taken as under the cwd, a
tokenizer is left as typed: the rank's error names it); ``~`` is expanded everywhere.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from kilocard.data.paths import is_number
from kilocard.paths import data_dir

PATH_FIELDS = (
    "checkpoint.save",
    "checkpoint.load",
    "data.path_to_cache",
    "cluster.shared_fs",
    "cluster.venv",
)
"""Directory fields: relative values are resolved against the cwd."""
BUILTIN_TOKENIZERS = ("kilocard-bytes",)
"""``data.tokenizer`` values that are names, not files (``kilocard.data.tokenizer.TOKENIZERS``)."""


def absolute(path: str, cwd: Path) -> str:
    """``path`` with ``~`` expanded, made absolute against ``cwd`` and normalised (no symlinks followed)."""
    return os.path.normpath(cwd / Path(path).expanduser())


def _found(path: str, cwd: Path, exists: Callable[[str], bool]) -> str | None:
    """Absolute ``path`` under ``cwd`` when ``exists`` there, else under the shipped root when there, else None."""
    for base in (cwd, data_dir("conf").parent):
        candidate = absolute(path, base)
        if exists(candidate):
            return candidate
    return None


def _has_pair(prefix: str) -> bool:
    return Path(f"{prefix}.bin").is_file() and Path(f"{prefix}.idx").is_file()


def absolute_paths(cfg: DictConfig, cwd: Path) -> DictConfig:
    """A copy of ``cfg`` whose path fields (``PATH_FIELDS``, data prefixes, a tokenizer file) are absolute."""
    out = copy.deepcopy(cfg)
    for dotted in PATH_FIELDS:
        value = OmegaConf.select(out, dotted)
        if value:
            OmegaConf.update(out, dotted, absolute(str(value), cwd))
    data = out.data
    data.data_path = [
        item if is_number(str(item)) else _found(str(item), cwd, _has_pair) or absolute(str(item), cwd)
        for item in data.data_path
    ]
    if data.tokenizer not in BUILTIN_TOKENIZERS:  # a file; left as typed when none exists (the rank names it)
        data.tokenizer = _found(str(data.tokenizer), cwd, os.path.isfile) or data.tokenizer
    return out
