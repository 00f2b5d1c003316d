"""The safe reader (``kilocard.base.safe_read``): regular files only, bounded, decoding errors as one
line with the byte offset, shapes checked, no content echoed; and no raw read anywhere else in src/.

Real files of every kind (FIFO, directory, broken symlink, character device, binary junk); no mocks.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from bad_files import SECRET, finishes
from kilocard.base.safe_read import (
    FileReadError,
    is_regular,
    open_regular,
    read_bytes,
    read_json,
    read_tail,
    read_text,
    read_yaml,
    require_field,
    require_regular,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "kilocard"


@pytest.fixture
def odd_files(tmp_path):
    """Paths named like config files that are not regular files."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    (tmp_path / "dir.yaml").mkdir()
    (tmp_path / "broken.yaml").symlink_to(tmp_path / "nowhere")
    return {
        "fifo": (fifo, "is a FIFO (named pipe), not a regular file"),
        "dir": (tmp_path / "dir.yaml", "is a directory, not a regular file"),
        "broken": (tmp_path / "broken.yaml", "is a broken symlink"),
        "device": (Path("/dev/null"), "is a character device, not a regular file"),
        "missing": (tmp_path / "none.yaml", "does not exist"),
    }


@pytest.mark.parametrize("kind", ["fifo", "dir", "broken", "device", "missing"])
def test_only_regular_files_are_read_and_a_fifo_never_blocks(kind, odd_files):
    path, why = odd_files[kind]
    out = finishes(lambda: read_text(path))
    assert isinstance(out.get("error"), FileReadError)
    assert str(out["error"]) == f"{path}: {why}"


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    """Hugging Face caches keep their files as symlinks to blobs."""
    (tmp_path / "blob").write_text("a: 1\n")
    (tmp_path / "link.yaml").symlink_to(tmp_path / "blob")
    assert read_yaml(tmp_path / "link.yaml") == {"a": 1}


@pytest.mark.parametrize("reader", [read_text, read_bytes, require_regular, is_regular])
def test_a_symlink_that_leaves_its_folder_is_refused(reader, tmp_path):
    """A model folder's ``tokenizer_config.json`` linked to ``~/.netrc`` was read (and copied into a checkpoint)."""
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".netrc").write_text(f"machine x password {SECRET}\n")
    (tmp_path / "model").mkdir()
    link = tmp_path / "model" / "tokenizer_config.json"
    link.symlink_to(tmp_path / "home" / ".netrc")
    if reader is is_regular:
        assert not is_regular(link)
        return
    with pytest.raises(FileReadError, match="is a symlink to a file outside its folder") as e:
        reader(link)
    assert SECRET not in str(e.value) and ".netrc" not in str(e.value)
    (tmp_path / "model" / "up.json").symlink_to("../home/.netrc")  # relative, the same
    with pytest.raises(FileReadError, match="outside its folder"):
        reader(tmp_path / "model" / "up.json")


def test_a_link_inside_its_folder_and_the_hugging_face_cache_layout_are_read(tmp_path):
    """``models--o--n/snapshots/REV/config.json -> ../../blobs/HASH``: how the Hub's cache keeps every file."""
    repo = tmp_path / "models--o--n"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc123").write_text('{"a": 1}')
    snap = repo / "snapshots" / "rev1"
    (snap / "sub").mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/abc123")
    (snap / "sub" / "t.json").symlink_to("../../../blobs/abc123")
    (snap / "same.json").symlink_to("config.json")
    for p in (snap / "config.json", snap / "sub" / "t.json", snap / "same.json"):
        assert read_text(p) == '{"a": 1}'
    (repo / "other").mkdir()
    (repo / "other" / "x").write_text("{}")
    (snap / "elsewhere.json").symlink_to("../../other/x")  # in the repository, but not a blob
    with pytest.raises(FileReadError, match="outside its folder"):
        read_text(snap / "elsewhere.json")


