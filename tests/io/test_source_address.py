"""Where a message came from: the address of its connection, as the ZRE session asks
for a new peer's HELLO (a HELLO from the host its endpoint names needs no other proof)."""

from __future__ import annotations

import logging

import gevent
import pytest
import zmq

from peermesh.counters import Counters
from peermesh.io import HubSocket, bind_ephemeral, make_socket
from peermesh.io.connections import COUNTERS, ConnectionPolicy, GuardedListener
from waiting import poll_until

WAIT = 5.0


@pytest.mark.usefixtures("zmq_path")
def test_the_listener_tells_the_address_each_senders_connection_comes_from() -> None:
    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    listener = GuardedListener(HubSocket(router, endpoint=endpoint),
                               Counters(logging.getLogger(__name__), "test", COUNTERS),
                               ConnectionPolicy(max_connections=64), keep=lambda _: False)
    got: list[bytes] = []
    # (read in a greenlet: the routes are learned as it reads)
    server = gevent.spawn(listener.serve, lambda identity, frames: got.append(identity))
    # another address of this host (loopback answers on all of 127/8): another host to it
    other = HubSocket(make_socket(zmq.DEALER, {zmq.IDENTITY: b"\x01other", zmq.LINGER: 0}))
    local = HubSocket(make_socket(zmq.DEALER, {zmq.IDENTITY: b"\x01local", zmq.LINGER: 0}))
    try:
        other.socket.connect(f"tcp://127.0.0.2:0;{endpoint[6:]}")
        local.socket.connect(endpoint)
        assert other.try_send([b"hello"]) and local.try_send([b"hello"])
        poll_until(lambda: len(got) == 2, WAIT, "both messages read", sleep=gevent.sleep)
        assert listener.source_of(b"\x01other") == "127.0.0.2"
        assert listener.source_of(b"\x01local") == ""  # this host's own address
        assert listener.source_of(b"\x01nobody") is None
    finally:
        other.close()
        local.close()
        listener.close()
        server.kill()


def test_a_nodes_session_asks_its_mailbox_where_a_hello_came_from() -> None:
    from peermesh.config import NodeConfig
    from peermesh.zre.node import Node

    node = Node("source", config=NodeConfig(interface="lo", discovery=()))
    node.start()
    try:
        assert node._session.source == node._mailbox.source_of
    finally:
        node.stop()
