"""The MTL gateway's mesh profile with real ZRE peers on loopback, and failover of the
gateway with the elected broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from gatewayhelp import TIMING, RawClient, default_users
from peermesh import ThreadedNode
from peermesh.events import EventType
from peermesh.mtl.gateway import GATEWAY_HEADER, Gateway
from peermesh.wire.mtl import (Confirm, Content, DataLease, Direction, Failure, Open, Response,
                               Summon)
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


def test_confirmed_content_moves_to_the_new_gateway(tmp_path: Path, free_udp_port: int,
                                                    nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    old = Gateway(tmp_path / "creds.json", priority=1, settle=0.1, data_dir=tmp_path / "old")
    start(nodes, "old", free_udp_port, old)
    poll_until(lambda: old.active, 5.0, "the only gateway to be elected")
    writer = RawClient(old.control_endpoint)
    try:
        writer.login()
        lease = writer.lease(Direction.WRITE, ("jobs",), "full")
        assert isinstance(lease, DataLease)
        writer.connect_data(lease)
        for i in range(1, 301):
            writer.send(Content(i, "", b"job %d" % i))
        poll_until(lambda: old.store is not None and old.store.count == 300, 5.0,
                   "300 contents stored")
    finally:
        writer.close()
    # a better candidate arrives: the old gateway steps down, offers its content to the
    # new one and then keeps a copy of the new one's store (a replica)
    new = Gateway(tmp_path / "creds.json", priority=9, settle=0.1, data_dir=tmp_path / "new")
    new_node = start(nodes, "new", free_udp_port, new)
    poll_until(lambda: new.active and not old.active, 5.0, "the new gateway to serve")
    old_uuid = nodes[0].uuid
    poll_until(lambda: old_uuid in new.replicas, 10.0, "the old gateway to be a replica")
    assert new.store is not None and new.store.count == 300
    assert old.store is not None and old.store.count == 300
    assert new_node.uuid not in old.replicas
    reader = RawClient(new.control_endpoint)
    try:
        reader.login()
        lease = reader.lease(Direction.READ, ("jobs",), "full")
        assert isinstance(lease, DataLease)
        reader.connect_data(lease)
        assert reader.command(Summon(reader.next(), "jobs")) == Response(2, 200)
        contents = reader.contents(300)
        assert sorted(c.body for c in contents) == sorted(b"job %d" % i for i in range(1, 301))
        reader.send(Confirm(contents[-1].sequence, True))
        # what the reader confirmed is deleted from the copy too
        poll_until(lambda: old.store is not None and old.store.count == 0, 10.0,
                   "the replica to forget what the reader confirmed")
        assert reader.quiet(200) == []
    finally:
        reader.close()


def test_handovers_only_from_gateways_and_well_formed(tmp_path: Path, free_udp_port: int,
                                                      nodes: list[ThreadedNode]) -> None:
    from peermesh.mtl.gateway import HANDOFF, HANDOFF_OK, MARK, REPL
    default_users(tmp_path / "creds.json")
    gw = Gateway(tmp_path / "creds.json", run="always", data_dir=tmp_path)
    gw_node = start(nodes, "gw", free_udp_port, gw)
    peer = start(nodes, "not-a-gateway", free_udp_port)
    client = RawClient(gw.control_endpoint)
    try:
        client.login()
        lease = client.lease(Direction.READ, ("jobs",))
        assert isinstance(lease, DataLease)
        client.connect_data(lease)
        client.command(Summon(client.next(), "jobs"))
        poll_until(lambda: gw_node.uuid in peer.peers_by_group("jobs"), 5.0,
                   "the peer to see the gateway in jobs")
        seq = (1).to_bytes(8, "big")
        cid = bytes(16)
        peer.whisper(gw_node.uuid, HANDOFF, b"jobs", seq, cid, b"\x00\x00", b"forged")
        peer.whisper(gw_node.uuid, HANDOFF, b"jobs", seq)             # too few frames
        peer.whisper(gw_node.uuid, HANDOFF_OK, seq)                   # an ack nobody asked for
        peer.whisper(gw_node.uuid, REPL, b"jobs", cid, b"\x00\x00", b"forged")  # a copy
        peer.whisper(gw_node.uuid, MARK, seq, b"\x01")               # nobody asked for
        peer.shout("jobs", b"marker")  # handled after the whispers: in order, one queue
        assert [c.body for c in client.contents(1)] == [b"marker"]
        assert gw.store is not None and gw.store.count == 0
        assert not any(e.type is EventType.WHISPER for e in iter(lambda: peer.recv(0.1), None))
    finally:
        client.close()


def test_a_batch_of_content_reaches_mesh_peers_as_one_shout_each_in_order(
        tmp_path: Path, free_udp_port: int, nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    gw = Gateway(tmp_path / "creds.json", run="always")
    gw_node = start(nodes, "gw", free_udp_port, gw)
    peers = [start(nodes, f"peer{i}", free_udp_port) for i in range(2)]
    for peer in peers:
        peer.join("chat")
    poll_until(lambda: len(gw_node.peers_by_group("chat")) == 2, 5.0,
               "the gateway to see both peers in chat")
    writer = RawClient(gw.control_endpoint)
    try:
        writer.login()
        lease = writer.lease(Direction.WRITE, ("chat",))
        assert isinstance(lease, DataLease)
        writer.connect_data(lease)
        for i in range(1000):   # sent at once: the gateway drains them in batches
            writer.send(Content(i + 1, "", b"m%d" % i))
        for peer in peers:
            heard: list[tuple[bytes, ...]] = []
            while len(heard) < 1000:
                event = peer.recv(5.0)
                assert event is not None, f"{len(heard)} of 1000 shouts heard"
                if event.type is EventType.SHOUT:
                    heard.append(event.frames)
            assert heard == [(b"m%d" % i,) for i in range(1000)]
    finally:
        writer.close()


def test_gateway_endpoints_off_the_network_are_never_used_or_handed_out(
        tmp_path: Path, free_udp_port: int, nodes: list[ThreadedNode]) -> None:
    """A peer advertising a gateway outside the node's network (lo: 127.0.0.0/8) is refused
    and counted: it is neither joined nor named to clients in a 201 or a 503."""
    default_users(tmp_path / "creds.json")
    liar = ThreadedNode("liar", interface="lo", port=free_udp_port, headers={
        GATEWAY_HEADER: json.dumps({"control": "tcp://10.1.2.3:5"})}, **TIMING)
    liar.start()
    nodes.append(liar)
    first = Gateway(tmp_path / "creds.json", broker="auto", priority=2, settle=0.1)
    second = Gateway(tmp_path / "creds.json", broker="auto", priority=1, settle=0.1)
    start(nodes, "first", free_udp_port, first)
    start(nodes, "second", free_udp_port, second)
    poll_until(lambda: first.limits.get("peer_networks") == 1
               and second.limits.get("peer_networks") == 1, 5.0, "both refuse the liar")
    poll_until(lambda: first.active and second.elected_endpoint() == first.control_endpoint,
               5.0, "the first gateway to be elected, as both see it")
    standby = RawClient(second.control_endpoint)
    client = RawClient(first.control_endpoint)
    try:
        refusal = standby.ask(Open("/"))
        assert isinstance(refusal, Failure) and refusal.status == 503
        assert "10.1.2.3" not in refusal.reason
        assert client.login().gateways == (first.control_endpoint, second.control_endpoint)
    finally:
        standby.close()
        client.close()


def test_peer_networks_are_checked(tmp_path: Path) -> None:
    default_users(tmp_path / "creds.json")
    with pytest.raises(ValueError, match="not a network"):
        Gateway(tmp_path / "creds.json", peer_networks=["10.0.0.0/33"])
