"""Safir-Darbaan on nodes with CURVE keys: channels and servers on the mesh's keys."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import zmq
import zmq.green as zmq_green
from zmq.utils.monitor import recv_monitor_message

from peermesh import Node
from peermesh.sada import Channel, Server, echo_service

from .conftest import PING, WAIT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402


def test_servers_serve_channels_over_curve(free_udp_port: int, tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "front", "back", "both")
    timing = dict(interface="lo", port=free_udp_port, interval=0.05, allowed_keys=allowed)
    front = Node("front", key_file=ring.secret("front"), **timing)
    channel = Channel(front, ping_interval=PING)
    back = Node("back", key_file=ring.secret("back"), **timing)
    server = Server(back, services=[echo_service("back")])
    both = Node("both", key_file=ring.secret("both"), **timing)
    own_channel = Channel(both, ping_interval=PING)
    own_server = Server(both, services=[echo_service("both")])
    started = [front, back, both]
    try:
        for node in started:
            node.start()
        own_server.start()
        for part in (channel, server, own_channel):
            part.start()
        assert channel.wait_for("echo", count=2, timeout=WAIT)
        assert own_channel.wait_for("echo", count=2, timeout=WAIT)
        assert {channel.request("echo", "info", server=s.id)["server"]
                for s in channel.servers()} == {"back", "both"}
        assert channel.request("echo", "echo", "over curve") == "over curve"
    finally:
        for part in (own_server, server, channel, own_channel):
            part.stop()
        for node in started:
            node.stop()


def handshake_outcome(sock: zmq_green.Socket, endpoint: str) -> int:
    """Connect ``sock`` to ``endpoint``; the first handshake event its monitor reports."""
    monitor = sock.get_monitor_socket()
    sock.connect(endpoint)
    try:
        while monitor.poll(int(WAIT * 1000)):
            event = recv_monitor_message(monitor)["event"]
            if event in OUTCOMES:
                return event
        pytest.fail("no handshake outcome")
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)


OUTCOMES = (zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_AUTH,
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def test_a_channel_with_keys_admits_only_allowed_keys(free_udp_port: int,
                                                      tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    front = Node("front", interface="lo", port=free_udp_port, key_file=ring.secret("front"),
                 allowed_keys=ring.allow("allowed", "front", "friend"))
    channel = Channel(front, ping_interval=PING)
    front.start()
    channel.start()
    context = zmq_green.Context.instance()
    sockets = []
    try:
        for name in ("stranger", "friend", None):  # None: no key at all
            sock = context.socket(zmq_green.ROUTER)
            sock.linger = 0
            sockets.append(sock)
            if name is not None:
                keypair = ring.keys.get(name) or ring.make(name)
                sock.curve_secretkey, sock.curve_publickey = keypair.secret, keypair.public
                sock.curve_serverkey = ring.public("front")
            outcome = handshake_outcome(sock, channel.endpoint)
            if name == "friend":
                assert outcome == zmq.EVENT_HANDSHAKE_SUCCEEDED
            elif name == "stranger":
                assert outcome == zmq.EVENT_HANDSHAKE_FAILED_AUTH   # refused by the ZAP handler
            else:
                assert outcome != zmq.EVENT_HANDSHAKE_SUCCEEDED     # NULL meets CURVE: no
    finally:
        for sock in sockets:
            sock.close(linger=0)
        channel.stop()
        front.stop()
