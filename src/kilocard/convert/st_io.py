"""Streaming safetensors I/O of a Hugging Face model directory: one tensor in memory at a time.

Reading goes shard by shard through ``model.safetensors.index.json`` (or the single
``model.safetensors``); headers (names, shapes, dtypes) are read before any tensor data. Writing
groups tensors into shards of at most ``max_shard_bytes`` and writes the index the way
``transformers.save_pretrained`` does.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from kilocard.base.safe_read import (
    FileReadError,
    expect_shape,
    is_regular,
    read_json,
    require_regular,
    type_name,
)
from kilocard.convert import fp8
from kilocard.convert.maps import ConvertError, ConvertUsageError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG = "config.json"

_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
"""safetensors dtype codes of floating-point weights kilocard can hold."""


@dataclass(frozen=True)
class Header:
    """Name, shape and dtype code of one stored tensor, and the shard file holding it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    file: Path


#: The ``config.json`` fields kilocard reads and the types each may hold (``None``: absent or null).
CONFIG_SHAPE: dict[str, tuple[type, ...]] = {
    "model_type": (str,),
    "num_attention_heads": (int, type(None)),
    "num_key_value_heads": (int, type(None)),
    "hidden_size": (int, type(None)),
    "head_dim": (int, type(None)),
    "rope_theta": (int, float, type(None)),
    "rope_scaling": (dict, type(None)),
    "rope_parameters": (dict, type(None)),
}


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file through the safe reader (``ConvertUsageError`` naming the file otherwise)."""
    try:
        return read_json(path, dict)
    except FileReadError as e:
        raise ConvertUsageError(str(e)) from None


def read_config(hf_dir: Path) -> dict:
    """``config.json`` of a Hugging Face model directory, its fields checked against ``CONFIG_SHAPE``."""
    path = hf_dir / CONFIG
    if not path.exists() and not path.is_symlink():
        raise ConvertUsageError(f"{hf_dir}: no {CONFIG}; expected a Hugging Face model directory (save_pretrained)")
    doc = _read_json(path)
    for key, types in CONFIG_SHAPE.items():
        if key == "model_type" or key in doc:
            try:
                expect_shape(path, doc.get(key), types, f"field {key!r}")
            except FileReadError as e:
                raise ConvertUsageError(str(e)) from None
    return doc


def inside(hf_dir: Path, name: object, index: Path) -> Path:
    """The shard ``name`` of the index, when it is a file name inside ``hf_dir`` (a path that leaves the
    model directory, ``../../etc/passwd``, is refused; the name is not echoed past 80 characters)."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        shown = repr(name)[:80] if isinstance(name, str) else type_name(name)
        raise ConvertUsageError(f"{index}: weight_map names {shown}, not a shard file inside {hf_dir}")
    path = hf_dir / name
    if not path.resolve().is_relative_to(hf_dir.resolve()):
        raise ConvertUsageError(f"{index}: weight_map entry {name!r} leads outside {hf_dir} (a symlink)")
    return path


def shard_files(hf_dir: Path) -> list[Path]:
    """The safetensors files of the model, in index order (each a regular file inside ``hf_dir``)."""
    index = hf_dir / INDEX
    if index.exists() or index.is_symlink():
        doc = _read_json(index)
        if not isinstance(doc.get("weight_map"), dict):
            raise ConvertUsageError(
                f"{index}: field 'weight_map' holds {type_name(doc.get('weight_map'))}, expected a mapping"
            )
        files = [inside(hf_dir, f, index) for f in dict.fromkeys(doc["weight_map"].values())]
        missing = [f.name for f in files if not is_regular(f)]
        if missing:
            raise ConvertUsageError(
                f"{index}: shard file(s) {', '.join(missing)} are missing from {hf_dir} (or not regular files)"
            )
        return files
    if (hf_dir / SINGLE).exists():
        return [hf_dir / SINGLE]
    raise ConvertUsageError(f"{hf_dir}: neither {INDEX} nor {SINGLE}; only safetensors weights are read")


