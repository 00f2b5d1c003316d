"""The ``kilocard`` console script (``kilocard = "kilocard.cli:_entry"``): a thin entry over ``kilocard.commands``.

This module imports nothing heavy: ``_entry`` first makes Ctrl-C during the start-up (the imports of Hydra,
the verbs and what they import take about a second) one line and exit 130, as the verbs' own boundary does
once they run, instead of a KeyboardInterrupt traceback and a death by the signal.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from kilocard.base.quickexit import exit_now

INTERRUPTED = 130
"""``kilocard.commands.exits.INTERRUPTED`` (not imported: that is what the start-up handler covers)."""


def _interrupted_at_start(signum: int, frame: Any) -> None:
    os.write(2, b"kilocard: interrupted while starting; nothing was done\n")
    os._exit(INTERRUPTED)


def _entry() -> None:
    signal.signal(signal.SIGINT, _interrupted_at_start)
    from kilocard.commands import main

    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here the verbs' boundary says it
    exit_now(main())  # without the interpreter's teardown: a verb that imported torch would pay ~1 CPU-s


def __getattr__(name: str) -> Any:
    """``kilocard.cli.main`` is ``kilocard.commands.main``, imported when first asked for."""
    if name == "main":
        from kilocard.commands import main

        return main
    raise AttributeError(name)


if __name__ == "__main__":
    _entry()
