"""The gevent ``Node``: several nodes in one process, meshing over loopback.

Every node runs on ``lo`` with its own free UDP beacon port (never 5670) and
a short beacon interval, so discovery takes milliseconds. Every wait is
bounded: ``wait_for`` reads events until one matches and fails with what it
saw. Every node is stopped by the ``make_node`` fixture, also on failure.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Optional

import gevent
import gevent.socket
import pytest
import zmq

import waiting
from peermesh import (Event, EventType, InterfaceError, Node, NodeConfig, NodeStateError,
                      PeerNotResponding, UnknownPeerError)
from peermesh.wire import zre
from rawpeer import RawPeer

pytestmark = pytest.mark.usefixtures("zmq_path")  # native C batches and pyzmq alone

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
WHISPER, SHOUT, STOP = EventType.WHISPER, EventType.SHOUT, EventType.STOP

INTERVAL = 0.05   # seconds between beacons: discovery within a few milliseconds
TIMEOUT = 5.0     # bound on any wait for something that should take milliseconds


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float = TIMEOUT) -> Event:
    """``waiting.wait_for`` with this module's bound."""
    return waiting.wait_for(node, predicate, timeout)


drain = waiting.drain

Predicate = Callable[[Event], bool]


# --------------------------------------------------------------------------
# Helpers


class match:
    """A predicate on events: ``match(ENTER, peer=uuid, group="g", name=...)``."""

    def __init__(self, type: EventType, peer: Optional[uuid.UUID] = None,
                 group: Optional[str] = None, **fields: Any) -> None:
        self.type, self.peer, self.group, self.fields = type, peer, group, fields

    def __call__(self, event: Event) -> bool:
        return (event.type is self.type
                and (self.peer is None or event.peer == self.peer)
                and (self.group is None or event.group == self.group)
                and all(getattr(event, k) == v for k, v in self.fields.items()))

    def __repr__(self) -> str:
        parts = [self.type.value]
        if self.peer is not None:
            parts.append(f"peer={self.peer.hex[:8]}")
        if self.group is not None:
            parts.append(f"group={self.group!r}")
        parts += [f"{k}={v!r}" for k, v in self.fields.items()]
        return f"match({', '.join(parts)})"


def about(peer: uuid.UUID) -> Predicate:
    """Any event concerning ``peer``."""
    return lambda event: event.peer == peer






def wait_all(node: Any, predicates: Iterable[Predicate], timeout: float = TIMEOUT) -> list[Event]:
    """Read events until each predicate has matched one (any order); return all read."""
    wanted = list(predicates)
    deadline = time.monotonic() + timeout
    seen: list[Event] = []
    while wanted:
        remaining = deadline - time.monotonic()
        event = node.recv(remaining) if remaining > 0 else None
        if event is None:
            pytest.fail(f"{node.name}: still waiting for {wanted} after {timeout}s; "
                        f"saw {waiting.seen_text(seen)}")
        seen.append(event)
        for predicate in wanted:
            if predicate(event):
                wanted.remove(predicate)
                break
    return seen




def mesh(*nodes: Node) -> None:
    """Wait until every node has seen every other ENTER and JOIN its start groups."""
    for node in nodes:
        wanted: list[Predicate] = []
        for other in nodes:
            if other is not node:
                wanted.append(match(ENTER, other.uuid))
                wanted += [match(JOIN, other.uuid, group) for group in other.groups()]
        wait_all(node, wanted)


def assert_mailbox_endpoint(address: str) -> int:
    """``address`` is ``tcp://127.0.0.1:PORT`` with PORT in ZRE's ephemeral range."""
    found = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", address)
    assert found, address
    port = int(found.group(1))
    assert 0xC000 <= port <= 0xFFFF, address
    return port


@pytest.fixture
def make_node(free_udp_port: int) -> Iterator[Callable[..., Node]]:
    """``make_node(name, start=True, **settings)``: a loopback node, stopped at teardown."""
    nodes: list[Node] = []

    def make(name: Optional[str] = None, *, start: bool = True, **settings: Any) -> Node:
        settings.setdefault("interface", "lo")
        settings.setdefault("port", free_udp_port)
        settings.setdefault("interval", INTERVAL)
        node = Node(name, config=NodeConfig(), **settings)
        nodes.append(node)
        return node.start() if start else node

    yield make
    errors = []
    for node in reversed(nodes):
        try:
            node.stop(timeout=0.5)
        except Exception as exc:  # stop the others anyway
            errors.append(exc)
    if errors:
        raise errors[0]


# --------------------------------------------------------------------------
# Discovery: ENTER, the peer view


