"""Nodes with CURVE keys on loopback: Zyre's secure ZRE, allowlists, and what they refuse."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator

import pytest
import zmq
from zmq.utils import z85

from peermesh import EventType, NodeConfig, NodeStateError, ThreadedNode
from peermesh.io.keys import CurveError, KeyFileError
from peermesh.wire import zre

try:  # tests/ as a package
    from ..waiting import poll_until
except ImportError:  # tests/ on sys.path (pytest's default "prepend" import mode)
    from waiting import poll_until

from curvemesh import (KeyRing, Nodes, drain, handshake, hear_beacons, hello, match,
                       raw_dealer, wait_for)

pytestmark = pytest.mark.usefixtures("zmq_path")  # native C batches and pyzmq alone

ENTER, EXIT, WHISPER, SHOUT, JOIN = (EventType.ENTER, EventType.EXIT, EventType.WHISPER,
                                     EventType.SHOUT, EventType.JOIN)


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    return KeyRing(tmp_path)


@pytest.fixture
def nodes(free_udp_port: int, ring: KeyRing) -> Iterator[Nodes]:
    made = Nodes(free_udp_port, ring)
    yield made
    made.stop()


def mesh(*members: ThreadedNode) -> None:
    """Wait until every node saw every other one ENTER (and JOIN its groups)."""
    for node in members:
        wanted = {(ENTER, other.uuid, None) for other in members if other is not node}
        wanted |= {(JOIN, other.uuid, group) for other in members if other is not node
                   for group in other.groups()}
        seen: list = []
        while wanted:
            event = wait_for(node, lambda e: (e.type, e.peer, e.group) in wanted, seen=seen)
            wanted.discard((event.type, event.peer, event.group))


def test_secure_mesh_of_three_talks_and_announces_keys(nodes: Nodes, ring: KeyRing) -> None:
    names = ("alice", "bob", "carol")
    a, b, c = (nodes.start(n, allow=names, groups=["g"]) for n in names)
    mesh(a, b, c)
    assert a.peer_header_value(b.uuid, zre.PUBLIC_KEY_HEADER) == ring.public("bob").decode()
    b.whisper(a.uuid, b"secret hello")
    assert wait_for(a, match(WHISPER, b.uuid)).frames == (b"secret hello",)
    a.shout("g", b"to all")
    for node in (b, c):
        assert wait_for(node, match(SHOUT, a.uuid)).frames == (b"to all",)


def test_a_node_with_any_key_allowed_meets_other_keys(nodes: Nodes) -> None:
    a, b = nodes.start("alice"), nodes.start("bob")
    mesh(a, b)


def test_mixed_mesh_secure_plain_and_two_allowlists(nodes: Nodes) -> None:
    # one beacon port: two secure groups with their own allowlists, and two plain nodes
    a = nodes.start("a1", allow=["a1", "a2"])
    a2 = nodes.start("a2", allow=["a1", "a2"])
    b = nodes.start("b1", allow=["b1", "b2"], zap_domain="group-b")
    b2 = nodes.start("b2", allow=["b1", "b2"], zap_domain="group-b")
    p = nodes.start("p1", key=False)
    p2 = nodes.start("p2", key=False)
    groups = [(a, a2), (b, b2), (p, p2)]
    for pair in groups:
        mesh(*pair)
    everyone = [node for pair in groups for node in pair]
    hear_beacons(nodes.port, [n.uuid for n in everyone])
    for pair in groups:
        for node in pair:
            strangers = {n.uuid for n in everyone if n not in pair}
            assert not [e for e in drain(node) if e.peer in strangers]
            assert not strangers & set(node.peers())


def test_a_key_not_allowed_delivers_nothing_and_makes_no_event(nodes: Nodes,
                                                              ring: KeyRing) -> None:
    a = nodes.start("alice", allow=["alice", "bob"])
    b = nodes.start("bob", allow=["alice", "bob"])
    mallory = nodes.start("mallory")  # alice does not admit mallory
    mesh(a, b)
    # mallory's own beacons, and a raw connection with her key trying HELLO and WHISPER
    dealer = raw_dealer(ring.keys["mallory"], ring.public("alice"), a.endpoint,
                        b"\x01" + mallory.uuid.bytes)
    try:
        dealer.send_multipart(hello(mallory.endpoint, {zre.PUBLIC_KEY_HEADER:
                                                       ring.public("mallory").decode()}))
        dealer.send_multipart([zre.whisper_header(2), b"let me in"])
        hear_beacons(nodes.port, [mallory.uuid])
        b.whisper(a.uuid, b"marker")  # after mallory's tries, on another connection
        seen: list = []
        wait_for(a, match(WHISPER, b.uuid), seen=seen)
        assert not [e for e in seen + drain(a) if e.peer == mallory.uuid]
        assert mallory.uuid not in a.peers() and a.uuid not in mallory.peers()
    finally:
        dealer.close()


def test_allowlist_reload_admits_a_new_key_without_restart(nodes: Nodes, ring: KeyRing) -> None:
    a = nodes.start("alice", allow=["alice"], evasive=0.5)
    b = nodes.start("bob", evasive=0.5)  # admits any key
    hear_beacons(nodes.port, [a.uuid, b.uuid])
    assert b.uuid not in a.peers()
    shutil.copy(ring.root / "bob.key", ring.root / "allow-alice" / "bob.key")
    mesh(a, b)
    b.whisper(a.uuid, b"in")
    assert wait_for(a, match(WHISPER, b.uuid)).frames == (b"in",)


def test_a_key_admitted_later_brings_no_restart_of_a_peer_that_did_not_restart(
        nodes: Nodes, ring: KeyRing, caplog: pytest.LogCaptureFixture) -> None:
    """alice's allowlist refuses bob's key, and libzmq does not retry bob's refused
    connection to her. Once her allowlist holds his key her HELLO reaches bob (who admits
    any key) but his went into the dead connection: she gives up on him (``evasive``) and
    says HELLO again; bob says his again on a new link, and reports no EXIT and ENTER."""
    caplog.set_level(logging.DEBUG, "peermesh.io.zap")
    a = nodes.start("alice", allow=["alice"], evasive=0.5)
    b = nodes.start("bob", evasive=5.0)  # keeps the refused link until alice's HELLO
    seen: list = []
    hear_beacons(nodes.port, [a.uuid, b.uuid])
    # bob's link to alice must have been refused before his key is admitted (under load
    # he may hear her beacon late, and connect only once his key is in)
    refusal = f"refused CURVE key {ring.public('bob').decode()}"
    poll_until(lambda: any(r.getMessage().startswith(refusal) for r in caplog.records), 10,
               "alice's ZAP to refuse bob's key")
    assert b.uuid not in a.peers() and not drain(b)
    shutil.copy(ring.root / "bob.key", ring.root / "allow-alice" / "bob.key")
    wait_for(a, match(ENTER, b.uuid))
    b.whisper(a.uuid, b"in")
    assert wait_for(a, match(WHISPER, b.uuid)).frames == (b"in",)
    a.whisper(b.uuid, b"back")
    assert wait_for(b, match(WHISPER, a.uuid), seen=seen).frames == (b"back",)
    assert [(e.type, e.reason) for e in seen if e.peer == a.uuid and e.type in (ENTER, EXIT)] \
        == [(ENTER, None)]
    assert b.stats()["sessions_restarted"] >= 1


def test_removing_a_key_removes_its_peer(nodes: Nodes, ring: KeyRing) -> None:
    a = nodes.start("alice", allow=["alice", "bob"])
    b = nodes.start("bob", allow=["alice", "bob"])
    mesh(a, b)
    (ring.root / "allow-alice-bob" / "bob.key").unlink()
    assert wait_for(a, match(EXIT, b.uuid)).reason == "key no longer allowed"


def test_hello_must_carry_the_key_it_authenticated_with(nodes: Nodes, ring: KeyRing) -> None:
    a = nodes.start("alice")
    ring.make("raw")
    identity = b"\x01" + bytes(range(16))
    from uuid import UUID
    raw_uuid = UUID(bytes=identity[1:])
    endpoint = "tcp://127.0.0.1:9"  # never connected: its key is the one checked
    for headers in ({}, {zre.PUBLIC_KEY_HEADER: ring.public("alice").decode()}):
        dealer = raw_dealer(ring.keys["raw"], ring.public("alice"), a.endpoint, identity)
        dealer.send_multipart(hello(endpoint, headers))
        dealer.close()
    honest = hello(endpoint, {zre.PUBLIC_KEY_HEADER: ring.public("raw").decode()}, "honest")
    for _ in range(5):  # a connection under an identity whose last one the node has not
        dealer = raw_dealer(ring.keys["raw"], ring.public("alice"), a.endpoint, identity)
        try:             # seen closed yet is ignored (no ROUTER_HANDOVER): dial again
            dealer.send_multipart(honest)
            event = next((e for e in iter(lambda: a.recv(2.0), None)
                          if match(ENTER, raw_uuid)(e)), None)
        finally:
            dealer.close()
        if event is not None:
            break
    assert event is not None, "the honest HELLO was never taken"
    assert event.name == "honest"  # the two HELLOs before it were ignored


def test_beacon_with_another_key_neither_removes_nor_redirects(nodes: Nodes,
                                                               ring: KeyRing) -> None:
    a = nodes.start("alice")
    b = nodes.start("bob")
    mesh(a, b)
    spoof = ring.make("spoofer").public_raw
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        target = ("127.255.255.255", nodes.port)
        udp.sendto(zre.encode_beacon(zre.Beacon(b.uuid.bytes, 0, spoof)), target)
        udp.sendto(zre.encode_beacon(zre.Beacon(b.uuid.bytes, 0, b"\x00" + spoof[1:])), target)
        udp.sendto(zre.encode_beacon(zre.Beacon(b.uuid.bytes, 0)), target)  # version 1
        udp.sendto(zre.encode_beacon(zre.Beacon(b.uuid.bytes, 40000, spoof)), target)
        hear_beacons(nodes.port, [b.uuid], times=2)  # the spoofs were read before these
    b.whisper(a.uuid, b"still here")
    seen: list = []
    wait_for(a, match(WHISPER, b.uuid), seen=seen)
    assert not [e for e in seen + drain(a) if e.type is EXIT]
    assert a.peer_address(b.uuid) == b.endpoint


def test_port_0_beacon_with_the_peers_key_removes_it(nodes: Nodes, ring: KeyRing) -> None:
    a = nodes.start("alice")
    b = nodes.start("bob")
    mesh(a, b)
    b.stop()
    assert wait_for(a, match(EXIT, b.uuid)).reason == "left"


def test_identity_of_a_peer_cannot_be_used_by_another_key(nodes: Nodes, ring: KeyRing) -> None:
    """Mallory, with a key of her own, connects under bob's routing identity: the
    mailbox ignores a second connection under a live identity (no ROUTER_HANDOVER),
    and the gate would drop its messages anyway; bob's link keeps working."""
    a = nodes.start("alice")
    b = nodes.start("bob")
    mesh(a, b)
    ring.make("mallory")
    dealer = raw_dealer(ring.keys["mallory"], ring.public("alice"), a.endpoint,
                        b"\x01" + b.uuid.bytes)
    try:
        dealer.send_multipart([zre.whisper_header(2), b"forged"])
        dealer.send_multipart(hello(b.endpoint, {zre.PUBLIC_KEY_HEADER:
                                                 ring.public("mallory").decode()}))
        dealer.send_multipart([zre.whisper_header(3), b"forged"])
        b.whisper(a.uuid, b"genuine")
        seen: list = []
        got = wait_for(a, lambda e: e.type is WHISPER and e.peer == b.uuid, seen=seen)
        assert got.frames == (b"genuine",)
        assert not [e for e in seen if e.type is not WHISPER and e.peer == b.uuid]
        assert b.uuid in a.peers()
    finally:
        dealer.close()


