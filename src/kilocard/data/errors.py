"""The one error type of the data path: a single line naming the field or file, the value and the fix."""

from __future__ import annotations


class DataError(Exception):
    """Bad data input (a config field, a file or a line in it); ``str(e)`` is the whole message."""