def test_enter_both_ways_carries_uuid_name_headers_and_address(make_node):
    alice = make_node("alice", headers={"role": "left", "x-extra": "1"})
    bob = make_node("bob", headers={"role": "right"})

    seen_by_alice = wait_for(alice, match(ENTER, bob.uuid))
    seen_by_bob = wait_for(bob, match(ENTER, alice.uuid))

    assert seen_by_alice.name == "bob"
    assert seen_by_alice.headers == {"role": "right"}
    assert seen_by_alice.address == bob.endpoint
    assert_mailbox_endpoint(seen_by_alice.address)
    assert seen_by_bob.name == "alice"
    assert seen_by_bob.headers == {"role": "left", "x-extra": "1"}
    assert seen_by_bob.address == alice.endpoint
    assert_mailbox_endpoint(seen_by_bob.address)

    assert alice.peers() == [bob.uuid]
    assert bob.peers() == [alice.uuid]
    assert alice.peer_name(bob.uuid) == "bob"
    assert alice.peer_address(bob.uuid) == bob.endpoint
    assert alice.peer_headers(bob.uuid) == {"role": "right"}
    assert alice.peer_header_value(bob.uuid, "role") == "right"
    assert alice.peer_header_value(bob.uuid, "missing") is None
    assert bob.peer_header_value(alice.uuid, "x-extra") == "1"
    info = bob.peer_info(alice.uuid)
    assert (info.uuid, info.name, info.address) == (alice.uuid, "alice", alice.endpoint)
    assert info.to_dict()["peer"] == alice.uuid.hex


def test_first_beacon_goes_out_at_once(make_node):
    """With a beacon interval of hours, only the beacon sent by start() can make the
    second node known to the first."""
    first = make_node("first", interval=10_000.0)
    second = make_node("second", interval=10_000.0)
    wait_for(first, match(ENTER, second.uuid))
    wait_for(second, match(ENTER, first.uuid))


def test_lone_node_does_not_see_itself(make_node, free_udp_port):
    """A node discards its own beacons: it never ENTERs itself."""
    sniffer = gevent.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sniffer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sniffer.bind(("", free_udp_port))
        lone = make_node("lone")
        # The node's own listener gets every beacon this sniffer gets.
        own = 0
        with gevent.Timeout(TIMEOUT, AssertionError("the node sends no beacons")):
            while own < 5:
                data, _ = sniffer.recvfrom(64)
                own += data[4:20] == lone.uuid.bytes
    finally:
        sniffer.close()
    assert lone.peers() == []
    assert drain(lone) == []

    # The first peer it reports is a real one.
    other = make_node("other")
    assert wait_for(lone, lambda e: True).peer == other.uuid
    assert lone.peers() == [other.uuid]


# --------------------------------------------------------------------------
# Groups


def test_join_at_start_join_later_and_leave(make_node):
    alice = make_node("alice", groups=["g1", "g2"])
    bob = make_node("bob")
    wait_all(bob, [match(ENTER, alice.uuid), match(JOIN, alice.uuid, "g1"),
                   match(JOIN, alice.uuid, "g2")])
    wait_for(alice, match(ENTER, bob.uuid))
    assert alice.groups() == ["g1", "g2"]
    assert bob.groups() == []
    assert bob.peer_groups(alice.uuid) == ["g1", "g2"]
    assert bob.peers_by_group("g1") == [alice.uuid]
    assert bob.known_groups() == ["g1", "g2"]
    assert alice.known_groups() == []

    alice.join("later")
    event = wait_for(bob, match(JOIN, alice.uuid))
    assert (event.group, event.name) == ("later", "alice")
    assert bob.peer_groups(alice.uuid) == ["g1", "g2", "later"]
    assert alice.groups() == ["g1", "g2", "later"]

    alice.leave("g1")
    event = wait_for(bob, lambda e: e.type in (JOIN, LEAVE))
    assert (event.type, event.peer, event.group) == (LEAVE, alice.uuid, "g1")
    assert bob.peers_by_group("g1") == []
    assert bob.known_groups() == ["g2", "later"]
    assert alice.groups() == ["g2", "later"]

    # Joining a group twice, or leaving one not joined, tells nobody anything:
    # the next change bob hears of is the marker.
    alice.join("g2")
    alice.leave("never-joined")
    alice.join("marker")
    event = wait_for(bob, lambda e: e.type in (JOIN, LEAVE))
    assert (event.type, event.group) == (JOIN, "marker")

    bob.join("g2")
    wait_for(alice, match(JOIN, bob.uuid, "g2"))
    assert sorted(alice.peers_by_group("g2")) == sorted([bob.uuid])
    assert alice.known_groups() == ["g2"]


