"""Local network helpers shared by the launchers and the trainer."""

from __future__ import annotations

import random
import socket

PORTS = range(10000, 20000)
"""Where ``free_port`` looks: below the kernel's ephemeral range (Linux: 32768-60999), so no outgoing
connection (a gloo rank's, a client's) is given the port between the pick and the bind; and below the
batch script's ``MASTER_PORT`` (20000 up), so a local run never picks a Slurm job's port on the same host."""
TRIES = 200
"""Ports ``free_port`` tries in ``PORTS`` before it takes one from the kernel."""


def free_port() -> int:
    """A TCP port free on this host right now (bound by the caller's launcher a few seconds later).

    A port the kernel hands out (``bind(("", 0))``) comes from the ephemeral range, which every outgoing
    connection on the host draws from too: in the seconds before the launcher binds it, another process's
    connection can take it (EADDRINUSE). So the port is a random free one of ``PORTS``; the kernel's only
    when none of ``TRIES`` is free.
    """
    pick = random.SystemRandom()
    for _ in range(TRIES):
        port = pick.randrange(PORTS.start, PORTS.stop)
        if _bindable(port):
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    """Whether a listener could bind ``port`` on every interface now."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
        return True
