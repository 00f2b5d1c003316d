"""The ``kilocard`` console script (``kilocard = "kilocard.cli:_entry"``): a thin entry over ``kilocard.commands``."""

from __future__ import annotations

from kilocard.base.quickexit import exit_now
from kilocard.commands import main


def _entry() -> None:
    exit_now(main())  # without the interpreter's teardown: a verb that imported torch would pay ~1 CPU-s


if __name__ == "__main__":
    _entry()


__all__ = ["main"]