def test_more_than_256_join_leave_cycles(make_node):
    """The one-octet group status wraps; the peer keeps exact membership and the link."""
    alice = make_node("alice")
    bob = make_node("bob")
    mesh(alice, bob)
    cycles = 300
    for _ in range(cycles):
        alice.join("cycle")
        alice.leave("cycle")
    alice.join("cycle")

    changes = []
    deadline = time.monotonic() + TIMEOUT
    while len(changes) < 2 * cycles + 1:
        event = bob.recv(max(0.0, deadline - time.monotonic()))
        assert event is not None, f"only {len(changes)} JOIN/LEAVE arrived"
        assert event.type is not EXIT, f"bob lost alice: {event!r}"
        assert event.peer == alice.uuid and event.group == "cycle", event
        changes.append(event.type)
    assert changes == [JOIN, LEAVE] * cycles + [JOIN]
    assert bob.peer_groups(alice.uuid) == ["cycle"]
    assert bob.peers_by_group("cycle") == [alice.uuid]

    alice.whisper(bob.uuid, b"still here")
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"still here",)
    assert bob.peers() == [alice.uuid]


# --------------------------------------------------------------------------
# Messages


def test_shout_with_several_frames_reaches_only_group_members(make_node):
    alice = make_node("alice", groups=["g"])
    bob = make_node("bob", groups=["g"])
    carol = make_node("carol")
    mesh(alice, bob, carol)

    frames = (b"one", b"", b"\x00\xff\x01", "text")
    alice.shout("g", *frames)
    event = wait_for(bob, match(SHOUT, alice.uuid))
    assert event.group == "g"
    assert event.name == "alice"
    assert event.frames == (b"one", b"", b"\x00\xff\x01", b"text")

    # carol is not in g: whatever alice sent her before the marker has arrived.
    alice.whisper(carol.uuid, b"marker")
    before = []
    while (event := carol.recv(TIMEOUT)) is not None and event.type is not WHISPER:
        before.append(event)
    assert event is not None and event.frames == (b"marker",), before
    assert not any(e.type is SHOUT for e in before), before

    # A node does not hear its own shout; bob's reply reaches alice but not carol.
    bob.shout("g", b"reply")
    assert wait_for(alice, lambda e: e.type is SHOUT).peer == bob.uuid
    bob.whisper(carol.uuid, b"marker 2")
    event = wait_for(carol, lambda e: e.type in (SHOUT, WHISPER))
    assert event.frames == (b"marker 2",)

    # A node outside a group may shout to it; the members hear it.
    carol.shout("g", b"from outside")
    for member in (alice, bob):
        event = wait_for(member, match(SHOUT, carol.uuid))
        assert (event.group, event.frames) == ("g", (b"from outside",))

    alice.shout("nobody-here", b"lost")  # a group without members: nothing to do


def test_whisper_by_uuid_and_by_hex_string(make_node):
    alice = make_node("alice")
    bob = make_node("bob")
    mesh(alice, bob)
    alice.whisper(bob.uuid, b"by uuid")
    alice.whisper(bob.uuid.hex, b"by hex")
    alice.whisper(str(bob.uuid), b"by string", b"", b"two more frames")
    alice.whisper(bob.uuid, bytearray(b"bytearray"), memoryview(b"memoryview"), "str")

    got = [wait_for(bob, match(WHISPER, alice.uuid)) for _ in range(4)]
    assert [e.frames for e in got] == [
        (b"by uuid",), (b"by hex",), (b"by string", b"", b"two more frames"),
        (b"bytearray", b"memoryview", b"str")]
    assert all(e.name == "alice" and e.group is None for e in got)
    assert got[2].message == b"by stringtwo more frames"

    bob.whisper(alice.uuid, b"back")
    assert wait_for(alice, match(WHISPER, bob.uuid)).message == b"back"


