"""Streaming safetensors I/O of a Hugging Face model directory: one tensor in memory at a time.

Reading goes shard by shard through ``model.safetensors.index.json`` (or the single
``model.safetensors``); headers (names, shapes, dtypes) are read before any tensor data. Writing
groups tensors into shards of at most ``max_shard_bytes`` and writes the index the way
``transformers.save_pretrained`` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from kilocard.convert.maps import ConvertError

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


def read_config(hf_dir: Path) -> dict:
    """``config.json`` of a Hugging Face model directory."""
    path = hf_dir / CONFIG
    if not path.is_file():
        raise ConvertError(f"{hf_dir}: no {CONFIG}; expected a Hugging Face model directory (save_pretrained)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConvertError(f"{path}: not valid JSON ({e})") from None


def shard_files(hf_dir: Path) -> list[Path]:
    """The safetensors files of the model, in index order."""
    index = hf_dir / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = list(dict.fromkeys(weight_map.values()))
        missing = [f for f in files if not (hf_dir / f).is_file()]
        if missing:
            raise ConvertError(f"{index}: shard file(s) {', '.join(missing)} are missing from {hf_dir}")
        return [hf_dir / f for f in files]
    if (hf_dir / SINGLE).is_file():
        return [hf_dir / SINGLE]
    raise ConvertError(f"{hf_dir}: neither {INDEX} nor {SINGLE}; only safetensors weights are read")


def headers(files: list[Path]) -> dict[str, Header]:
    """Every tensor's header, read without loading data; a tensor stored twice is refused."""
    out: dict[str, Header] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as s:
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


def stream(files: list[Path], names: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for the tensors in ``names``, shard by shard, one tensor at a time."""
    for f in files:
        with safe_open(str(f), framework="pt") as s:
            for name in s.keys():
                if name in names:
                    yield name, s.get_tensor(name)


def parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``20KB`` or a byte count -> bytes (decimal units, as transformers)."""
    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    t = text.strip().upper()
    for unit, scale in units.items():
        if t.endswith(unit) and t[: -len(unit)].strip().isdigit():
            return int(t[: -len(unit)]) * scale
    if t.isdigit():
        return int(t)
    raise ConvertError(f"--max-shard-size: {text!r} is not a size (expected e.g. 5GB, 500MB or a byte count)")


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
        save_file({n: produce(n) for n in group}, str(out_dir / fname), metadata={"format": "pt"})
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