def test_secure_and_plain_sockets_never_meet(nodes: Nodes, ring: KeyRing) -> None:
    a = nodes.start("alice")
    plain = zmq.Context.instance().socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    plain.setsockopt(zmq.IDENTITY, b"\x01" + bytes(16))
    plain.connect(a.endpoint)
    plain.send_multipart(hello("tcp://127.0.0.1:9", {}))
    plain.close()
    b = nodes.start("bob")
    mesh(a, b)
    assert len(a.peers()) == 1


@pytest.mark.parametrize("settings, match_text", [
    ({"key_file": "/nonexistent/node.key_secret"}, "no key file"),
    ({"key_file": "PUBLIC"}, "holds no secret key"),
    ({"key_file": "SECRET", "allowed_keys": "/nonexistent/allowed"}, "no directory"),
])
def test_bad_key_settings_fail_clearly(ring: KeyRing, settings: dict, match_text: str) -> None:
    ring.make("n")
    paths = {"PUBLIC": str(ring.root / "n.key"), "SECRET": ring.secret("n")}
    settings = {k: paths.get(v, v) for k, v in settings.items()}
    with pytest.raises(KeyFileError, match=match_text):
        ThreadedNode("n", config=NodeConfig(), interface="lo", **settings).start()


def test_allowed_keys_needs_a_key_file() -> None:
    with pytest.raises(ValueError, match="allowed_keys needs key_file"):
        NodeConfig(allowed_keys="/tmp")