def test_whispers_and_shouts_of_a_batch_are_taken_in_one_call_in_order(make_node, monkeypatch):
    # The mailbox hands each batch read to Session.delivery_each (one call for many
    # messages); every WHISPER and SHOUT arrives once, in order, fast path or not.
    from peermesh.zre.session import Session

    taken: list[int] = []
    delivery_each = Session.delivery_each

    def counting(self: Session, batch: Any, start: int, now: float, sink: Any) -> int:
        end = delivery_each(self, batch, start, now, sink)
        if len(batch) > 1:   # (a batch read; receive's own single call is left out)
            taken.append(end - start)
        return end
    monkeypatch.setattr(Session, "delivery_each", counting)
    alice = make_node("alice", groups=["g"])
    bob = make_node("bob", groups=["g"])
    mesh(alice, bob)
    for i in range(2000):
        if i % 100 == 50:
            alice.shout("g", b"s%d" % i)
        else:
            alice.whisper(bob.uuid, b"w%d" % i)
    got = [wait_for(bob, lambda e: e.type in (WHISPER, SHOUT)) for _ in range(2000)]
    assert [e.message for e in got] == [b"%s%d" % (b"s" if i % 100 == 50 else b"w", i)
                                        for i in range(2000)]
    assert max(taken) > 1    # (2000 messages sent in one go: batches of more than one)


def test_packed_messages_round_trip(make_node):
    alice = make_node("alice", groups=["g"])
    bob = make_node("bob", groups=["g"])
    mesh(alice, bob)
    obj = {"n": 1, "list": [1, 2.5, None], "bin": b"\x00\xff", "text": "Zoë 東京"}
    alice.whisper_packed(bob.uuid, obj)
    assert wait_for(bob, match(WHISPER, alice.uuid)).unpack() == obj
    bob.shout_packed("g", ["shout", 7, {"nested": True}])
    event = wait_for(alice, match(SHOUT, bob.uuid))
    assert event.unpack() == ["shout", 7, {"nested": True}]


def test_three_node_mesh_is_whole(make_node):
    nodes = [make_node(name, groups=["all"]) for name in ("n1", "n2", "n3")]
    mesh(*nodes)
    for node in nodes:
        others = sorted(n.uuid for n in nodes if n is not node)
        assert sorted(node.peers()) == others
        assert sorted(node.peers_by_group("all")) == others
    for sender in nodes:
        for receiver in nodes:
            if receiver is not sender:
                sender.whisper(receiver.uuid, sender.name.encode())
        sender.shout("all", b"to all from " + sender.name.encode())
    for receiver in nodes:
        expected = [m for s in nodes if s is not receiver
                    for m in (match(WHISPER, s.uuid, message=s.name.encode()),
                              match(SHOUT, s.uuid, "all"))]
        seen = wait_all(receiver, expected)
        assert not any(e.type is EXIT for e in seen), seen


def test_find_peer_by_name_uuid_and_prefix(make_node):
    alice = make_node("alice")
    bob = make_node("bob")
    twins = [make_node("twin"), make_node("twin")]
    wait_all(alice, [match(ENTER, n.uuid) for n in (bob, *twins)])

    assert alice.find_peer("bob") == bob.uuid
    assert alice.find_peer(bob.uuid.hex) == bob.uuid
    assert alice.find_peer(str(bob.uuid)) == bob.uuid
    assert alice.find_peer(bob.uuid.hex[:10]) == bob.uuid
    assert alice.find_peer(bob.uuid.hex[:10].upper()) == bob.uuid
    with pytest.raises(UnknownPeerError, match="several"):
        alice.find_peer("twin")
    with pytest.raises(UnknownPeerError):
        alice.find_peer("nobody")
    assert alice.find_peer(twins[1].uuid.hex) == twins[1].uuid


def test_non_ascii_names_groups_and_headers(make_node):
    zoe = make_node("Zoë", groups=["東京", "café"],
                    headers={"città": "Zürich – 東京", "emoji": "🙂", "plain": "ascii"})
    other = make_node("Ærøskøbing", groups=["東京"])
    entered = wait_for(other, match(ENTER, zoe.uuid))
    assert entered.name == "Zoë"
    assert entered.headers == {"città": "Zürich – 東京", "emoji": "🙂", "plain": "ascii"}
    wait_all(other, [match(JOIN, zoe.uuid, "東京"), match(JOIN, zoe.uuid, "café")])
    wait_all(zoe, [match(ENTER, other.uuid, name="Ærøskøbing"),
                   match(JOIN, other.uuid, "東京")])
    assert other.peer_groups(zoe.uuid) == sorted(["東京", "café"])
    assert other.peer_header_value(zoe.uuid, "città") == "Zürich – 東京"
    assert other.find_peer("Zoë") == zoe.uuid

    zoe.shout("東京", "こんにちは")
    event = wait_for(other, match(SHOUT, zoe.uuid))
    assert (event.group, event.frames, event.name) == ("東京", ("こんにちは".encode(),), "Zoë")
    other.join("日本")
    assert wait_for(zoe, match(JOIN, other.uuid)).group == "日本"
    other.leave("日本")
    assert wait_for(zoe, match(LEAVE, other.uuid)).group == "日本"


