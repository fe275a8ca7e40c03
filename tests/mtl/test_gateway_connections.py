"""The MTL gateway's control and data ROUTERs under the connection policy: a bounded
flood of idle connections to either is shed, and a real login (and data lease) is still
answered."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import zmq

from flooding import CAP, FLOOD, flood, lowered_cap, wait_shed
from gatewayhelp import TIMING, RawClient, default_users
from peermesh import ThreadedNode
from peermesh.mtl.gateway import Gateway
from peermesh.wire.mtl import DataLease, Direction, Open, Response, Summon, encode_request


@pytest.fixture
def gateway(tmp_path: Path, free_udp_port: int) -> Iterator[Gateway]:
    default_users(tmp_path / "creds.json")
    gw = Gateway(tmp_path / "creds.json", run="always", heartbeat=0.5, data_dir=tmp_path)
    node = ThreadedNode("gw", interface="lo", port=free_udp_port, overlays=[gw], **TIMING)
    with lowered_cap():
        node.start()
    try:
        yield gw
    finally:
        node.stop()


@pytest.mark.parametrize("flow", ["control", "data"])
def test_a_flood_of_idle_connections_is_shed_and_a_login_answered(gateway: Gateway,
                                                                  flow: str) -> None:
    port = gateway.data_port if flow == "data" else int(
        gateway.control_endpoint.rpartition(":")[2])
    client = RawClient(gateway.control_endpoint)
    try:
        with flood(port):
            wait_shed(gateway.limits)
            client.login()
            lease = client.lease(Direction.READ, ("chat",))
            assert isinstance(lease, DataLease)
            assert client.connect_data(lease) == Response(1, 200)
            assert client.command(Summon(client.next(), "chat")) == Response(2, 200)
    finally:
        client.close()


def test_a_flood_of_connections_that_open_and_wait_is_shed_and_a_login_answered(
        gateway: Gateway) -> None:
    """The shape that once kept a real login unanswered: each connection sends
    ``Connection.Open`` and then nothing (they do not reconnect once shed).

    Each socket is tracked before its first send, so that whatever happens the context
    can end: one left open would make ``context.term()`` wait forever."""
    context = zmq.Context()
    waiting = []
    try:
        for _ in range(FLOOD // 2):
            sock = context.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RECONNECT_IVL, -1)
            waiting.append(sock)
            sock.connect(gateway.control_endpoint)
            try:  # a REQ whose connection was shed already has no peer: it would block
                sock.send_multipart(encode_request(Open("/")), zmq.NOBLOCK)
            except zmq.Again:
                pass
        wait_shed(gateway.limits, FLOOD // 2 - CAP)
        client = RawClient(gateway.control_endpoint, context)
        try:
            client.login()
        finally:
            client.close()
    finally:
        for sock in waiting:
            sock.close(0)
        context.term()
