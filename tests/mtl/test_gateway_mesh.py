"""The MTL gateway's mesh profile with real ZRE peers on loopback, and failover of the
gateway with the elected broker."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from gatewayhelp import TIMING, RawClient, default_users
from peermesh import ThreadedNode
from peermesh.events import EventType
from peermesh.mtl.gateway import Gateway
from peermesh.wire.mtl import Content, DataLease, Direction, Failure, Open, Response, Summon
from waiting import poll_until


@pytest.fixture
def nodes() -> Iterator[list[ThreadedNode]]:
    started: list[ThreadedNode] = []
    yield started
    for node in reversed(started):
        node.stop()


def start(nodes: list[ThreadedNode], name: str, port: int, *overlays: Gateway) -> ThreadedNode:
    node = ThreadedNode(name, interface="lo", port=port, overlays=list(overlays), **TIMING)
    node.start()
    nodes.append(node)
    return node


def test_mesh_profile_to_and_from_zre_peers(tmp_path: Path, free_udp_port: int,
                                            nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    gw = Gateway(tmp_path / "creds.json", run="always", virtual_hosts={"/": "lab."})
    gw_node = start(nodes, "gw", free_udp_port, gw)
    peer = start(nodes, "peer", free_udp_port)
    peer.join("lab.chat")
    reader, writer = RawClient(gw.control_endpoint), RawClient(gw.control_endpoint)
    try:
        reader.login()
        lease = reader.lease(Direction.READ, ("chat",))
        assert isinstance(lease, DataLease)
        reader.connect_data(lease)
        assert reader.command(Summon(reader.next(), "chat")) == Response(2, 200)
        # the gateway joined the group for its reader; the peer sees it and shouts
        poll_until(lambda: gw_node.uuid in peer.peers_by_group("lab.chat"), 5.0,
                   "the peer to see the gateway in lab.chat")
        peer.shout("lab.chat", b"hello from the mesh")
        [content] = reader.contents(1)
        assert content == Content(1, "chat", b"hello from the mesh", {"peer": peer.uuid.hex})
        # a client's content goes into the group
        poll_until(lambda: peer.uuid in gw_node.peers_by_group("lab.chat"), 5.0,
                   "the gateway to see the peer in lab.chat")
        writer.login()
        wl = writer.lease(Direction.WRITE, ("chat",))
        assert isinstance(wl, DataLease)
        writer.connect_data(wl)
        writer.send(Content(1, "", b"hello from off the LAN"))
        event = poll_until(lambda: next((e for e in iter(lambda: peer.recv(0.05), None)
                                         if e.type is EventType.SHOUT), None), 5.0,
                           "the peer to hear the client's shout")
        assert (event.group, event.frames) == ("lab.chat", (b"hello from off the LAN",))
        # and the gateway's own reader of the group has it too
        assert [c.body for c in reader.contents(1)] == [b"hello from off the LAN"]
    finally:
        reader.close()
        writer.close()


def test_gateway_moves_with_the_elected_broker(tmp_path: Path, free_udp_port: int,
                                               nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    first = Gateway(tmp_path / "creds.json", broker="auto", priority=2, settle=0.1)
    second = Gateway(tmp_path / "creds.json", broker="auto", priority=1, settle=0.1)
    first_node = start(nodes, "first", free_udp_port, first)
    start(nodes, "second", free_udp_port, second)
    poll_until(lambda: first.active and second.tracker.current_broker is not None
               and second.elected_endpoint() == first.control_endpoint, 5.0,
               "the first gateway to be elected, as both see it")
    standby = RawClient(second.control_endpoint)
    client = RawClient(first.control_endpoint)
    try:
        refusal = standby.ask(Open("/"))
        assert isinstance(refusal, Failure) and refusal.status == 503
        assert first.control_endpoint in refusal.reason
        ready = client.login()
        assert ready.gateways == (first.control_endpoint, second.control_endpoint)
        first_node.stop()  # the broker leaves: the second gateway takes over
        nodes.remove(first_node)
        poll_until(lambda: second.active, 5.0, "the second gateway to be elected")
        moved = RawClient(ready.gateways[1])  # the client moves down its list
        try:
            moved.login()
            lease = moved.lease(Direction.READ, ("chat",))
            assert isinstance(lease, DataLease) and lease.port == second.data_port
        finally:
            moved.close()
    finally:
        standby.close()
        client.close()