def test_name_of_exactly_255_utf8_octets_is_accepted(make_node):
    long_name = "é" * 127 + "x"  # 255 octets, 128 characters
    group = "東" * 85              # 255 octets
    far = make_node(long_name, groups=[group])
    near = make_node("near")
    wait_all(near, [match(ENTER, far.uuid, name=long_name), match(JOIN, far.uuid, group)])


# --------------------------------------------------------------------------
# Leaving


def test_stop_sends_exit_left_to_peers_and_stop_is_the_last_event(make_node):
    alice = make_node("alice")
    bob = make_node("bob")
    carol = make_node("carol")
    mesh(alice, bob, carol)
    bob.whisper(carol.uuid, b"last words")
    assert bob.flush(TIMEOUT)  # carol's node holds the whisper

    carol.stop()
    assert not carol.running
    # expired is 30 s: only carol's port-0 beacon explains a prompt EXIT.
    for node in (alice, bob):
        event = wait_for(node, match(EXIT, carol.uuid))
        assert (event.reason, event.name, event.address) == ("left", "carol", carol.endpoint)
        assert node.peers() == [alice.uuid if node is bob else bob.uuid]
        with pytest.raises(UnknownPeerError):
            node.whisper(carol.uuid, b"too late")

    remaining = drain(carol)
    assert remaining and remaining[-1].type is STOP, remaining
    assert [e.frames for e in remaining if e.type is WHISPER] == [(b"last words",)]
    assert carol.recv(0) is None
    carol.stop()  # a second stop does nothing
    assert drain(carol) == []


def test_context_manager_starts_and_stops(make_node):
    alice = make_node("alice")
    scoped = make_node("scoped", start=False)
    with scoped as node:
        assert node is scoped and scoped.running
        wait_for(alice, match(ENTER, scoped.uuid))
    assert not scoped.running
    assert wait_for(alice, match(EXIT, scoped.uuid)).reason == "left"
    assert drain(scoped)[-1].type is STOP


# --------------------------------------------------------------------------
# Errors


def test_whisper_to_unknown_peer_raises(make_node):
    alice = make_node("alice")
    with pytest.raises(UnknownPeerError):
        alice.whisper(uuid.uuid4(), b"nobody")
    with pytest.raises(UnknownPeerError):
        alice.whisper(uuid.uuid4().hex, b"nobody")
    with pytest.raises(UnknownPeerError):
        alice.whisper("not a uuid", b"nobody")
    with pytest.raises(UnknownPeerError):
        alice.peer_name(uuid.uuid4())
    with pytest.raises(UnknownPeerError):
        alice.whisper_packed(uuid.uuid4(), {"x": 1})


def test_whisper_to_a_peer_that_left_raises_for_the_same_uuid_object(make_node):
    """The node keeps the peer it last whispered to; one that left is not it any more."""
    alice = make_node("alice")
    bob = make_node("bob")
    mesh(alice, bob)
    target = bob.uuid   # one object, as a sender's loop holds it
    alice.whisper(target, b"first")
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"first",)
    bob.stop()
    assert wait_for(alice, match(EXIT, target)).reason == "left"
    with pytest.raises(UnknownPeerError):
        alice.whisper(target, b"gone")


def test_whisper_and_shout_without_frames_raise_value_error_and_send_nothing(make_node):
    """ZRE allows a message without content, but Zyre merges one into the next
    message it delivers: a node refuses to send one."""
    alice = make_node("alice", groups=("g",))
    bob = make_node("bob", groups=("g",))
    mesh(alice, bob)
    with pytest.raises(ValueError, match="whisper needs at least one content frame"):
        alice.whisper(bob.uuid)
    with pytest.raises(ValueError, match="shout needs at least one content frame"):
        alice.shout("g")
    # Nothing went out and no sequence number was used: the next ones arrive in order.
    alice.whisper(bob.uuid, b"after")
    alice.shout("g", b"after")
    got = [wait_for(bob, lambda e: e.type in (WHISPER, SHOUT, EXIT)) for _ in range(2)]
    assert [(e.type, e.frames) for e in got] == [(WHISPER, (b"after",)), (SHOUT, (b"after",))]


def test_names_and_groups_over_255_utf8_octets_raise_value_error(make_node):
    with pytest.raises(ValueError):
        make_node("é" * 128, start=False)           # 128 characters, 256 octets
    with pytest.raises(ValueError):
        make_node("ok", groups=["g" * 256], start=False)
    with pytest.raises(ValueError):
        make_node("ok", headers={"k" * 256: "v"}, start=False)
    alice = make_node("alice")
    with pytest.raises(ValueError):
        alice.join("東" * 86)                        # 258 octets
    with pytest.raises(ValueError):
        alice.shout("東" * 86, b"x")
    with pytest.raises(ValueError):
        alice.leave("x" * 256)
    assert alice.groups() == []


