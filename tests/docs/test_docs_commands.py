"""Executable documentation: every command that README.md and docs/*.md show runs here, with the exit
code the text states (the convention: docs/README.md and ``tests/docs/docblocks.py``).

``kilocard`` verbs run in this process through the CLI's ``main`` (no new Python per command); a
command with shell syntax (``>``, ``|``, ``$VAR``) or another program runs under ``bash``. The commands
of one page run in order in one scratch directory laid out like the checkout. A command that trains
(``run``, ``convert``, ``preprocess``, anything on a ``<run>``) is ``slow``; one that needs Slurm is
``slurm`` and gets the local cluster of ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docblocks import (
    ROOT,
    Command,
    blocks,
    command_comment,
    commands,
    doc_pages,
    files,
    untagged_commands,
)

SHELL_SYNTAX = re.compile(r"[|&;<>`$]")
"""A command with any of these needs a shell (outside quotes they are not arguments)."""
SLOW_VERBS = {"run", "convert", "preprocess", "baselines"}
"""Verbs that start ranks, import the training stack, or (``baselines``) score every published row."""
MAX_OPT_OUTS = 10
"""Blocks may opt out only for a stated reason, and only a few (today: setup, the suite and its tiers, a GPU
cluster, Meta's weights, a lean install in a fresh venv, and two whose commands another named test runs:
convert without a recipe, fine-tuning on the tiny twin)."""
RUN_DIR_LINE = re.compile(r"^run dir: (\S+)", re.M)
PLACEHOLDER = re.compile(r"<(\w+)>")


def _all_commands() -> list[Command]:
    return [c for page in doc_pages() for b in blocks(page) for c in commands(b)]


def _params() -> list[object]:
    """One test per command, marked; on a page, every command after a ``slow`` one is ``slow`` too, since it
    may read what that one made (the page is one shell session)."""
    out: list[object] = []
    slow_page: set[Path] = set()
    for c in _all_commands():
        marks = _marks(c)
        if c.block.page in slow_page and pytest.mark.slow not in marks:
            marks.append(pytest.mark.slow)
        if pytest.mark.slow in marks:
            slow_page.add(c.block.page)
        out.append(pytest.param(c, id=c.where, marks=marks))
    return out


def worker_group(page: str) -> str:
    """The pytest-xdist group of a page's tests (``tests/conftest.py``), from its path as the test ids show it: a
    page is one shell session, so its commands and Python blocks run on one worker in order; a page with a Slurm
    command joins the Slurm group."""
    slurm = any(pytest.mark.slurm in _marks(c) for b in blocks(ROOT / page) for c in commands(b))
    return "slurm" if slurm else f"docs:{page}"


def _marks(cmd: Command) -> list[pytest.MarkDecorator]:
    argv = cmd.argv()
    slurm = "--submit" in argv or "--test-only" in argv or "slurm-" in cmd.text or argv[0] in {"sbatch", "srun"}
    verb = argv[1] if argv[0] == "kilocard" and len(argv) > 1 else None
    slow = slurm or verb in SLOW_VERBS or "<run>" in " ".join(argv) or argv[0] not in {"kilocard", "export", "unset"}
    return [pytest.mark.slurm] * slurm + [pytest.mark.slow] * slow


@dataclass
class Page:
    """The shell session of one page: its scratch directory, its exports, its latest run directory."""

    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    run_dir: str | None = None


def _scratch(root: Path, page: Path) -> Path:
    """A directory laid out like the checkout (links), with its own ``data/`` and no ``runs/``, holding
    the files the page's yaml blocks name."""
    root.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in {"runs", "data", ".git"}:
            (root / entry.name).symlink_to(entry)
    (root / "data").mkdir()
    for entry in (ROOT / "data").iterdir():
        (root / "data" / entry.name).symlink_to(entry)
    for b in blocks(page):
        named = files(b)
        if named:
            (root / named[0]).parent.mkdir(parents=True, exist_ok=True)
            (root / named[0]).write_text(named[1])
    return root


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Page]:
    """One ``Page`` per Markdown file, made on first use."""
    base = tmp_path_factory.mktemp("docs")

    class Pages(dict[Path, Page]):
        def __missing__(self, page: Path) -> Page:
            self[page] = Page(_scratch(base / str(len(self)), page))
            return self[page]

    return Pages()


def _substitute(cmd: Command, page: Page) -> str:
    """The command with ``<run>`` replaced by the page's latest run directory (its comment left as shown)."""

    def one(m: re.Match[str]) -> str:
        if m[1] != "run":
            pytest.fail(f"{cmd.where}: unknown placeholder <{m[1]}> (the docs test knows <run>)")
        if page.run_dir is None:
            pytest.fail(f"{cmd.where}: <run> before any command of this page printed a run directory")
        return page.run_dir

    comment = command_comment(cmd.text)
    code = cmd.text[: len(cmd.text) - len(comment)] if comment else cmd.text
    return PLACEHOLDER.sub(one, code) + comment