def test_nodes_of_one_process_with_other_allowlists_each_admit_their_own_keys(
        nodes: Nodes, ring: KeyRing) -> None:
    # no zap_domain: each allowlist answers for a ZAP domain of its own
    a = nodes.start("a", allow=["a", "a2"])
    b = nodes.start("b", allow=["b", "b2"])
    for node, own, other in ((a, "a2", "b2"), (b, "b2", "a2")):
        server = ring.public(node.name)
        assert handshake(ring.keys[own], server, node.endpoint)
        assert not handshake(ring.keys[other], server, node.endpoint)
    mesh(a, nodes.start("a2", allow=["a", "a2"]))
    mesh(b, nodes.start("b2", allow=["b", "b2"]))


def test_a_named_zap_domain_admits_the_keys_of_one_allowlist(nodes: Nodes) -> None:
    nodes.start("a", allow=["a"], zap_domain="mesh")
    with pytest.raises(CurveError, match="ZAP domain 'mesh' already admits .*allow-a"):
        nodes.start("b", allow=["b"], zap_domain="mesh")


def test_reload_call_admits_a_key_added_behind_the_directorys_back(nodes: Nodes,
                                                                   ring: KeyRing) -> None:
    a = nodes.start("alice", allow=["alice"], evasive=0.5)
    b = nodes.start("bob", evasive=0.5)
    directory = ring.root / "allow-alice"
    stamp = directory.stat().st_mtime_ns
    shutil.copy(ring.root / "bob.key", directory / "bob.key")
    os.utime(directory, ns=(stamp, stamp))  # the change goes unnoticed: only a reload sees it
    hear_beacons(nodes.port, [a.uuid, b.uuid])
    assert b.uuid not in a.peers()
    assert a.call(lambda node: node.reload_allowed_keys()) == 2
    mesh(a, b)


