"""Local network helpers shared by the launchers and the trainer."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
