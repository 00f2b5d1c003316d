"""Every command shown in docs/training.md and docs/data.md runs, in order, with the exit code the text says.

A shown command is a ``$ kilocard ...`` line of a ``console`` block; ``# exit N`` after it is the exit code
the text promises (0 without). They run as a user would type them (``shlex``), from one fresh directory
that holds a link to the repository's ``data/``, through ``python -m kilocard.cli``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest

from kilocard.paths import data_dir

ROOT = data_dir("conf").parent
DOCS = ("docs/data.md", "docs/training.md")

pytestmark = pytest.mark.slow


def shown_commands(page: str) -> list[tuple[str, int]]:
    """``(command, exit code)`` of every ``$ kilocard`` line in the page's console blocks."""
    text = (ROOT / page).read_text()
    out = []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                command, _, comment = line[2:].partition("  # ")
                code = re.fullmatch(r"exit (\d+)", comment.strip())
                out.append((command.strip(), int(code.group(1)) if code else 0))
    return out


def test_the_pages_show_commands():
    for page in DOCS:
        commands = shown_commands(page)
        assert commands and all(c.startswith("kilocard ") for c, _ in commands), page


def test_every_shown_command_exits_as_the_text_says(tmp_path):
    (tmp_path / "data").symlink_to(ROOT / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
    for page in DOCS:
        for command, expected in shown_commands(page):
            argv = [sys.executable, "-m", "kilocard.cli", *shlex.split(command)[1:]]
            proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == expected, f"{page}: {command}\n{(proc.stdout + proc.stderr)[-3000:]}"
            if "eval_interval" in command and expected == 0 and " run " in f" {command} ":
                assert "validation loss (last)" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "my_corpus_text_document.meta.json").is_file()
