"""Liveness timers driven by a fake clock: EVASIVE, PING/PING-OK, SILENT, EXIT "expired".

The watched node gets ``clock=FakeClock()``. Its reaper still wakes every
``min(interval, evasive / 2)`` real seconds (here 0.05 s) but judges silence
by the fake clock, which the tests move forward. The timeouts are hundreds
of fake seconds, so nothing here can happen by real time passing.

The silent peers are raw ZRE peers (bare ZeroMQ sockets speaking the wire
codec) or a ``Node`` whose beacon interval is huge, so beacons do not
refresh them unless a test sends one.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Optional

import gevent
import gevent.event
import pytest
import zmq
import zmq.green as gzmq

import waiting
from peermesh import Event, EventType, Node, NodeConfig
from peermesh.wire import zre

ENTER, EXIT, WHISPER = EventType.ENTER, EventType.EXIT, EventType.WHISPER
EVASIVE, SILENT = EventType.EVASIVE, EventType.SILENT

INTERVAL = 0.05
TIMEOUT = 5.0


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float = TIMEOUT) -> Event:
    """``waiting.wait_for`` with this module's bound."""
    return waiting.wait_for(node, predicate, timeout)


drain = waiting.drain
EVASIVE_S, SILENT_S, EXPIRED_S = 100.0, 200.0, 300.0  # fake seconds


class FakeClock:
    """A clock that moves only when told to, and counts how often it is read."""

    def __init__(self, start: float = 10_000.0) -> None:
        self.now = start
        self.reads = 0
        self._read = gevent.event.Event()

    def __call__(self) -> float:
        self.reads += 1
        self._read.set()
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wait_reads(self, count: int, timeout: float = TIMEOUT) -> None:
        """Wait until the clock has been read ``count`` more times.

        With no traffic, only the reaper reads it, once per pass, and a pass
        runs without yielding: when this returns, a whole pass has judged
        the peers at the current time.
        """
        target = self.reads + count
        deadline = time.monotonic() + timeout
        while self.reads < target:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the reaper stopped reading the clock"
            self._read.clear()
            self._read.wait(remaining)




def about(peer: uuid.UUID) -> Callable[[Event], bool]:
    return lambda event: event.peer == peer




class RawPeer:
    """A hand-driven ZRE peer: a ROUTER mailbox and, once it says HELLO, a DEALER."""

    def __init__(self, name: str = "raw") -> None:
        self.uuid = uuid.uuid4()
        self.name = name
        self.context = gzmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1", 0xC000, 0x10000)
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.port = port
        self.dealer: Optional[zmq.Socket] = None
        self.sequence = 0

    def next_sequence(self) -> int:
        self.sequence = zre.next_sequence(self.sequence)
        return self.sequence

    def hello(self, endpoint: str) -> None:
        """Connect to a node's mailbox and say HELLO (the node then connects back)."""
        self.dealer = self.context.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        self.dealer.setsockopt(zmq.IDENTITY, b"\x01" + self.uuid.bytes)
        self.dealer.connect(endpoint)
        self.send(zre.Hello(self.next_sequence(), self.endpoint, (), 0, self.name, {}))

    def send(self, message: zre.Message) -> None:
        assert self.dealer is not None
        self.dealer.send_multipart(zre.encode(message))

    def recv(self, timeout: float = TIMEOUT) -> zre.Message:
        """The next command that reached the mailbox."""
        with gevent.Timeout(timeout, AssertionError(f"{self.name}: no command in {timeout}s")):
            frames = self.router.recv_multipart()
        return zre.decode(frames[1:])

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture
def beacon_port(free_udp_port: int) -> int:
    return free_udp_port


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    """Things (nodes, raw peers) to stop or close at teardown, last first."""
    things: list[Any] = []
    yield things
    for thing in reversed(things):
        if isinstance(thing, RawPeer):
            thing.close()
        else:
            thing.stop(timeout=0.5)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def watcher(clock: FakeClock, beacon_port: int, cleanup: list[Any]) -> Node:
    """The node under test, on the fake clock."""
    node = Node("watcher", config=NodeConfig(), clock=clock, interface="lo", port=beacon_port,
                interval=INTERVAL, evasive=EVASIVE_S, silent=SILENT_S, expired=EXPIRED_S)
    cleanup.append(node)
    return node.start()


def enter_raw_peer(watcher: Node, cleanup: list[Any], name: str = "raw") -> RawPeer:
    """A raw peer the watcher has ENTERed; it sends no beacons and answers nothing."""
    peer = RawPeer(name)
    cleanup.append(peer)
    peer.hello(watcher.endpoint)
    entered = wait_for(watcher, lambda e: e.type is ENTER)
    assert (entered.peer, entered.name) == (peer.uuid, name)
    hello = peer.recv()
    assert isinstance(hello, zre.Hello) and hello.sequence == 1
    return peer


@pytest.fixture
def raw_peer(watcher: Node, cleanup: list[Any]) -> RawPeer:
    return enter_raw_peer(watcher, cleanup)


