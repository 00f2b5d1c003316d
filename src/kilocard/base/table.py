"""Plain-text tables: left-aligned columns two spaces apart, a dashed rule under the header."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[str]], rule: bool = True) -> list[str]:
    """``rows`` (the header first) as lines, each column as wide as its widest cell, trailing blanks
    stripped; with ``rule`` a line of dashes under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]] if rule else lines
