"""``kilocard preprocess`` on hostile input (issue 24): one line, exit 2, no output; workers capped.

Binary or non-UTF-8 input was a UnicodeDecodeError traceback, a lone surrogate escape a
UnicodeEncodeError inside the tokenizer, an unwritable prefix a PermissionError/IsADirectoryError,
and ``--workers 100000`` forked 100,000 processes.
"""

from __future__ import annotations

import json
import os

import pytest

from bad_files import finishes, make
from kilocard.cli import main
from kilocard.data.preprocess import usable_cpus

pytestmark = pytest.mark.integration  # imports torch/Megatron-Core when collected


def preprocess(capsys, src, prefix, *extra):
    capsys.readouterr()
    out = finishes(lambda: main(["preprocess", "--input", str(src), "--output-prefix", str(prefix), *extra]))
    assert "error" not in out, out
    return out["value"], capsys.readouterr()


def no_output(folder) -> bool:
    return not [p for p in folder.iterdir() if p.name.startswith(("out", ".out"))]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b'{"text": "ok"}\n{"text": "caf\xe9"}\n', "in.jsonl:2: not UTF-8 text (bad byte at offset 28)"),
        (bytes(range(256)), "in.jsonl:2: not UTF-8 text (bad byte at offset 128)"),  # line 2 starts after byte 10
        (b'{"text": "a\\ud800b"}\n', 'in.jsonl:1: "text" holds a lone surrogate (a \\ud800 escape without its pair)'),
    ],
    ids=["latin-1 line", "binary", "lone surrogate"],
)
def test_input_that_is_not_utf8_text_is_one_line(content, expected, tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    rc, out = preprocess(capsys, src, tmp_path / "out")
    assert rc == 2 and len(out.err.strip().splitlines()) == 1 and expected in out.err, out.err
    assert no_output(tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "dir", "broken"])
def test_input_that_is_not_a_regular_file_is_one_line(kind, tmp_path, capsys):
    src = make(kind, tmp_path / "in.jsonl")
    rc, out = preprocess(capsys, src, tmp_path / "out")
    assert rc == 2 and out.err.startswith(f"kilocard preprocess: error: --input: {src}: "), out.err
    assert len(out.err.strip().splitlines()) == 1 and no_output(tmp_path)


def test_an_unwritable_prefix_is_one_line(tmp_path, capsys):
    """The temporary output name taken by a directory: the builder cannot open it (as root, permission
    bits would not stop the write, so a directory stands in for an unwritable file)."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "hello"}) + "\n")
    (tmp_path / f".out_text_document.bin.tmp-{os.getpid()}").mkdir()
    rc, out = preprocess(capsys, src, tmp_path / "out")
    assert rc == 2 and "--output-prefix: cannot write" in out.err and len(out.err.strip().splitlines()) == 1
    assert not (tmp_path / "out_text_document.bin").exists()


def test_workers_are_capped_at_the_cpus_there_are(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(50)))
    rc, out = preprocess(capsys, src, tmp_path / "out", "--workers", "100000")
    assert rc == 0, out.err
    assert f"with {usable_cpus()} worker(s)" in out.out and usable_cpus() <= (os.cpu_count() or 1)


def test_an_unwritable_mask_prefix_of_chat_is_one_line_and_leaves_nothing(tmp_path, capsys):
    """``--chat`` writes two datasets through the same frame as text: the loss mask's temporary name taken by a
    directory is one line (exit 2), and the token dataset's temporary files are gone too (the chat loop used to
    open its writers outside the clean-up, so this was an OSError, exit 1, with a temporary .bin left)."""
    from kilocard.paths import data_dir

    chat = data_dir("conf").parent / "data" / "tiny_chat"
    src = tmp_path / "in.jsonl"
    src.write_text((chat / "conversations.jsonl").read_text(encoding="utf-8").splitlines()[0] + "\n")
    blocker = tmp_path / f".out_text_document_loss_mask.bin.tmp-{os.getpid()}"
    blocker.mkdir()
    rc = main(
        [
            "preprocess",
            "--chat",
            "--input",
            str(src),
            "--tokenizer",
            str(chat),
            "--output-prefix",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--output-prefix: cannot write" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.jsonl", blocker.name])
