"""The ``kilocard`` console script (``kilocard = "kilocard.cli:_entry"``): a thin entry over ``kilocard.commands``."""

from __future__ import annotations

import sys

from kilocard.commands import main


def _entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()


__all__ = ["main"]
