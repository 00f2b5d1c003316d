"""free_port: a port no outgoing connection can be given between the pick and the launcher's bind."""

from __future__ import annotations

import socket

from kilocard.base import net


def _ephemeral() -> range:
    low, high = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    return range(low, high + 1)


def test_the_port_is_free_and_outside_the_ephemeral_range():
    ports = {net.free_port() for _ in range(20)}
    assert all(p in net.PORTS and p not in _ephemeral() for p in ports), ports
    assert len(ports) > 1, "a random pick, so two local runs started together do not collide"
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_taken_port_is_never_returned(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(net, "PORTS", range(busy, busy + 1))  # the only candidate is taken: the kernel picks
        assert net.free_port() != busy


def test_with_every_candidate_taken_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(net, "_bindable", lambda port: False)
    port = net.free_port()
    assert 0 < port < 65536
