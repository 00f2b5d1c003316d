"""A reader of stdout that goes away (``kilocard validate --format json | head -c 10``) ends the verb quietly.

Real pipes to a real ``kilocard`` process: the read end is closed before the verb prints, so its first
write meets a pipe without readers (EPIPE), whatever the size of its output. The verb exits PIPE (141, as a
Unix tool ended by SIGPIPE) with nothing on stderr: no error line, no ``BrokenPipeError`` traceback, not
even Python's ``Exception ignored ... <stdout>`` at exit.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kilocard.commands import exits

pytestmark = pytest.mark.integration


def closed_stdout(*args: str) -> tuple[int, str]:
    """Run ``kilocard ARGS`` with its stdout a pipe whose read end is already closed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kilocard.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


@pytest.mark.parametrize(
    "argv",
    [
        ("validate", "recipe=tiny_gpt", "--format", "json"),
        ("show", "recipe=tiny_gpt"),
    ],
)
def test_a_closed_stdout_ends_the_verb_quietly(argv):
    rc, err = closed_stdout(*argv)
    assert (rc, err) == (exits.PIPE, ""), err


def test_head_reads_the_first_bytes_and_the_verb_ends_without_a_traceback():
    """The shell pipeline of docs/validate.md, as a user types it."""
    line = f"{sys.executable} -m kilocard.cli validate recipe=tiny_gpt --format json | head -c 10"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, timeout=300)
    assert proc.stdout.startswith("{") and len(proc.stdout) == 10
    assert proc.returncode in (exits.OK, exits.PIPE) and proc.stderr == "", proc.stderr