def test_size_is_bounded_before_reading(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(FileReadError, match=r"is 2048 bytes, more than the 1024 bytes such a file may hold"):
        read_text(big, limit=1024)
    assert read_tail(big, 10) == " " * 10


def test_bad_utf8_is_one_line_with_the_byte_offset_and_no_content(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_bytes(f"password: {SECRET}\n".encode() + b"\xff\xfe rest")
    with pytest.raises(FileReadError) as e:
        read_text(f)
    assert str(e.value) == f"{f}: is not UTF-8 text (bad byte at offset {len(SECRET) + 11}); save it as UTF-8"


@pytest.mark.parametrize(
    "text",
    [
        f'{{"token": "{SECRET}", }}',  # JSON error
        f"key: '{SECRET}\n",  # YAML: unterminated quote
        f"a: b: {SECRET}\n",  # YAML: mapping in a plain scalar
        f"- *{SECRET}\n",  # YAML: undefined alias (the problem names the alias)
    ],
)
def test_parse_errors_name_the_file_and_line_never_the_content(text, tmp_path):
    f = tmp_path / "doc"
    f.write_text(text)
    reader = read_json if text.startswith("{") else read_yaml
    with pytest.raises(FileReadError) as e:
        reader(f)
    msg = str(e.value)
    assert SECRET not in msg and msg.startswith(f"{f}:") and "\n" not in msg


def test_shapes_are_checked_naming_the_type_not_the_value(tmp_path):
    f = tmp_path / "index.json"
    f.write_text(f'["{SECRET}"]')
    with pytest.raises(FileReadError, match=r"the file holds a list, expected a mapping$"):
        read_json(f, dict)
    f.write_text(f'{{"weight_map": ["{SECRET}"]}}')
    with pytest.raises(FileReadError) as e:
        require_field(f, read_json(f), "weight_map", dict)
    assert str(e.value) == f"{f}: field 'weight_map' holds a list, expected a mapping"


def test_open_regular_leaves_a_blocking_descriptor(tmp_path):
    """O_NONBLOCK is only for the open: the reader gets an ordinary file."""
    (tmp_path / "f").write_bytes(b"x" * 10)
    with open_regular(tmp_path / "f") as fh:
        import fcntl

        assert not fcntl.fcntl(fh.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK
        assert fh.read() == b"x" * 10


# --- no raw read outside the safe reader ----------------------------------------------------------------

#: Calls that read a file by name (the attribute or function name).
READ_ATTRS = {"read_text", "read_bytes"}
LOADERS = {
    ("json", "load"),
    ("yaml", "load"),
    ("yaml", "safe_load"),
    ("yaml", "full_load"),
    ("OmegaConf", "load"),
    ("tomllib", "load"),
    ("torch", "load"),
    ("np", "memmap"),
    ("numpy", "memmap"),
    ("np", "fromfile"),
    ("np", "load"),
    ("os", "open"),
}
NAMES = {"safe_open", "IndexedDataset", "memmap"}
#: The few places that must open a file another way, each after the safe opener's check.
ALLOWED = {
    ("base/safe_read.py", "os.open"): "the safe opener itself (O_NONBLOCK, then fstat: regular files only)",
    ("base/safe_read.py", "yaml.load"): "parses the text read_text returned, with the (C) safe loader",
    ("convert/st_io.py", "safe_open"): "safetensors shards are memory-mapped; _shard calls require_regular first",
    ("train/ckpt_manager.py", "torch.load"): "reads the file object open_regular returned (a verified step)",
    ("data/datasets.py", "IndexedDataset"): "Megatron-Core memory-maps .bin/.idx; require_regular checks both first",
    ("data/sft.py", "IndexedDataset"): "the loss-mask .bin/.idx, memory-mapped; require_regular checks both first",
    ("data/record.py", "numpy.memmap"): "an .idx's lengths, memory-mapped after open_regular read its header",
    ("rundir/lock.py", "os.open"): "the lock file, opened O_RDWR|O_CREAT to flock it, never parsed raw",
    ("rundir/checkpoint.py", "os.open"): "a directory descriptor, to fsync a rename",
    ("rundir/events.py", "os.open"): "the events file, opened O_APPEND to write",
    ("rundir/targets.py", "os.open"): "a directory descriptor, to flock the folder of a file several processes update",
}


def _mode(call: ast.Call, position: int) -> str:
    if len(call.args) > position and isinstance(call.args[position], ast.Constant):
        return str(call.args[position].value)
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    return "r"


def raw_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, call)`` of every call in ``tree`` that reads a file without the safe reader."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name):
            if f.id == "open" and not set(_mode(node, 1)) & set("wax+"):
                found.append((node.lineno, "open"))
            elif f.id in NAMES:
                found.append((node.lineno, f.id))
        elif isinstance(f, ast.Attribute):
            base = f.value.id if isinstance(f.value, ast.Name) else None
            if f.attr in READ_ATTRS:
                found.append((node.lineno, f.attr))
            elif (base, f.attr) in LOADERS:
                found.append((node.lineno, f"{base}.{f.attr}"))
            elif (
                f.attr == "open"
                and base not in ("os", "tarfile", "zipfile", "io")
                and not set(_mode(node, 0)) & set("wax+")
            ):
                found.append((node.lineno, ".open"))
    return found


def test_scanner_finds_the_raw_reads_it_must():
    code = (
        "p.read_text()\nopen(p)\nopen(p, 'rb')\nopen(p, 'w')\np.open('rb')\np.open('a')\n"
        "json.load(f)\nyaml.safe_load(t)\nOmegaConf.load(p)\nsafe_open(p)\n"
    )
    assert [c for _, c in raw_reads(ast.parse(code))] == [
        "read_text",
        "open",
        "open",
        ".open",
        "json.load",
        "yaml.safe_load",
        "OmegaConf.load",
        "safe_open",
    ]


def test_every_read_in_src_goes_through_the_safe_reader():
    """A new ``open(``/``read_text``/``json.load``/... in src/ fails here: read through
    ``kilocard.base.safe_read`` (or add it to ``ALLOWED`` with the reason, after ``require_regular``)."""
    offenders = []
    used = set()
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        for line, call in raw_reads(ast.parse(path.read_text(), str(path))):
            if (rel, call) in ALLOWED:
                used.add((rel, call))
            else:
                offenders.append(f"{rel}:{line}: {call}")
    assert offenders == []
    assert used == set(ALLOWED), f"stale allow-list entries: {set(ALLOWED) - used}"