def test_frames_that_are_not_bytes_raise_type_error(make_node):
    alice = make_node("alice", groups=["g"])
    bob = make_node("bob", groups=["g"])
    mesh(alice, bob)
    with pytest.raises(TypeError):
        alice.whisper(bob.uuid, 42)
    with pytest.raises(TypeError):
        alice.whisper(bob.uuid, b"fine", None)
    with pytest.raises(TypeError):
        alice.shout("g", 3.5)
    with pytest.raises(TypeError):
        alice.shout("g", b"fine", ["a", "list"])
    # Nothing half-sent: the next message bob gets is the marker, and the link is whole.
    alice.whisper(bob.uuid, b"marker")
    event = wait_for(bob, lambda e: e.type in (WHISPER, SHOUT, EXIT))
    assert (event.type, event.frames) == (WHISPER, (b"marker",))


def test_calls_before_start_raise_node_state_error(make_node):
    node = make_node("idle", start=False)
    someone = uuid.uuid4()
    for call in (lambda: node.whisper(someone, b"x"),
                 lambda: node.whisper_packed(someone, 1),
                 lambda: node.shout("g", b"x"),
                 lambda: node.shout_packed("g", 1),
                 lambda: node.peer_name(someone),
                 lambda: node.peer_address(someone),
                 lambda: node.peer_headers(someone),
                 lambda: node.peer_groups(someone)):
        with pytest.raises(NodeStateError):
            call()
    assert not node.running


def test_find_peer_before_start_raises_node_state_error(make_node):
    node = make_node("idle", start=False)
    with pytest.raises(NodeStateError):
        node.find_peer("anyone")


def test_start_twice_raises_node_state_error(make_node):
    node = make_node("once")
    with pytest.raises(NodeStateError):
        node.start()
    node.stop()
    with pytest.raises(NodeStateError):
        node.start()
    with pytest.raises(NodeStateError):
        node.whisper(uuid.uuid4(), b"after stop")
    with pytest.raises(NodeStateError):
        node.shout("g", b"after stop")


def test_unknown_interface_raises_interface_error(make_node):
    node = make_node("lost", interface="no-such-if0", start=False)
    with pytest.raises(InterfaceError, match="no-such-if0"):
        node.start()
    assert not node.running


# --------------------------------------------------------------------------
# Flow control


def test_flush_returns_true_once_the_receiver_has_everything(make_node):
    alice = make_node("alice")
    bob = make_node("bob")
    mesh(alice, bob)
    assert alice.flush(TIMEOUT) is True  # nothing pending
    for i in range(200):
        alice.whisper(bob.uuid, b"%d" % i)
    assert alice.flush(TIMEOUT) is True
    # No waiting: bob's node already holds all 200.
    got = [e.message for e in drain(bob) if e.type is WHISPER]
    assert got == [b"%d" % i for i in range(200)]


SMALL_QUEUES = dict(event_queue=50, sndhwm=10, send_queue=20)
PAYLOAD = b"p" * 8192


def test_stalled_receiver_makes_whisper_raise_without_stalling_others(make_node):
    """A peer that stops reading: the sender learns it (exception and EXIT) and
    keeps serving everyone else meanwhile."""
    stalled = make_node("stalled", send_timeout=1.0, **SMALL_QUEUES)
    sender = make_node("sender", send_timeout=1.0, **SMALL_QUEUES)
    healthy = make_node("healthy", send_timeout=1.0, **SMALL_QUEUES)
    mesh(stalled, sender, healthy)
    # From here on nobody reads stalled's events.

    in_call = False

    def flood() -> int:
        nonlocal in_call
        for count in range(100_000):
            in_call = True
            sender.whisper(stalled.uuid, PAYLOAD)
            in_call = False
        return count

    flooder = gevent.spawn(flood)
    served_while_blocked = delivered = 0
    deadline = time.monotonic() + 30
    try:
        while not flooder.dead:
            assert time.monotonic() < deadline, "the flood never ended"
            delivered += 1
            sender.whisper(healthy.uuid, b"%d" % delivered)
            event = wait_for(healthy, lambda e: e.type in (WHISPER, EXIT))
            assert (event.type, event.frames) == (WHISPER, (b"%d" % delivered,))
            # whisper() only yields while it waits for room in stalled's queue.
            served_while_blocked += in_call and not flooder.dead
    finally:
        flooder.kill()
    with pytest.raises(PeerNotResponding, match="send buffer .*stayed full for send_timeout"):
        flooder.get()
    assert served_while_blocked > 0

    exit_event = wait_for(sender, match(EXIT, stalled.uuid))
    assert exit_event.reason.startswith("not responding"), exit_event
    assert stalled.uuid not in sender.peers()
    with pytest.raises(UnknownPeerError):
        sender.whisper(stalled.uuid, b"gone")

    assert healthy.uuid in sender.peers()
    sender.whisper(healthy.uuid, b"after")
    assert wait_for(healthy, match(WHISPER, sender.uuid)).frames == (b"after",)
    assert not any(e.type is EXIT for e in drain(healthy))


