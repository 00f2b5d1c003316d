"""The commands, Python snippets and files that README.md and docs/*.md show, read from the Markdown.

The convention (docs/README.md, "How to write a command in the docs") in one place:

- A fenced block tagged ``bash``, ``sh``, ``shell`` or ``console`` holds commands; each one is run.
  In ``bash``/``sh``/``shell`` every line that is not blank or a comment is a command (a line ending
  in ``\\`` continues on the next). In ``console`` a command starts with ``$ ``, and the lines after it
  are its output as shown: each must appear in what the command prints (``...`` stands for any text).
- A command exits 0 unless its trailing comment says ``# exit N`` (followed by why, e.g.
  ``# exit 1: 4 micro-batches are not a multiple of PP 8``).
- ``<run>`` stands for the run directory that the page's latest ``kilocard run`` (or ``sbatch``)
  printed on its ``run dir:`` line; the commands of one page run in order in one scratch directory
  (a copy of the checkout's layout), and ``export NAME=VALUE`` / ``unset NAME`` carry to the later ones.
- A block tagged ``python`` is run as a script.
- A ``yaml`` block whose leading comment names a relative path (``# site/cluster/x.yaml``) is a file
  the page's commands use: it is written there before they run.
- A block opts out only with a visible first line ``# not run by the docs test: REASON``.
- Anything else (``text``, no tag) is not run; an untagged block that looks like commands is refused,
  so that a command cannot be left out by forgetting its tag.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHELL_TAGS = {"bash", "sh", "shell", "console"}
OPT_OUT = "# not run by the docs test:"
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")
EXIT = re.compile(r"#.*?\bexit (\d+)\b")
FILE_COMMENT = re.compile(r"^#\s+(?P<path>[\w-]+(?:/[\w.-]+)*\.ya?ml)\b")
LOOKS_LIKE_COMMAND = re.compile(r"^(\$ |kilocard |\.venv/|python |python3 |bash |pip |export |sbatch |srun )")


def doc_pages() -> list[Path]:
    """README.md and every page under docs/ (a new page is picked up without touching the test)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    """The Markdown file."""
    line: int
    """1-based line of its first content line."""
    tag: str
    """The info string's first word, lower-case ('' when untagged)."""
    lines: tuple[str, ...]
    """Its content lines, indentation of the fence removed."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def opt_out(self) -> str | None:
        """The stated reason of an opted-out block, or None."""
        first = next((s.strip() for s in self.lines if s.strip()), "")
        return first[len(OPT_OUT) :].strip() if first.startswith(OPT_OUT) else None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        out.append(Block(page, i + 2, (m["info"].split() or [""])[0].lower(), tuple(body)))
        i = j + 1
    return out


@dataclass(frozen=True)
class Command:
    """One command shown in a shell block."""

    block: Block
    """The block it is in."""
    line: int
    """Its 1-based line in the page."""
    text: str
    """The command line as shown (continuations joined, the trailing comment kept)."""
    exit_code: int
    """The exit code the text states (0 when it states none)."""
    output: tuple[str, ...] = field(default=())
    """For a ``console`` block: the lines shown under it."""

    @property
    def where(self) -> str:
        return f"{self.block.page.relative_to(ROOT)}:{self.line}"

    def argv(self) -> list[str]:
        """The command's words as a shell would split them (comments dropped)."""
        return shlex.split(self.text, comments=True)


def _joined(block: Block) -> list[tuple[int, str]]:
    """(page line, logical line): lines ending in a backslash joined with the next one."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for k, raw in enumerate(block.lines):
        line = raw.rstrip()
        start, text = pending if pending else (block.line + k, "")
        text = f"{text} {line.strip()}".strip() if pending else line
        if line.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        out.append((start, text))
    if pending:
        out.append(pending)
    return out


def commands(block: Block) -> list[Command]:
    """The commands of a shell block (none for an opted-out block)."""
    if block.tag not in SHELL_TAGS or block.opt_out is not None:
        return []
    cmds: list[Command] = []
    for line, text in _joined(block):
        stripped = text.strip()
        if block.tag == "console":
            if stripped.startswith("$ "):
                cmds.append(Command(block, line, stripped[2:], _exit_of(stripped)))
            elif cmds and stripped:
                cmds[-1] = Command(
                    cmds[-1].block, cmds[-1].line, cmds[-1].text, cmds[-1].exit_code, (*cmds[-1].output, stripped)
                )
            continue
        if stripped and not stripped.startswith("#"):
            cmds.append(Command(block, line, stripped, _exit_of(stripped)))
    return cmds


def _exit_of(text: str) -> int:
    """The ``# exit N`` a command's trailing comment states, else 0."""
    comment = command_comment(text)
    m = EXIT.search(comment) if comment else None
    return int(m.group(1)) if m else 0


def command_comment(text: str) -> str:
    """The trailing ``# ...`` of a command line (outside quotes), or ''."""
    quote: str | None = None
    for k, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1].isspace()):
            return text[k:]
    return ""


def files(block: Block) -> tuple[str, str] | None:
    """(relative path, text) of a yaml block that names its own path in its leading comments."""
    if block.tag not in ("yaml", "yml"):
        return None
    for line in block.lines:
        if not line.startswith("#"):
            break
        m = FILE_COMMENT.match(line)
        if m:
            return m["path"], "\n".join(block.lines) + "\n"
    return None


def untagged_commands(block: Block) -> list[str]:
    """Lines of an untagged block that look like commands (the block should be tagged ``bash``)."""
    if block.tag:
        return []
    return [s for s in block.lines if LOOKS_LIKE_COMMAND.match(s.strip())]