def _in_process(argv: list[str], page: Page, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """``kilocard ARGV`` through the CLI's ``main``, in the page's directory and environment."""
    from kilocard.cli import main

    monkeypatch.chdir(page.cwd)
    for k, v in page.env.items():
        monkeypatch.setenv(k, v)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own exit 2 for a bad flag
            rc = e.code if isinstance(e.code, int) else 1
    return rc, out.getvalue()


def _in_shell(text: str, page: Page) -> tuple[int, str]:
    """``bash -c TEXT`` with the venv's programs first on the PATH."""
    env = {**os.environ, **page.env, "OMP_NUM_THREADS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run(
        ["bash", "-c", text], cwd=page.cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    return proc.returncode, proc.stdout + proc.stderr


def _export(argv: list[str], page: Page) -> None:
    """``export NAME=VALUE ...`` kept for the page's later commands (``$VAR`` expanded as a shell would);
    ``unset NAME ...`` dropped again."""
    if argv[0] == "unset":
        for name in argv[1:]:
            page.env.pop(name, None)
        return
    for assignment in argv[1:]:
        name, _, value = assignment.partition("=")
        env = {**os.environ, **page.env, "PWD": str(page.cwd)}
        page.env[name] = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m, env=env: env.get(m[1] or m[2], ""), value)


def _shows(output: str, shown: str) -> bool:
    """Whether ``shown`` (``...`` for any text) is a line of ``output``."""
    pattern = ".*".join(re.escape(part) for part in shown.split("..."))
    return re.search(pattern, output) is not None


@pytest.mark.parametrize("cmd", _params())
def test_documented_command(
    cmd: Command, pages: dict[Path, Page], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command exits with the code the text states, and prints what a console block shows."""
    if request.node.get_closest_marker("slurm"):
        request.getfixturevalue("local_slurm")
    page = pages[cmd.block.page]
    text = _substitute(cmd, page)
    argv = shlex.split(text, comments=True)
    code = text[: len(text) - len(command_comment(text))]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if argv[0] in ("export", "unset"):
        _export(argv, page)
        rc, out = 0, ""
    elif argv[0] == "kilocard" and not SHELL_SYNTAX.search(code):
        rc, out = _in_process(argv[1:], page, monkeypatch)
    else:
        rc, out = _in_shell(text, page)
    found = RUN_DIR_LINE.findall(out)
    if found:
        page.run_dir = found[-1]
    assert rc == cmd.exit_code, (
        f"{cmd.where}: `{cmd.text}` exited {rc}, the text says {cmd.exit_code}; its output ends:\n{out[-3000:]}"
    )
    for shown in cmd.output:
        assert _shows(out, shown), f"{cmd.where}: the output shown is not what it prints:\n{shown}\n---\n{out[-3000:]}"


PYTHON_BLOCKS = [b for page in doc_pages() for b in blocks(page) if b.tag == "python" and b.opt_out is None]


@pytest.mark.parametrize("block", [pytest.param(b, id=b.where) for b in PYTHON_BLOCKS])
def test_documented_python(block, pages: dict[Path, Page], monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``python`` block runs as written (the public API it shows exists and works)."""
    monkeypatch.chdir(pages[block.page].cwd)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("\n".join(block.lines), block.where, "exec"), {"__name__": "__docs__"})


def test_commands_are_in_tagged_blocks() -> None:
    """An untagged block that holds commands would escape the test: it must say ``bash`` (or ``text``)."""
    bad = [f"{b.where}: {lines[0]}" for page in doc_pages() for b in blocks(page) if (lines := untagged_commands(b))]
    assert not bad, "tag these blocks ```bash (run by the docs test) or ```text (not a command):\n" + "\n".join(bad)


def test_opt_outs_state_a_reason_and_are_few() -> None:
    """Every opted-out block says why, and there are few of them."""
    opted = [b for page in doc_pages() for b in blocks(page) if b.opt_out is not None]
    assert all(len(b.opt_out or "") >= 10 for b in opted), [b.where for b in opted if len(b.opt_out or "") < 10]
    assert len(opted) <= MAX_OPT_OUTS, [f"{b.where}: {b.opt_out}" for b in opted]


def test_readme_shows_every_verb() -> None:
    """README.md shows one example of each verb (run by ``test_documented_command``); a new verb adds one."""
    from kilocard.commands import VERBS

    readme = [c.argv() for c in _all_commands() if c.block.page == ROOT / "README.md"]
    shown = {a[1] for a in readme if a[0] == "kilocard"}
    assert shown == set(VERBS), f"verbs without an example in README.md: {sorted(set(VERBS) - shown)}"
