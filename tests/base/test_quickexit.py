"""``kilocard.base.quickexit``: a process ended by ``exit_now`` looks, from outside, like one ended by ``sys.exit``
(its status, its flushed output, its ``atexit`` handlers and non-daemon threads run to the end), and skips only
the interpreter's teardown. Each case runs in a Python process of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration  # starts Python processes


def run(body: str) -> subprocess.CompletedProcess:
    code = "import atexit, sys, threading, time\nfrom kilocard.base.quickexit import exit_now, run_module\n"
    return subprocess.run(
        [sys.executable, "-c", code + textwrap.dedent(body)], capture_output=True, text=True, timeout=60
    )


def test_the_status_buffered_output_atexit_handlers_and_threads_all_come_through():
    done = run(
        """
        atexit.register(lambda: print("atexit ran"))
        worker = threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished")))
        worker.start()
        sys.stdout.write("no newline, still buffered")
        exit_now(7)
        """
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout.startswith("no newline, still buffered") and "thread finished" in done.stdout
    assert done.stdout.rstrip().endswith("atexit ran")  # after the thread, as at a normal exit


def test_a_module_run_through_it_keeps_its_exit_status_and_message():
    """``python -m kilocard.base.quickexit MODULE ARGS`` (how torchrun is started): MODULE's ``sys.exit``
    status, or 1 with its message for a string, as ``python -m MODULE`` would give."""
    status = [sys.executable, "-m", "kilocard.base.quickexit", "json.tool", "--no-such-flag"]
    plain = subprocess.run([sys.executable, "-m", "json.tool", "--no-such-flag"], capture_output=True, text=True)
    wrapped = subprocess.run(status, capture_output=True, text=True, timeout=60)
    assert (wrapped.returncode, plain.returncode) == (2, 2) and "--no-such-flag" in wrapped.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "kilocard.base.quickexit", "json.tool"], input="[1]", capture_output=True, text=True
    )
    assert (ok.returncode, ok.stdout.split()) == (0, ["[", "1", "]"])


def test_a_systemexit_message_is_printed_and_the_status_is_1(capsys):
    from kilocard.base.quickexit import status_of

    assert (status_of(None), status_of(3)) == (0, 3)
    assert status_of("bad input") == 1 and capsys.readouterr().err == "bad input\n"


@pytest.mark.parametrize(
    ("args", "status", "line"),
    [((), 2, "usage: python -m kilocard.base.quickexit MODULE"), (("no.such.module",), 1, "No module named no.such")],
)
def test_its_own_command_line_refuses_in_one_line(args, status, line):
    done = subprocess.run([sys.executable, "-m", "kilocard.base.quickexit", *args], capture_output=True, text=True)
    assert done.returncode == status and line in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
