"""A Safir-Darbaan channel's ROUTER under the connection policy: a bounded flood of idle
connections is shed and requests still served; a server whose key leaves the allowlist is
cut off and no longer sent requests."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import gevent

from peermesh import Node
from peermesh.sada import Channel, Server, echo_service
from flooding import flood, lowered_cap, wait_shed

from .conftest import PING, WAIT, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402


def counter(channel: Channel) -> Any:
    return lambda name: channel.stats.get(name, 0)


def test_a_flood_of_idle_connections_to_a_channel_is_shed_and_requests_served(
        free_udp_port: int) -> None:
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    front, back = Node("front", **timing), Node("back", **timing)
    channel = Channel(front, ping_interval=PING)
    server = Server(back, services=[echo_service("back")])
    try:
        front.start()
        back.start()
        with lowered_cap():
            channel.start()
        server.start()
        assert channel.wait_for("echo", timeout=WAIT)
        assert channel.endpoint is not None
        with flood(int(channel.endpoint.rpartition(":")[2])):
            wait_shed(counter(channel), sleep=gevent.sleep)
            assert channel.wait_for("echo", timeout=WAIT)
            assert channel.request("echo", "echo", "still here") == "still here"
    finally:
        for part in (server, channel, back, front):
            part.stop()


def test_a_server_whose_key_is_removed_is_cut_off(free_udp_port: int, tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "front", "back", "other")
    timing = dict(interface="lo", port=free_udp_port, interval=0.05, allowed_keys=allowed)
    front = Node("front", key_file=ring.secret("front"), **timing)
    channel = Channel(front, ping_interval=PING)
    back = Node("back", key_file=ring.secret("back"), **timing)
    server = Server(back, services=[echo_service("back")])
    other = Node("other", key_file=ring.secret("other"), **timing)
    other_server = Server(other, services=[echo_service("other")])
    nodes = [front, back, other]
    try:
        for node in nodes:
            node.start()
        for part in (channel, server, other_server):
            part.start()
        assert channel.wait_for("echo", count=2, timeout=WAIT)
        os.remove(Path(allowed) / "back.key")
        wait_until(lambda: channel.stats.get("connections_revoked", 0) >= 1, WAIT,
                   "back's connection closed")
        wait_until(lambda: channel.offers("echo") == 1, WAIT, "back no longer offered")
        assert {channel.request("echo", "info")["server"] for _ in range(5)} == {"other"}
    finally:
        for part in (other_server, server, channel):
            part.stop()
        for node in nodes:
            node.stop()
