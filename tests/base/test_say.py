"""A rank's own line reaches its launcher in one write (``kilocard.base.say``): torchrun's and ft_launcher's
``--tee`` label what they read line by line, and ``print`` under ``python -u`` writes a line's text and its
newline separately."""

from __future__ import annotations

import io

from kilocard.base.say import say


class Raw(io.RawIOBase):
    """A file descriptor that records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        self.writes.append(bytes(b))
        return len(b)


def test_a_line_is_one_write_where_print_makes_two():
    raw = Raw()
    out = io.TextIOWrapper(raw, write_through=True)  # what sys.stdout is under python -u (PYTHONUNBUFFERED)
    print("step 1/2 | loss 5.0", file=out, flush=True)
    say("step 2/2 | loss 4.0", out)
    assert raw.writes == [b"step 1/2 | loss 5.0", b"\n", b"step 2/2 | loss 4.0\n"]