def test_slow_but_steady_receiver_gets_everything_in_order(make_node):
    receiver = make_node("receiver", send_timeout=5.0, **SMALL_QUEUES)
    sender = make_node("sender", send_timeout=5.0, **SMALL_QUEUES)
    mesh(receiver, sender)
    count = 3000  # ~24 MB: well past what the socket buffers hold

    def read_slowly() -> list[int]:
        got: list[int] = []
        while len(got) < count:
            event = receiver.recv(TIMEOUT)
            assert event is not None, f"stuck after {len(got)} messages"
            assert event.type is WHISPER and event.peer == sender.uuid, event
            got.append(int.from_bytes(event.frames[0][:4], "big"))
            if len(got) % 25 == 0:
                gevent.sleep(0.002)  # the slow part of a slow reader
        return got

    reader = gevent.spawn(read_slowly)
    try:
        for i in range(count):
            sender.whisper(receiver.uuid, i.to_bytes(4, "big") + PAYLOAD)
        got = reader.get(timeout=30)
    finally:
        reader.kill()
    assert got == list(range(count))
    assert sender.flush(TIMEOUT)
    assert not any(e.type is EXIT for e in drain(sender))
    assert sender.peers() == [receiver.uuid]


def test_shout_each_reaches_a_slow_reader_whole_and_in_order(make_node):
    """Batches past the link's bounds: what ZeroMQ takes goes at once, the rest waits for
    room, and every SHOUT keeps its place in the peer's sequence (a gap would drop it)."""
    receiver = make_node("receiver", groups=["g"], send_timeout=5.0, **SMALL_QUEUES)
    sender = make_node("sender", send_timeout=5.0, **SMALL_QUEUES)
    mesh(receiver, sender)
    count = 3000

    batches = [list(range(start, start + 300)) for start in range(0, count, 300)]

    def read_slowly() -> list[Any]:
        got: list[Any] = []
        while len(got) < count + len(batches):
            event = receiver.recv(TIMEOUT)
            assert event is not None, f"stuck after {len(got)} messages"
            if event.type is WHISPER:
                got.append(event.message)
            else:
                assert event.type is SHOUT and event.group == "g", event
                got.append(int.from_bytes(event.frames[0][:4], "big"))
            if len(got) % 25 == 0:
                gevent.sleep(0.002)  # the slow part of a slow reader
        return got

    reader = gevent.spawn(read_slowly)
    try:
        for batch in batches:
            sender.shout_each("g", [i.to_bytes(4, "big") + PAYLOAD for i in batch])
            sender.whisper(receiver.uuid, b"between")   # numbered after the batch
        got = reader.get(timeout=30)
    finally:
        reader.kill()
    assert got == [x for batch in batches for x in [*batch, b"between"]]
    assert sender.flush(TIMEOUT)
    assert receiver.uuid in sender.peers()


def test_send_queue_stuck_past_expired_is_reported(make_node):
    """A peer that still beacons but stopped reading: messages queued for it below the
    send_queue limit must not sit there for ever unreported."""
    stalled = make_node("stalled", event_queue=50)
    sender = make_node("sender", sndhwm=10, send_queue=100_000,
                       evasive=0.3, silent=0.5, expired=1.0)
    mesh(stalled, sender)
    for _ in range(4000):  # fills the buffers; a few thousand wait in the backlog
        sender.whisper(stalled.uuid, PAYLOAD)
    event = wait_for(sender, match(EXIT, stalled.uuid), timeout=3.0)
    assert event.reason.startswith("not responding"), event
    assert stalled.stats()["event_queue_full"] >= 1  # it stopped reading its mailbox


