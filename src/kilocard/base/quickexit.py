"""Ending a process that imported torch without the interpreter's teardown.

CPython's finalization frees every module and runs the garbage collector over what torch and Megatron-Core
built at import: about 0.7 CPU-s for torch alone and 1.5 CPU-s with Megatron-Core on the development
machine (``scripts/bench_exit.py``: 5.36 against 3.85 CPU-s for the whole process), paid by every rank at
every exit, restart and requeue. ``exit_now`` does what a normal exit does that anyone can observe (waits
for non-daemon threads, runs the ``atexit`` handlers, where logging flushes and multiprocessing reaps its
children, flushes stdout and stderr) and then ends the process with ``os._exit``, skipping the teardown.
Open files are closed by the kernel; a file object's unwritten buffer would be lost, so everything kilocard
writes is written with ``with``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

FLUSH_FAILED = 120
"""Exit status when stdout or stderr cannot be flushed at exit and the status was 0 (CPython's own)."""


def exit_now(code: int) -> NoReturn:
    """End the process with status ``code`` as ``sys.exit`` would, without freeing the interpreter."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or stream.closed:  # CPython skips a stream the program closed
            continue
        try:
            stream.flush()
        except OSError:  # the reader went away: CPython reports it by the status
            code = code or FLUSH_FAILED
    os._exit(code)


def status_of(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as CPython computes it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_module(module: str) -> NoReturn:
    """``python -m module`` in this process (``sys.argv[1:]`` are its arguments), then ``exit_now``."""
    import runpy

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        exit_now(status_of(stop.code))
    exit_now(0)


USAGE = 2
"""Exit status of ``python -m kilocard.base.quickexit`` without a module to run (argparse's)."""


def main(argv: list[str]) -> NoReturn:
    """``python -m kilocard.base.quickexit MODULE ARGS``: MODULE's main, then ``exit_now``; one line and the
    status ``python -m`` gives (2 without a module, 1 for one that does not exist)."""
    import importlib.util

    if not argv or argv[0].startswith("-"):
        print("usage: python -m kilocard.base.quickexit MODULE [ARGS ...]", file=sys.stderr)
        exit_now(USAGE)
    try:
        found = importlib.util.find_spec(argv[0]) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        print(f"{sys.executable}: No module named {argv[0]}", file=sys.stderr)
        exit_now(1)
    sys.argv[:] = argv
    run_module(argv[0])


if __name__ == "__main__":
    main(sys.argv[1:])
