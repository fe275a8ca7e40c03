"""Floods from the hostile-network report, made small, against live nodes on loopback.

Each test floods the target of ``test_hostile``'s mesh (a target and a good
peer chatting both ways) and then checks that the target's tables stayed
within their limits (``ThreadedNode.stats``), that it still serves the good
peer, and that a real newcomer still gets in.
"""

from __future__ import annotations

import os
import socket
import uuid as uuid_module
from typing import Callable

import pytest

from peermesh import ThreadedNode
from peermesh.events import EventType
from peermesh.wire import zre

try:  # tests/ as a package
    from ..flooding import flood, wait_shed
    from .test_hostile import (WAIT, Mesh, RawPeer, beacon_barrier, enter_raw, hello_frame,
                               make_raw)
    from ..waiting import poll_until
except ImportError:  # tests/ and tests/zre on sys.path (pytest's "prepend" import mode)
    from flooding import flood, wait_shed
    from test_hostile import (WAIT, Mesh, RawPeer, beacon_barrier, enter_raw, hello_frame,
                              make_raw)
    from waiting import poll_until

__all__ = ["make_raw"]  # a fixture, used by name

ENTER, WHISPER = EventType.ENTER, EventType.WHISPER


@pytest.fixture
def bounded(free_udp_port: int, request: pytest.FixtureRequest) -> Mesh:
    """The hostile-test mesh with a target of small limits."""
    # (max_connections: max_peers + max_pending = 40; the mailbox never sheds the good
    # peer's connection, see test_a_talking_peers_connection_is_never_shed)
    mesh = Mesh(free_udp_port, max_pending=16, max_unproven=16, max_peers=24, max_groups=64,
                max_hello=8192, max_message=65536,
                interval=0.2)  # a pending peer may be replaced after 0.2 s
    request.addfinalizer(mesh.close)
    return mesh.start()


def accepted_at(port: int) -> set[int]:
    """The remote ports of the established IPv4 TCP connections to local ``port``."""
    found = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            local, remote, state = line.split()[1:4]
            if state == "01" and int(local.rpartition(":")[2], 16) == port:
                found.add(int(remote.rpartition(":")[2], 16))
    return found


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_beacons_from_random_uuids_at_closed_ports(bounded: Mesh,
                                                   make_raw: Callable[..., RawPeer]) -> None:
    # 30,000 such beacons made 3,679 peers, fds 18 -> 3,696 and a stalled hub.
    target = bounded.target
    assert target is not None
    before = open_descriptors()
    raw = make_raw()
    closed = []  # ports bound but not listening: connections to them are refused
    for _ in range(50):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        closed.append(sock)
    try:
        for burst in range(10):
            for i in range(200):
                port = closed[i % len(closed)].getsockname()[1]
                raw.beacon(bounded.port, port, uuid=uuid_module.uuid4())
            beacon_barrier(bounded, make_raw)  # each probe is a newcomer that gets in
    finally:
        for sock in closed:
            sock.close()
    stats = target.stats()
    assert stats["pending"] <= 16 and stats["pending_refused"] > 0, stats
    # Both nodes hear the flood: at most 16 (target) and 64 (the good peer's default
    # max_pending) DEALERs of two descriptors each, plus the raw peers' own.
    assert open_descriptors() - before < 2 * (16 + 64) + 60, "descriptors past the bounds"
    newcomer = make_raw(name="newcomer")
    enter_raw(bounded, newcomer)
    bounded.assert_serving()
    assert bounded.raw_enters() == [newcomer.uuid]