def test_reload_without_allowed_keys_is_refused(nodes: Nodes) -> None:
    a = nodes.start("alice")
    with pytest.raises(NodeStateError, match="no allowed_keys directory"):
        a.call(lambda node: node.reload_allowed_keys())


def test_forged_port_0_beacon_with_the_right_key_cannot_cut_off_a_live_peer(
        nodes: Nodes, ring: KeyRing, caplog: pytest.LogCaptureFixture) -> None:
    a = nodes.start("alice")
    b = nodes.start("bob")
    mesh(a, b)
    caplog.set_level(logging.DEBUG, "peermesh.zre.curve")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        udp.sendto(zre.encode_beacon(zre.Beacon(b.uuid.bytes, 0, ring.keys["bob"].public_raw)),
                   ("127.255.255.255", nodes.port))
    deadline = time.monotonic() + 10
    # bob's authenticated link is open: alice PINGs bob; bob answers, and alice ignores
    # the beacon
    while not a.stats()["leaves_ignored"]:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.01)
    assert b.uuid in a.peers()
    assert not [e for e in drain(a) if e.type is EXIT]


def test_asyncio_face_with_keys(nodes: Nodes, ring: KeyRing) -> None:
    import asyncio

    from peermesh.aio import AsyncNode

    bob = nodes.start("bob")

    async def main() -> str:
        async with AsyncNode("alice", config=NodeConfig(), interface="lo", port=nodes.port,
                             interval=0.1, key_file=ring.secret("alice")) as alice:
            while True:
                event = await alice.recv(10)
                assert event is not None, "bob did not enter"
                if event.type is ENTER and event.peer == bob.uuid:
                    await alice.whisper(bob.uuid, b"from asyncio")
                    return event.headers[zre.PUBLIC_KEY_HEADER]

    assert asyncio.run(main()) == ring.public("bob").decode()
    assert wait_for(bob, match(WHISPER)).frames == (b"from asyncio",)
