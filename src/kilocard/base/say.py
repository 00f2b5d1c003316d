"""A line of a rank's own output in one ``write``.

Under ``python -u`` (``PYTHONUNBUFFERED=1``, which every rank gets) ``print`` writes the text and its newline
separately. The launchers that label each line with its rank (torchrun's and ft_launcher's ``--tee``) read
a rank's output file line by line as it grows: between those two writes they can read the text without its
newline, label it, and label the lone newline again, breaking the line in two. One write cannot be split.
"""

from __future__ import annotations

import sys
from typing import TextIO


def say(line: str, stream: TextIO | None = None) -> None:
    """Write ``line`` and its newline to ``stream`` (default stdout) in one write, then flush."""
    out = sys.stdout if stream is None else stream
    out.write(line + "\n")
    out.flush()