@contextlib.contextmanager
def _shard(f: Path) -> Iterator[Any]:
    """A shard opened with safetensors after the safe reader's regular-file check; a truncated or
    foreign file is a ``ConvertUsageError`` naming it."""
    try:
        require_regular(f)
    except FileReadError as e:
        raise ConvertUsageError(str(e)) from None
    try:
        with safe_open(str(f), framework="pt") as s:
            yield s
    except SafetensorError as e:
        reason = str(e).split(":")[-1].strip()[:80] or type(e).__name__
        raise ConvertUsageError(
            f"{f}: not a readable safetensors file ({reason}); the download is truncated or damaged"
        ) from None


def headers(files: list[Path]) -> dict[str, Header]:
    """Every tensor's header, read without loading data; a tensor stored twice is refused."""
    out: dict[str, Header] = {}
    for f in files:
        with _shard(f) as s:
            for name in s.keys():
                if name in out:
                    raise ConvertError(f"{f}: tensor {name} is stored again (first in {out[name].file.name})")
                sl = s.get_slice(name)
                out[name] = Header(name, tuple(sl.get_shape()), sl.get_dtype(), f)
    return out


def torch_dtype(h: Header) -> torch.dtype:
    """The torch dtype of a stored tensor; quantized or integer weights are refused."""
    if h.dtype not in _DTYPES:
        raise ConvertError(
            f"{h.file.name}: tensor {h.name} is {h.dtype}; kilocard holds float32, bfloat16 or float16 weights "
            "(dequantize the model first)"
        )
    return _DTYPES[h.dtype]


def stream(
    files: list[Path],
    names: set[str],
    scales: dict[str, Header] | None = None,
    block: tuple[int, int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for the tensors in ``names``, shard by shard, one tensor at a time; a weight with a
    block scale in ``scales`` (``fp8.dequantized_headers``) dequantized to float32 with its ``block`` size.

    A tensor holding NaN or an infinity is refused: imported weights must be finite (a training run
    from them would produce NaN losses from the first step)."""
    for f in files:
        with _shard(f) as s:
            for name in s.keys():
                if name in names:
                    t = s.get_tensor(name)
                    if scales and block and name in scales:
                        t = fp8.dequantize(t, tensor(scales[name]), block)
                    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                        raise ConvertError(
                            f"{f.name}: tensor {name} holds NaN or infinite values; refusing to import "
                            "weights that are not finite (re-download or re-export the model)"
                        )
                    yield name, t


def tensor(h: Header) -> torch.Tensor:
    """The one stored tensor of header ``h``."""
    with _shard(h.file) as s:
        return s.get_tensor(h.name)


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``20KB`` or a byte count -> bytes (decimal units, as transformers)."""
    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    t = text.strip().upper()
    for unit, scale in units.items():
        if t.endswith(unit) and t[: -len(unit)].strip().isdigit():
            return int(t[: -len(unit)]) * scale
    if t.isdigit():
        return int(t)
    raise ConvertUsageError(f"--max-shard-size: {text!r} is not a size (expected e.g. 5GB, 500MB or a byte count)")


def file_mode() -> int:
    """The mode a new file gets from this process's umask (``0o644`` under the usual ``022``)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.torch.save_file`` with the mode any other output gets: safetensors writes through a
    private temporary file (mode 0600), so the weights would be readable by their owner only."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    os.chmod(path, file_mode())


def write_sharded(
    out_dir: Path,
    names: list[str],
    produce: Callable[[str], torch.Tensor],
    shape_of: Callable[[str], tuple],
    itemsize: int,
    max_shard_bytes: int,
) -> list[Path]:
    """Write the tensors ``names`` (made one at a time by ``produce``) into shards plus an index.

    One shard is ``model.safetensors`` without an index, as ``save_pretrained`` writes it.
    """
    groups: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = itemsize * _numel(shape_of(n))
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += nbytes
    total = len(groups)
    files = [SINGLE] if total == 1 else [f"model-{i + 1:05d}-of-{total:05d}.safetensors" for i in range(total)]
    for fname, group in zip(files, groups, strict=True):
        save_tensors({n: produce(n) for n in group}, out_dir / fname)
    if total > 1:
        weight_map = {n: f for f, group in zip(files, groups, strict=True) for n in group}
        index = {
            "metadata": {"total_size": sum(itemsize * _numel(shape_of(n)) for n in names)},
            "weight_map": weight_map,
        }
        (out_dir / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [out_dir / f for f in files]


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