def test_hellos_from_many_identities_wait_at_most_max_unproven(
        bounded: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # 5,000 HELLOs from distinct identities gave 4,298 fake ready peers, and then (with
    # max_peers following the descriptors) 5,000 and 271 MB.
    target = bounded.target
    assert target is not None
    for i in range(40):
        fake = make_raw(name=f"fake{i}")
        fake.connect(bounded.endpoint)
        fake.hello()
    # Nothing proves the fakes (no beacon, no PING-OK): 16 (max_unproven) wait for it; each
    # other HELLO sheds the oldest once that had hello_timeout to answer a PING, or waits for a
    # beacon, refused after hello_timeout (5 s); the connections that are no peer's are over
    # 16, so the mailbox holds its accepts a while (accept_held): the last fakes connect,
    # and say HELLO, when their SYN comes again (1 s later, then 3 s)
    stats = poll_until(lambda: (s := target.stats())["unproven_refused"]
                       + s["unproven_shed"] >= 24 and s, 5.0 + 2 * WAIT,
                       "the target to handle every HELLO")
    assert stats["peers"] == 1 + 16 and stats["unproven_refused"] + stats["unproven_shed"] == 24
    assert stats["peers_refused"] == 0, stats
    bounded.assert_serving()


def test_a_talking_peers_connection_is_never_shed(bounded: Mesh,
                                                 make_raw: Callable[..., RawPeer]) -> None:
    # The mailbox shed, past its cap, the connections that sent under 1 KiB oldest first,
    # then those that sent the fewest octets: a peer that had said HELLO and chatted a
    # little went before newer connections that sent more, and what it had in flight was
    # lost (the next command a sequence gap: sequence_resyncs +1, EXIT and ENTER).
    target = bounded.target
    assert target is not None
    port = int(bounded.endpoint.rpartition(":")[2])
    good = accepted_at(port)  # the good peer's connection, the only one yet
    assert len(good) == 1, good
    for i in range(60):  # each sends more than the good peer did: a command before HELLO
        loud = make_raw(name=f"loud{i}")
        loud.connect(bounded.endpoint)
        loud.send([zre.SIGNATURE.to_bytes(2, "big") + b"\x02\x02\x00\x07", b"x" * 32768])
    # max_connections 40 (max_peers 24 + max_pending 16); at most 16 (max_unproven) no peer's
    wait_shed(lambda name: target.stats()[name], at_least=60 - 16)
    # the mailbox holds its accepts meanwhile (accept_held): the rest get in in waves
    with flood(port, 100, wait=False):  # idle connections too, without a handshake
        wait_shed(lambda name: target.stats()[name], at_least=60 - 16 + 100 // 2)
        bounded.assert_serving()  # the chatter complete and in order, no EXIT of the peer
        assert good <= accepted_at(port), "the good peer's connection was shed"
    assert target.stats()["sequence_resyncs"] == 0 and target.stats()["accept_held"] >= 1
    assert bounded.good is not None and bounded.good.stats()["sequence_resyncs"] == 0


def test_hello_with_too_many_groups_is_refused_at_once(bounded: Mesh,
                                                       make_raw: Callable[..., RawPeer]) -> None:
    # One HELLO listing 500k groups stopped the hub (40k groups: 32 s).
    raw = make_raw()
    raw.connect(bounded.endpoint)
    groups = [b"g%d" % i for i in range(1500)]  # 8 KB of HELLO, past max_groups=64
    raw.send([hello_frame(raw.endpoint.encode(), groups=groups[:64 + 1])])
    raw.send([hello_frame(raw.endpoint.encode(), groups=groups)])
    enter_raw(bounded, raw)  # a HELLO within the bounds, behind them on the connection
    bounded.assert_serving()
    assert bounded.raw_enters() == [raw.uuid]
    assert bounded.target is not None
    assert bounded.target.stats()["hellos_refused"] == 2


def test_whispers_to_an_application_that_does_not_read(make_raw: Callable[..., RawPeer],
                                                       free_udp_port: int) -> None:
    # 60 x 20 MB whispers to an application that does not read grew RSS to 1.17 GB; then a
    # bound that dropped what did not fit lost whispers a PING-OK had confirmed, and let
    # the queue hold a whole message more than the bound.
    with ThreadedNode("sink", interface="lo", port=free_udp_port, discovery=(),
                      max_message=2_000_000, event_queue_bytes=3_000_000) as sink:
        raw = make_raw()
        raw.connect(sink.endpoint)  # type: ignore[arg-type]
        raw.hello()
        for _ in range(20):
            raw.whisper(b"x" * 1_000_000)
        raw.ping()
        # the application reads nothing: the queue fills to its bound, no further
        poll_until(lambda: sink.stats()["event_queue_bytes"] == 3_000_000, WAIT, "a full queue")
        events = []
        while len(events) < 21:
            event = sink.recv(WAIT)
            assert event is not None, f"{len(events)} events came"
            events.append(event)
            assert sink.stats()["event_queue_bytes"] <= 3_000_000
        assert [e.type for e in events] == [ENTER] + [WHISPER] * 20  # none lost
        raw.expect(zre.PingOk, timeout=10)  # handled once every whisper before it was queued
        assert sink.stats()["events_dropped"] == 0
        raw.whisper(b"read again")
        event = sink.recv(WAIT)
        assert event is not None and event.frames == (b"read again",)


def test_a_flood_from_one_address_does_not_keep_a_real_peer_out(
        free_udp_port: int, make_raw: Callable[..., RawPeer]) -> None:
    # One host (127.0.0.2) makes up UUIDs, by beacons and by HELLOs, enough to fill
    # max_peers many times over; it gets max_peers_per_address of them.
    mesh = Mesh(free_udp_port, max_pending=16, max_peers=24, max_peers_per_address=8,
                interval=0.2)
    try:
        mesh.start()
        target = mesh.target
        assert target is not None
        flooder = make_raw(address="127.0.0.2")
        closed = []  # ports bound but not listening: connections to them are refused
        for _ in range(40):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            closed.append(sock)
        try:
            for sock in closed:
                flooder.beacon(mesh.port, sock.getsockname()[1], uuid=uuid_module.uuid4())
            beacon_barrier(mesh, make_raw)
        finally:
            for sock in closed:
                sock.close()
        for i in range(40):
            fake = make_raw(name=f"fake{i}", address="127.0.0.2")
            fake.connect(mesh.endpoint, reconnect=False)  # so that the count below holds still
            fake.hello()
        # of the 40 connections from there the mailbox keeps 8 (and the good peer's) ...
        stats = poll_until(lambda: (s := target.stats())["connections_shed"] >= 32 and s, WAIT,
                           "the mailbox to shed the connections past the address's share")
        assert stats["connections"] == 1 + 8, stats
        # ... and the table 8 of its peers (and the good one): 32 beacons and more HELLOs
        # were refused
        assert stats["peers"] <= 1 + 8 and stats["address_refused"] >= 32, stats
        with ThreadedNode("newcomer", interface="lo", port=mesh.port, interval=0.2) as real:
            poll_until(lambda: real.uuid in target.peers() and target.uuid in real.peers(),
                       WAIT, "the real newcomer and the target to meet")
        mesh.assert_serving()
        # another host's peer still gets in too: the bound is per address
        other = make_raw(name="other", address="127.0.0.3")
        enter_raw(mesh, other)
    finally:
        mesh.close()