def test_silence_gives_evasive_once_then_silent_then_expired(watcher, raw_peer, clock):
    clock.advance(EVASIVE_S + 1)
    event = wait_for(watcher, about(raw_peer.uuid))
    assert (event.type, event.name) == (EVASIVE, "raw")
    ping = raw_peer.recv()
    assert isinstance(ping, zre.Ping) and ping.sequence == 2

    # Past the next PING and past silent: the reaper PINGs again, reports SILENT,
    # and does not report EVASIVE a second time for the same silence.
    clock.advance(SILENT_S - EVASIVE_S + 1)
    ping = raw_peer.recv()
    assert isinstance(ping, zre.Ping) and ping.sequence == 3
    assert [(e.type, e.peer) for e in drain(watcher)] == [(SILENT, raw_peer.uuid)]
    assert watcher.peers() == [raw_peer.uuid]

    raw_peer.close()  # really gone now
    clock.advance(EXPIRED_S - SILENT_S)
    event = wait_for(watcher, about(raw_peer.uuid))
    assert (event.type, event.reason, event.name) == (EXIT, "expired", "raw")
    assert watcher.peers() == []
    assert drain(watcher) == []


def test_silence_is_measured_per_peer(watcher, raw_peer, clock, cleanup):
    """A peer heard from later is not evasive when an earlier one is: the reaper
    pass that reports one would report the other too."""
    clock.advance(EVASIVE_S / 2)
    later = enter_raw_peer(watcher, cleanup, "later")
    clock.advance(EVASIVE_S / 2 + 1)  # raw_peer silent for EVASIVE_S + 1, later for half
    event = wait_for(watcher, lambda e: e.type is EVASIVE)
    assert event.peer == raw_peer.uuid
    assert drain(watcher) == []  # the rest of that reaper pass: nothing about later
    clock.advance(EVASIVE_S / 2)
    event = wait_for(watcher, lambda e: e.type in (EVASIVE, SILENT))
    assert (event.type, event.peer) == (EVASIVE, later.uuid)
    assert isinstance(later.recv(), zre.Ping)


def test_ping_ok_ends_the_silence(watcher, clock, beacon_port, cleanup):
    """A quiet Node (no beacons after its first) answers the PING; its PING-OK
    refreshes it, so the next silence starts from there."""
    quiet = Node("quiet", config=NodeConfig(), interface="lo", port=beacon_port,
                 interval=10_000.0)
    cleanup.append(quiet)
    quiet.start()
    wait_for(watcher, lambda e: e.type is ENTER and e.peer == quiet.uuid)

    clock.advance(EVASIVE_S + 1)
    assert wait_for(watcher, about(quiet.uuid)).type is EVASIVE
    # The PING-OKs of quiet (to the reaper's PING, then to flush's) have been handled
    # once flush returns True.
    watcher.whisper(quiet.uuid, b"sync")
    assert watcher.flush(TIMEOUT) is True

    # Refreshed at EVASIVE_S + 1, a new silence of EVASIVE_S + 1 is evasive again but
    # not silent; without the refresh it would be SILENT (2 * EVASIVE_S + 2 > SILENT_S).
    clock.advance(EVASIVE_S + 1)
    event = wait_for(watcher, about(quiet.uuid))
    assert event.type is EVASIVE, event
    assert drain(watcher) == []
    assert watcher.peers() == [quiet.uuid]


def test_beacons_refresh_a_peer(watcher, raw_peer, clock, beacon_port):
    """While beacons flow no silence builds up, though fake time passes expired."""
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    markers: list[RawPeer] = []

    def beacon(peer_uuid: uuid.UUID, port: int) -> None:
        sender.sendto(zre.encode_beacon(zre.Beacon(peer_uuid.bytes, port)),
                      ("127.255.255.255", beacon_port))

    def beacon_handled() -> None:
        """Beacon from a new UUID: the watcher answers it with a HELLO, so it has
        handled every datagram sent before it on this socket."""
        marker = RawPeer("marker")
        markers.append(marker)
        beacon(marker.uuid, marker.port)
        assert isinstance(marker.recv(), zre.Hello)

    try:
        steps = 8
        for step in range(steps):
            clock.advance(EVASIVE_S * 0.9)
            beacon(raw_peer.uuid, raw_peer.port)
            beacon_handled()
            clock.wait_reads(2)  # a whole reaper pass at this time
            events = drain(watcher)
            assert not [e for e in events if e.peer == raw_peer.uuid], (step, events)
        assert steps * EVASIVE_S * 0.9 > EXPIRED_S
        assert watcher.peers() == [raw_peer.uuid]

        # Now the beacons stop, and the silence is noticed.
        clock.advance(EVASIVE_S + 1)
        assert wait_for(watcher, about(raw_peer.uuid)).type is EVASIVE
    finally:
        sender.close()
        for marker in markers:
            marker.close()


def test_any_message_refreshes_a_peer(watcher, raw_peer, clock):
    """Mailbox traffic counts as a sign of life too."""
    clock.advance(EVASIVE_S + 1)
    assert wait_for(watcher, about(raw_peer.uuid)).type is EVASIVE
    assert isinstance(raw_peer.recv(), zre.Ping)
    raw_peer.send(zre.PingOk(raw_peer.next_sequence()))
    raw_peer.send(zre.Whisper(raw_peer.next_sequence(), (b"alive",)))
    event = wait_for(watcher, about(raw_peer.uuid))
    assert (event.type, event.frames) == (WHISPER, (b"alive",))

    clock.advance(EVASIVE_S + 1)  # refreshed: evasive again, not silent
    assert wait_for(watcher, about(raw_peer.uuid)).type is EVASIVE
    assert drain(watcher) == []