def test_a_silent_peer_is_not_expired_while_its_backlog_drains(make_node):
    """A peer that sends nothing (no beacons, no answers) but keeps reading, slowly:
    its link still takes messages, so it is busy, not gone, and gets them all."""
    sender = make_node("sender", sndhwm=10, evasive=0.2, silent=0.4, expired=0.8)
    count, payload = 400, b"p" * 65536  # more than the socket buffers on the way hold
    with RawPeer(name="slow") as raw:
        raw.router.close(linger=0)  # a mailbox that holds little in its own queue
        raw.router = raw.context.socket(zmq.ROUTER)
        raw.router.setsockopt(zmq.LINGER, 0)
        raw.router.setsockopt(zmq.RCVHWM, 10)
        raw.router.setsockopt(zmq.RCVBUF, 65536)
        raw.port = raw.router.bind_to_random_port("tcp://127.0.0.1", 0xC000, 0x10000)
        raw.endpoint = f"tcp://127.0.0.1:{raw.port}"
        raw.connect(sender.endpoint)
        raw.hello()
        wait_for(sender, match(ENTER, raw.uuid))
        raw.expect(zre.Hello)
        for i in range(count):
            sender.whisper(raw.uuid, i.to_bytes(4, "big") + payload)
        assert sender._peers[raw.uuid].link.queued() > 0  # some wait in the sender's backlog
        got: list[int] = []

        def read_slowly() -> None:  # about 5 ms a message: ~2 s, well past `expired`
            while len(got) < count:
                message = raw.recv(TIMEOUT)
                if message is None:
                    return
                if isinstance(message, zre.Whisper):
                    got.append(int.from_bytes(message.content[0][:4], "big"))
                    time.sleep(0.005)

        reader = threading.Thread(target=read_slowly, daemon=True)
        reader.start()
        waiting.poll_until(lambda: not reader.is_alive(), 60.0, "the slow reader",
                           sleep=gevent.sleep, step=0.05)
        assert got == list(range(count))  # an expiry on the way would have cut the link


def test_a_listener_failing_on_every_event_logs_one_traceback(make_node, caplog):
    """A peer whose events make an overlay's listener fail each time (as a malformed HELLO
    header once did) must not fill the log: one traceback, then counted."""
    alice = make_node("alice")
    bob = make_node("bob", start=False)

    def fragile(event):
        raise ValueError(f"cannot handle {event.type.name}")

    bob.add_listener(fragile)
    with caplog.at_level(logging.DEBUG, "peermesh.zre.node"):
        bob.start()
        mesh(alice, bob)
        for i in range(20):
            alice.whisper(bob.uuid, b"%d" % i)
        got = [wait_for(bob, match(WHISPER, alice.uuid)) for _ in range(20)]
    assert [e.frames for e in got] == [(b"%d" % i,) for i in range(20)]  # events still come
    assert bob.stats()["listener_failures"] >= 21                      # ENTER and 20 WHISPERs
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert len(tracebacks) == 1 and "cannot handle ENTER" in caplog.text


def test_a_listener_of_the_mesh_alone_hears_no_messages(make_node):
    """``add_listener(fn, messages=False)`` hears ENTER, JOIN and EXIT but no WHISPER or
    SHOUT, while a listener of everything hears them; the queue gets them all either way,
    in order, and removing the one listener of messages leaves the other as it was."""
    alice = make_node("alice")
    bob = make_node("bob", start=False)
    mesh_only, everything = [], []
    bob.add_listener(lambda event: mesh_only.append(event.type), messages=False)
    bob.add_listener(record_all := lambda event: everything.append(event.type))
    bob.start()
    bob.join("g")
    mesh(alice, bob)
    alice.join("g")
    wait_for(bob, match(EventType.JOIN, alice.uuid))
    for i in range(3):
        alice.whisper(bob.uuid, b"w%d" % i)
        alice.shout("g", b"s%d" % i)
    got = [wait_for(bob, lambda e: e.type in (WHISPER, EventType.SHOUT)) for _ in range(6)]
    assert [e.frames[0] for e in got] == [b"w0", b"s0", b"w1", b"s1", b"w2", b"s2"]
    assert EventType.ENTER in mesh_only and EventType.JOIN in mesh_only
    assert not {WHISPER, EventType.SHOUT} & set(mesh_only)
    assert everything.count(WHISPER) == 3 and everything.count(EventType.SHOUT) == 3
    bob.remove_listener(record_all)
    alice.whisper(bob.uuid, b"after")
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"after",)
    assert everything.count(WHISPER) == 3 and WHISPER not in mesh_only
    alice.stop()
    wait_for(bob, match(EventType.EXIT, alice.uuid))
    assert EventType.EXIT in mesh_only
