"""Every file kilocard reads comes through here: regular files only, bounded, strictly decoded, shape-checked.

A path named like a config, a log or a checkpoint file may be anything: a FIFO (reading it waits for a
writer that never comes), a directory, a broken symlink, a device, ``/proc``, a 10 GB file, binary
junk, or a secret (``~/.netrc``, an SSH key, a ``.env``) given by mistake. So every read here:

* opens without blocking (``O_NONBLOCK``: a FIFO opens at once) and accepts only a regular file
  (``fstat`` of the open descriptor, so the check and the read see the same file); a symlink to a
  regular file in its own folder is fine, and so is a Hugging Face cache's link from a snapshot to its
  repository's blobs, but a symlink that leaves its folder is refused (a model folder's
  ``tokenizer_config.json`` linked to ``~/.netrc`` would be read, and copied into a checkpoint);
* refuses a file larger than the caller's bound before reading it, and reads at most that bound;
* decodes UTF-8 strictly, reporting the first bad byte's offset;
* parses JSON/YAML safely and checks the top-level shape (``expect``), with ``require_field`` for the rest;
* raises ``FileReadError``: one line naming the file and what is wrong, never the file's content
  (no line of it, no snippet of a parser's context).

The few places that stream large binaries (safetensors shards, dataset ``.bin``/``.idx`` files) open
them with ``open_regular`` or check them with ``require_regular``; ``tests/base/test_safe_read.py``
fails when a raw read appears anywhere else in ``src/``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import yaml

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

TEXT_LIMIT = 64 * MiB
"""The default bound of a text file (config, JSON, tokenizer file; a Llama 3 tokenizer.json is 9 MiB)."""
RECORDS_LIMIT = 4 * GiB
"""The bound of a run's record files (``metrics.jsonl``, ``events.jsonl``): a million steps fit."""
LINE_LIMIT = 1 * MiB
"""The bound of one line of a record file (a record is a few hundred bytes): a longer one is damage."""
_CHUNK = 1 * MiB

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
_TYPE_NAMES = {
    dict: "a mapping",
    list: "a list",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


class FileReadError(Exception):
    """A file that cannot be read safely: one line naming the file and why, never its content."""

    def __init__(self, path: str | os.PathLike[str], what: str, fix: str = ""):
        self.path = str(path)
        super().__init__(f"{self.path}: {what}" + (f"; {fix}" if fix else ""))


def type_name(value: object) -> str:
    """``a mapping``, ``a list``, ``null`` ...: what a parsed value is, without the value."""
    if value is None:
        return "null"
    for t, name in _TYPE_NAMES.items():
        if type(value) is t:
            return name
    return type(value).__name__


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _open_fd(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        what = "is a broken symlink" if path.is_symlink() else "does not exist"
        raise FileReadError(path, what) from None
    except NotADirectoryError:
        raise FileReadError(path, "does not exist (a parent is not a directory)") from None
    except OSError as e:
        raise FileReadError(path, f"cannot be opened ({e.strerror or type(e).__name__})") from None


def _hf_blob(real: str, folder: str) -> bool:
    """Whether ``real`` is a blob of the Hugging Face cache repository whose snapshot holds ``folder``
    (``<repo>/snapshots/<revision>/...`` links its files to ``<repo>/blobs/<hash>``)."""
    parts = Path(folder).parts
    if "snapshots" not in parts:
        return False
    repo = Path(*parts[: len(parts) - parts[::-1].index("snapshots") - 1])
    return Path(real).parent == repo / "blobs"


def _refuse_leaving_symlink(p: Path) -> None:
    """A symlink whose target lies outside the folder it sits in (a ``tokenizer_config.json`` linked to
    ``~/.netrc``) is refused: a folder given to kilocard means its files. The Hugging Face cache's links
    from a snapshot to its repository's blobs are the one exception."""
    if not p.is_symlink() or p.is_dir():
        return  # a linked folder is a folder: its files are judged against it
    real, folder = os.path.realpath(p), os.path.realpath(p.parent)
    if Path(real).is_relative_to(folder) or _hf_blob(real, folder):
        return
    raise FileReadError(
        p, f"is a symlink to a file outside its folder {folder}", "copy the file into the folder, or name it directly"
    )


def open_regular(path: str | os.PathLike[str], limit: int | None = TEXT_LIMIT) -> IO[bytes]:
    """Open ``path`` for binary reading when it is a regular file of at most ``limit`` bytes
    (``None``: any size, for streamed binaries) and not a symlink that leaves its folder; ``FileReadError``
    otherwise. Never blocks on a FIFO."""
    p = Path(path)
    fd = _open_fd(p)
    try:
        _refuse_leaving_symlink(p)
    except BaseException:
        os.close(fd)
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileReadError(p, f"is {_kind(st.st_mode)}, not a regular file")
        if limit is not None and st.st_size > limit:
            raise FileReadError(p, f"is {st.st_size} bytes, more than the {limit} bytes such a file may hold")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def require_regular(path: str | os.PathLike[str]) -> Path:
    """``path`` when it is a regular file (for readers that open it themselves, like memory maps)."""
    open_regular(path, limit=None).close()
    return Path(path)


def is_regular(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a readable regular file (no error: for optional files)."""
    try:
        require_regular(path)
    except FileReadError:
        return False
    return True


def read_bytes(path: str | os.PathLike[str], limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes."""
    with open_regular(path, limit) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise FileReadError(path, f"cannot be read ({e.strerror or type(e).__name__})") from None
    if len(data) > limit:
        raise FileReadError(path, f"grew past the {limit} bytes such a file may hold while it was read")
    return data


def read_lines(
    path: str | os.PathLike[str], limit: int = RECORDS_LIMIT, line_limit: int = LINE_LIMIT
) -> Iterator[tuple[int, str | None]]:
    """``(n, text)`` of each whole line of a regular file of at most ``limit`` bytes, streamed: a record file
    is never held whole in memory. Bad UTF-8 is replaced (the reader judges the line); a line longer than
    ``line_limit`` bytes is ``(n, None)`` and is never buffered; the text after the last newline (a write
    never finished) is not a line."""
    with open_regular(path, limit) as f:
        n, seen, buf, over = 0, 0, bytearray(), False
        while chunk := _chunk(f, path):
            seen += len(chunk)
            if seen > limit:
                raise FileReadError(path, f"grew past the {limit} bytes such a file may hold while it was read")
            *whole, tail = chunk.split(b"\n")
            for part in whole:
                n += 1
                long = over or len(buf) + len(part) > line_limit
                yield n, None if long else (bytes(buf) + part).decode("utf-8", errors="replace")
                buf, over = bytearray(), False
            over = over or len(buf) + len(tail) > line_limit
            buf = bytearray() if over else buf + tail


def _chunk(f: IO[bytes], path: str | os.PathLike[str]) -> bytes:
    try:
        return f.read(_CHUNK)
    except OSError as e:
        raise FileReadError(path, f"cannot be read ({e.strerror or type(e).__name__})") from None


def read_tail(path: str | os.PathLike[str], most: int) -> str:
    """The last ``most`` bytes of a regular file (a log of any size) as text, bad UTF-8 replaced."""
    with open_regular(path, limit=None) as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - most))
        return f.read(most).decode("utf-8", errors="replace")


def decode(path: str | os.PathLike[str], data: bytes, errors: str = "strict") -> str:
    """``data`` as UTF-8; ``FileReadError`` naming the offset of the first byte that is not (with
    ``errors="replace"``: U+FFFD for it, for record files whose bad lines the reader skips)."""
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise FileReadError(path, f"is not UTF-8 text (bad byte at offset {e.start})", "save it as UTF-8") from None


def read_text(path: str | os.PathLike[str], limit: int = TEXT_LIMIT, errors: str = "strict") -> str:
    """The text of a regular UTF-8 file of at most ``limit`` bytes."""
    return decode(path, read_bytes(path, limit), errors)


def expect_shape(path: str | os.PathLike[str], value: Any, expect: type | tuple[type, ...], what: str = "") -> Any:
    """``value`` when it is of type ``expect`` (``bool`` is not an ``int`` here); else ``FileReadError``
    naming ``what`` (a field, or the whole file) and the type found, never the value."""
    types = expect if isinstance(expect, tuple) else (expect,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        wanted = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        raise FileReadError(path, f"{what or 'the file'} holds {type_name(value)}, expected {wanted}")
    return value


def require_field(path: str | os.PathLike[str], doc: dict[str, Any], key: str, expect: type | tuple[type, ...]) -> Any:
    """``doc[key]`` checked against ``expect`` (``FileReadError`` when missing or of another type)."""
    if key not in doc:
        raise FileReadError(path, f"has no field {key!r}")
    return expect_shape(path, doc[key], expect, f"field {key!r}")


def parse_json(path: str | os.PathLike[str], text: str, expect: type | tuple[type, ...] = dict) -> Any:
    """``text`` (the content of ``path``) as JSON of type ``expect``; errors name the line, not the text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise FileReadError(f"{path}:{e.lineno}", f"not valid JSON ({e.msg})", "fix or replace the file") from None
    except RecursionError:
        raise FileReadError(path, "not usable JSON (nested too deeply)") from None
    return expect_shape(path, value, expect)


def read_json(path: str | os.PathLike[str], expect: type | tuple[type, ...] = dict, limit: int = TEXT_LIMIT) -> Any:
    """A JSON file whose top level is of type ``expect``."""
    return parse_json(path, read_text(path, limit), expect)


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def yaml_problem(e: yaml.YAMLError) -> tuple[str, str]:
    """``(":LINE", problem)`` of a YAML error, with quoted snippets of the file removed from the problem."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or type(e).__name__
    return line, _QUOTED.sub("...", str(problem))


def read_yaml(path: str | os.PathLike[str], expect: type | tuple[type, ...] = dict, limit: int = TEXT_LIMIT) -> Any:
    """A YAML file (safe loading) whose top level is of type ``expect``."""
    text = read_text(path, limit)
    try:
        value = yaml.load(text, Loader=_LOADER)  # noqa: S506 - the C safe loader
    except yaml.YAMLError as e:
        line, problem = yaml_problem(e)
        raise FileReadError(f"{path}{line}", f"not valid YAML ({problem})", "fix the file") from None
    except RecursionError:
        raise FileReadError(path, "not usable YAML (nested too deeply)") from None
    return expect_shape(path, value, expect)


__all__ = [
    "LINE_LIMIT",
    "GiB",
    "MiB",
    "RECORDS_LIMIT",
    "TEXT_LIMIT",
    "FileReadError",
    "decode",
    "expect_shape",
    "require_field",
    "is_regular",
    "open_regular",
    "parse_json",
    "read_bytes",
    "read_json",
    "read_lines",
    "read_tail",
    "read_text",
    "read_yaml",
    "require_regular",
    "type_name",
]
