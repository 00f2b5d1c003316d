"""The one error type of the data path: a single line naming the field or file, the value and the fix."""

from __future__ import annotations

FIX_MARK = "; fix: "
"""Separates what is wrong from how to fix it in a ``DataError``'s message."""


class DataError(Exception):
    """Bad data input (a config field, a file or a line in it); ``str(e)`` is the whole message,
    ``<what>; fix: <how>`` where there is a fix to name."""

    def parts(self) -> tuple[str, str]:
        """``(what, how)``; ``how`` is empty when the message names no fix."""
        what, _, how = str(self).partition(FIX_MARK)
        return what, how


def require_utf8(text: str, what: str) -> str:
    """``text`` when it encodes as UTF-8; ``DataError`` naming ``what`` (``path:line: "text"``) and where its lone
    surrogate is (a ``\\udXXX`` JSON escape without its pair), never the text itself."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DataError(
            f"{what} holds a lone surrogate (a \\u{ord(err.object[err.start]):04x} escape without its pair) at "
            f"character {err.start}; fix: escape whole characters (surrogate pairs) or write UTF-8"
        ) from None
    return text
