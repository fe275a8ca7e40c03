"""The ZRE session core as tables, without sockets or clocks.

A ``Session`` is fed frames, discovery reports and times by hand through its
core contract (``sessionharness.Harness`` plays the node): what it sends is
read back from in-memory links (every frame decoded with the codec) and what
it reports from the events its outputs carry.
"""

from __future__ import annotations

import ast
import uuid as uuid_module
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import pytest

from peermesh.events import Event, EventType
from peermesh.wire import zre
from peermesh.zre import session as session_module
from peermesh.zre import table as table_module
from peermesh.zre.session import PEX_HEADER

from sessionharness import CONFIG, FINE, OWN_ENDPOINT, Harness, Remote, entered

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
WHISPER, SHOUT, EVASIVE, SILENT = (EventType.WHISPER, EventType.SHOUT, EventType.EVASIVE,
                                   EventType.SILENT)


# --------------------------------------------------------------------------
# The mailbox: what each message from one peer leads to

MAILBOX_CASES: list[tuple[str, list[Any], list[tuple[EventType, Any]]]] = [
    ("hello then whisper",
     [lambda p: p.hello(), lambda p: p.whisper(b"one")],
     [(ENTER, "bob"), (WHISPER, b"one")]),
    ("whisper before hello is ignored",
     [lambda p: zre.Whisper(2, (b"early",))],
     []),
    ("hello with groups joins them",
     [lambda p: p.hello(groups=("a", "b"))],
     [(ENTER, "bob"), (JOIN, "a"), (JOIN, "b")]),
    ("join and leave",
     [lambda p: p.hello(), lambda p: zre.Join(p.next(), "g", 1),
      lambda p: zre.Leave(p.next(), "g", 2)],
     [(ENTER, "bob"), (JOIN, "g"), (LEAVE, "g")]),
    ("a gap in the sequence disconnects",
     [lambda p: p.hello(), lambda p: zre.Whisper(p.next() + 1, (b"skipped",))],
     [(ENTER, "bob"), (EXIT, "sequence gap (expected 2, got 3)")]),
    ("a repeated number disconnects",
     [lambda p: p.hello(), lambda p: p.whisper(), lambda p: zre.Whisper(2, (b"again",))],
     [(ENTER, "bob"), (WHISPER, b"hi"), (EXIT, "sequence gap (expected 3, got 2)")]),
    ("a second hello with other headers is a restart",
     [lambda p: p.hello(), lambda p: p.hello(headers={"X-NEW": "1"})],
     [(ENTER, "bob"), (EXIT, "restarted (new HELLO)"), (ENTER, "bob")]),
    ("the same hello again starts the session over without events",
     [lambda p: p.hello(groups=("mine",)), lambda p: p.hello(), lambda p: p.whisper(b"after")],
     [(ENTER, "bob"), (JOIN, "mine"), (LEAVE, "mine"), (WHISPER, b"after")]),
    ("unknown command ids keep the sequence",
     [lambda p: p.hello(), lambda p: zre.Unknown(p.next(), 11), lambda p: p.whisper(b"after")],
     [(ENTER, "bob"), (WHISPER, b"after")]),
    ("shout to a group we are not in is not reported",
     [lambda p: p.hello(), lambda p: zre.Shout(p.next(), "elsewhere", (b"x",)),
      lambda p: zre.Shout(p.next(), "mine", (b"y",))],
     [(ENTER, "bob"), (SHOUT, "mine")]),
    ("a hello that is not number 1 is dropped",
     [lambda p: zre.Hello(2, p.endpoint, (), 0, "bob", {})],
     []),
]


@pytest.mark.parametrize("commands,expected", [c[1:] for c in MAILBOX_CASES],
                         ids=[c[0] for c in MAILBOX_CASES])
def test_mailbox(commands: list[Any], expected: list[tuple[EventType, Any]]) -> None:
    h = Harness()
    h.add_group("mine")
    peer = Remote("bob", 50001)
    for make in commands:
        h.send(peer, make(peer), 1.0)
    assert h.taken() == expected


def test_shouts_are_reported_while_in_their_group_and_keep_their_frames() -> None:
    h = Harness()
    h.add_group("mine")
    h.add_group("")   # (an empty name is a group too)
    peer = Remote("bob", 50001)
    entered(h, peer)
    h.send(peer, zre.Shout(peer.next(), "mine", (b"1",)), 1.0)
    h.remove_group("mine")
    h.send(peer, zre.Shout(peer.next(), "mine", (b"2",)), 1.0)
    h.add_group("mine")
    h.send(peer, zre.Shout(peer.next(), "mine", (b"3", b"more")), 1.0)
    h.send(peer, zre.Shout(peer.next(), "", ()), 1.0)
    h.send(peer, peer.whisper(b"4"), 1.0)
    assert [(e.type, e.peer, e.name, e.group, e.frames) for e in h.events] == [
        (SHOUT, peer.uuid, "bob", "mine", (b"1",)),
        (SHOUT, peer.uuid, "bob", "mine", (b"3", b"more")),
        (SHOUT, peer.uuid, "bob", "", ()),
        (WHISPER, peer.uuid, "bob", None, (b"4",))]


def test_hello_opens_a_link_and_says_hello_first_then_answers_ping() -> None:
    h = Harness()
    h.add_group("g")
    peer = Remote("bob", 50001)
    entered(h, peer)
    h.send(peer, zre.Ping(peer.next()), 1.0)
    sent = h.link(peer.endpoint).sent
    assert [type(m) for m in sent] == [zre.Hello, zre.PingOk]
    hello = sent[0]
    assert isinstance(hello, zre.Hello)
    assert (hello.sequence, hello.endpoint, hello.groups, hello.name) == (1, OWN_ENDPOINT,
                                                                          ("g",), "me")
    assert sent[1].sequence == 2


def test_malformed_frames_are_dropped_and_the_peer_kept() -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer)
    identity = peer.identity
    for frames in ([], [b"\xaa"], [b"\x00\x00\x02\x02\x00\x02"], [b"\xaa\xa1\x02\x09\x00\x02"]):
        h.receive(identity, frames, 1.0)
    h.send(peer, peer.whisper(b"still"), 1.0)
    assert h.taken() == [(WHISPER, b"still")]


def test_oversized_message_disconnects_its_sender() -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer)
    h.oversized(peer.identity)
    assert h.taken() == [(EXIT, f"sent a message over max_message ({CONFIG.max_message})")]
    assert h.link(peer.endpoint).closed
    assert h.session.counters.get("messages_refused") == 1


# --------------------------------------------------------------------------
# Timers: silence after the last sign of life (HELLO at t=0)

TIMER_CASES = [
    # (times the timer runs, events, PINGs sent)
    ([4.9], [], 0),
    ([5.0], [(EVASIVE, "bob")], 1),
    ([5.0, 6.0], [(EVASIVE, "bob")], 1),               # PINGed once per evasive period
    ([5.0, 10.0], [(EVASIVE, "bob"), (SILENT, "bob")], 2),
    ([5.0, 10.0, 29.9], [(EVASIVE, "bob"), (SILENT, "bob")], 3),
    ([30.0], [(EXIT, "expired")], 0),
]


@pytest.mark.parametrize("ticks,events,pings", TIMER_CASES)
def test_silence(ticks: list[float], events: list[tuple[EventType, Any]], pings: int) -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    for now in ticks:
        h.timer(now)
    assert h.taken() == events
    assert h.link(peer.endpoint).kinds().count("Ping") == pings


@pytest.mark.parametrize("sign_of_life", ["message", "beacon"])
def test_a_sign_of_life_ends_the_silence(sign_of_life: str) -> None:
    h = Harness(FINE)  # (its timer runs at 11.9 and at 12.0)
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    h.timer(6.0)
    assert h.taken() == [(EVASIVE, "bob")]
    if sign_of_life == "message":
        h.send(peer, zre.PingOk(peer.next()), 7.0)
    else:
        h.appeared(peer.uuid, peer.endpoint, 7.0)
    h.timer(11.9)
    assert h.taken() == []
    h.timer(12.0)
    assert h.taken() == [(EVASIVE, "bob")]


def test_liveness_state_follows_the_silence_and_a_sign_of_life() -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    (bob,) = h.session.peers.values()
    states = []
    for now in (1.0, 5.0, 10.0):
        h.timer(now)
        states.append(bob.state)
    h.send(peer, peer.whisper(), 11.0)
    assert states + [bob.state] == ["alive", "evasive", "silent", "alive"]


def test_round_trips_are_timed_from_ping_to_ping_ok_and_probed_every_rtt_probe() -> None:
    h = Harness(FINE.replace(rtt_probe=2.0))  # (its timer runs at 0.5 and at 1.0)
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    (bob,) = h.session.peers.values()
    link = h.link(peer.endpoint)
    h.timer(0.5)            # a new peer is timed at once
    assert link.kinds().count("Ping") == 1 and bob.rtt is None
    h.send(peer, zre.PingOk(peer.next()), 0.504)
    h.timer(1.0)            # answered, next probe due at 2.5
    assert link.kinds().count("Ping") == 1
    h.timer(2.5)
    assert link.kinds().count("Ping") == 2
    h.timer(4.6)            # one PING unanswered: no second probe behind it
    assert link.kinds().count("Ping") == 2
    h.send(peer, zre.PingOk(peer.next()), 2.52)
    assert bob.rtt is not None and bob.rtt.count == 2
    assert bob.rtt.last == pytest.approx(0.02)
    assert bob.rtt.smoothed == pytest.approx(0.004 + (0.02 - 0.004) / 8)
    assert sum(bob.rtt.counts) == 2 and bob.rtt.total == pytest.approx(0.024)


def test_traffic_totals_count_each_kind_and_drops_by_reason() -> None:
    h = Harness()
    h.add_group("g")
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    h.send(peer, peer.whisper(), 1.0)
    h.send(peer, zre.Shout(peer.next(), "g", (b"x",)), 1.0)
    h.send(peer, zre.Shout(peer.next(), "other", (b"x",)), 1.0)  # the slow path counts too
    h.send(peer, zre.Join(peer.next(), "h", 1), 1.0)
    h.receive(peer.identity, [b"\xaa"], 1.0)
    s = h.session
    assert (s.received_whispers, s.received_shouts, s.received_control) == (1, 2, 1)
    assert s.dropped["short"] == 1 and set(s.dropped) == set(session_module.DROP_REASONS)


def test_a_draining_backlog_keeps_its_peer_and_a_stalled_one_does_not() -> None:
    h = Harness(FINE)  # (its timer runs at 58.9 and at 59.0)
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    link = h.link(peer.endpoint)
    link.backlog, link.stalled_since = 500, 29.0  # still taking messages at t=29
    h.timer(40.0)
    assert (EXIT, "expired") not in h.taken()
    h.timer(58.9)
    assert h.taken() == []
    h.timer(59.0)  # no progress for `expired`
    assert h.taken() == [(EXIT, "not responding: send queue stalled")]


def test_control_commands_past_twice_the_bound_disconnect() -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    link = h.link(peer.endpoint)
    link.backlog = 2 * link.limit
    h.add_group("one")
    assert h.taken() == []
    link.backlog += 1
    h.add_group("two")
    assert h.taken() == [(EXIT, "not responding: send queue full")]


def test_the_timer_names_its_next_deadline() -> None:
    h = Harness()
    h.timer(100.0)
    assert h.session.next_deadline() == 100.0 + min(CONFIG.interval, CONFIG.evasive / 2)


# --------------------------------------------------------------------------
# Discovery reports


def test_report_opens_a_link_and_hello_makes_it_ready() -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    h.appeared(peer.uuid, peer.endpoint, 0.0)
    assert h.link(peer.endpoint).kinds() == ["Hello"]
    assert h.session.peers[peer.uuid].ready is False
    h.appeared(peer.uuid, peer.endpoint, 0.5)  # known: only a refresh
    assert len(h.links[peer.endpoint]) == 1
    h.send(peer, peer.hello(), 1.0)
    assert h.taken() == [(ENTER, "bob")]
    assert len(h.links[peer.endpoint]) == 1


@pytest.mark.parametrize("endpoint", [OWN_ENDPOINT, "ipc:///tmp/x", "udp://10.0.0.2:5"])
def test_reports_of_unusable_endpoints_are_ignored(endpoint: str) -> None:
    h = Harness()
    h.appeared(uuid_module.uuid4(), endpoint, 0.0)
    assert h.links == {} and h.session.peers == {}


def test_no_link_no_peer() -> None:
    h = Harness(refuse=True)
    peer = Remote("bob", 50001)
    h.send(peer, peer.hello(), 0.0)
    assert h.taken() == [] and h.session.peers == {}


def test_a_peer_that_left_is_not_revived_by_stale_reports_for_expired() -> None:
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer, now=0.0)
    h.left(peer.uuid, 1.0)
    assert h.taken() == [(EXIT, "left")]
    h.appeared(peer.uuid, peer.endpoint, 30.9)
    assert peer.uuid not in h.session.peers
    h.timer(31.0)
    h.appeared(peer.uuid, peer.endpoint, 31.0)
    assert peer.uuid in h.session.peers


def test_peer_exchange_only_with_peers_that_ask() -> None:
    h = Harness()
    carol = Remote("carol", 50003)
    entered(h, carol)
    seeker = Remote("seeker", 50004)
    entered(h, seeker, headers={PEX_HEADER: "1"})
    assert h.link(carol.endpoint).kinds() == ["Hello"]
    pex = h.link(seeker.endpoint).sent[-1]
    assert isinstance(pex, zre.PeerExchange)
    assert pex.peers == (f"{carol.uuid.hex} {carol.endpoint}",)
    # A node that did not ask ignores PEX; one that asked connects to what it names.
    dave = Remote("dave", 50005)
    h.send(seeker, zre.PeerExchange(seeker.next(), (f"{dave.uuid.hex} {dave.endpoint}",)), 1.0)
    assert dave.endpoint not in h.links
    asking = Harness(headers={PEX_HEADER: "1"})
    entered(asking, seeker)
    asking.send(seeker, zre.PeerExchange(seeker.next(),
                                         (f"{dave.uuid.hex} {dave.endpoint}", "garbage")), 1.0)
    assert asking.link(dave.endpoint).kinds() == ["Hello"]


# --------------------------------------------------------------------------
# A new node at a known endpoint (a peer that crashed and came back at its port)


def test_new_uuid_at_the_endpoint_of_a_silent_peer_replaces_it_at_once() -> None:
    h = Harness()
    old = Remote("old", 50001)
    entered(h, old, now=0.0)
    new = Remote("new", 50001)
    h.send(new, new.hello(), CONFIG.evasive)
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint"), (ENTER, "new")]
    assert h.links[old.endpoint][0].closed and h.link(new.endpoint).kinds() == ["Hello"]


def test_new_uuid_at_the_endpoint_of_a_recent_peer_replaces_it_if_it_does_not_answer() -> None:
    h = Harness()
    old = Remote("old", 50001)
    entered(h, old, now=0.0)
    new = Remote("new", 50001)
    h.send(new, new.hello(), 1.0)
    assert h.taken() == []
    assert h.link(old.endpoint).kinds()[-1] == "Ping"  # is the old one still there?
    h.timer(1.5)
    assert h.session.next_deadline() <= 1.0 + CONFIG.interval
    assert h.taken() == []
    h.timer(1.0 + CONFIG.interval)
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint"), (ENTER, "new")]
    assert new.uuid in h.session.peers and old.uuid not in h.session.peers
    h.send(new, new.whisper(b"from new"), 2.5)
    assert h.taken() == [(WHISPER, b"from new")]


@pytest.mark.parametrize("answer", ["ping-ok", "beacon"])
def test_a_false_claim_on_a_live_peers_endpoint_is_dropped(answer: str) -> None:
    h = Harness()
    old = Remote("old", 50001)
    entered(h, old, now=0.0)
    claimant = Remote("claimant", 50001)
    h.send(claimant, claimant.hello(), 1.0)
    if answer == "ping-ok":
        h.send(old, zre.PingOk(old.next()), 1.2)
    else:
        h.appeared(old.uuid, old.endpoint, 1.2)
    h.timer(5.0)
    assert h.taken() == []
    assert list(h.session.peers) == [old.uuid]
    assert not h.link(old.endpoint).closed


def test_a_claimant_found_by_its_beacon_meanwhile_still_enters_with_its_hello() -> None:
    h = Harness()
    old = Remote("old", 50001)
    entered(h, old, now=0.0)
    new = Remote("new", 50001)
    h.send(new, new.hello(), 4.9)
    # The old peer's silence reaches `evasive`; the new one's beacon replaces it.
    h.appeared(new.uuid, new.endpoint, 5.0)
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint")]
    assert h.session.peers[new.uuid].ready is False
    h.timer(5.1)
    assert h.taken() == [(ENTER, "new")]
    h.send(new, new.whisper(b"in"), 5.2)
    assert h.taken() == [(WHISPER, b"in")]


@pytest.mark.parametrize("module", [session_module, table_module], ids=lambda m: m.__name__)
def test_the_session_module_does_no_io_and_reads_no_clock(module: ModuleType) -> None:
    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
    forbidden = {"gevent", "zmq", "socket", "select", "threading", "asyncio", "time"}
    assert not imported & forbidden


# --------------------------------------------------------------------------
# The peer's own link decides: restarts at its endpoint and port-0 beacons


class LinkedHarness(Harness):
    """A harness whose driver can tell which identities hold a mailbox connection
    (``open``)."""

    def __init__(self) -> None:
        self.open: set[bytes] = set()
        super().__init__(linked=lambda identity: identity in self.open)

    def enter(self, peer: Remote, now: float = 0.0) -> None:
        """``peer`` enters at ``now``, and the timer runs then (what it asks for next is
        the next tick, until something waits on a link)."""
        self.open.add(peer.identity)
        entered(self, peer, now)
        self.timer(now)


def test_a_new_node_at_an_endpoint_whose_holder_closed_its_link_enters_at_its_hello() -> None:
    h = LinkedHarness()
    old, new = Remote("old", 50001), Remote("new", 50001)
    h.enter(old)
    h.open.discard(old.identity)  # its process is gone
    h.send(new, new.hello(), 0.5)
    h.send(new, new.whisper(b"at once"), 0.5)
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint"), (ENTER, "new"),
                         (WHISPER, b"at once")]
    assert "Ping" not in h.link(old.endpoint).kinds()


def test_commands_after_a_held_hello_are_applied_once_the_holder_is_gone() -> None:
    h = LinkedHarness()
    old, new = Remote("old", 50001), Remote("new", 50001)
    h.enter(old)
    h.send(new, new.hello(), 0.5)
    h.send(new, zre.Join(new.next(), "g", 1), 0.5)
    h.send(new, new.whisper(b"one"), 0.6)
    h.send(new, new.whisper(b"two"), 0.7)
    assert h.taken() == [] and h.session.next_deadline() == 0.5  # the timer, at once
    h.timer(0.8)
    assert h.settling()  # still waiting: the link is open, no answer yet
    h.open.discard(old.identity)  # then its connection closes
    h.timer(0.9)
    assert not h.settling()
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint"), (ENTER, "new"),
                         (JOIN, "g"), (WHISPER, b"one"), (WHISPER, b"two")]
    h.send(new, new.whisper(b"three"), 1.0)
    assert h.taken() == [(WHISPER, b"three")]


def test_held_commands_are_bounded_and_a_gap_after_them_resynchronises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "HELD_MESSAGES", 2)
    h = LinkedHarness()
    old, new = Remote("old", 50001), Remote("new", 50001)
    h.enter(old)
    h.send(new, new.hello(), 0.5)
    for text in (b"one", b"two", b"three"):
        h.send(new, new.whisper(text), 0.6)
    assert h.session.counters.get("held_dropped") == 1
    h.timer(0.5 + CONFIG.interval)  # no answer within interval: replaced
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint"), (ENTER, "new"),
                         (WHISPER, b"one"), (WHISPER, b"two")]
    links = len(h.links[new.endpoint])
    h.send(new, new.whisper(b"four"), 2.0)  # number 5 where 4 was due
    assert h.taken() == [(EXIT, "sequence gap (expected 4, got 5)")]
    # ... and a fresh HELLO goes out at once on a new link: the peer starts over too
    assert len(h.links[new.endpoint]) == links + 1
    assert h.link(new.endpoint).kinds() == ["Hello"]
    assert h.session.counters.get("sequence_resyncs") == 1


@pytest.mark.parametrize("case, expected", [
    ("link closed", [(EXIT, "left")]),
    ("answered", []),
    ("answered, then link closed", [(EXIT, "left")]),  # a leaver may answer as it goes
    ("unanswered", [(EXIT, "left")]),
])
def test_a_port_zero_beacon_counts_as_the_peers_link_says(case: str, expected: list) -> None:
    h = LinkedHarness()
    peer = Remote("bob", 50001)
    h.enter(peer)
    h.left(peer.uuid, 1.0, "10.0.0.2")
    assert h.taken() == [] and h.link(peer.endpoint).kinds()[-1] == "Ping"
    if case == "link closed":
        h.open.discard(peer.identity)
        h.timer(1.01)
    elif case.startswith("answered"):
        h.send(peer, zre.PingOk(peer.next()), 1.01)
        h.timer(1.02)
        assert h.settling()  # the link decides, up to interval
        if case.endswith("closed"):
            h.open.discard(peer.identity)
        h.timer(1.0 + CONFIG.interval)
    else:
        h.timer(0.5 + CONFIG.interval)
        assert h.settling()
        h.timer(1.0 + CONFIG.interval)
    assert h.taken() == expected
    assert (peer.uuid in h.session.peers) == (case == "answered")
    assert h.session.counters.get("leaves_ignored") == (case == "answered")


def test_a_port_zero_beacon_of_a_peer_whose_link_is_already_closed_is_an_exit_at_once() -> None:
    h = LinkedHarness()
    peer = Remote("bob", 50001)
    h.enter(peer)
    h.open.discard(peer.identity)  # it closed, then its beacon arrived
    h.left(peer.uuid, 1.0, "10.0.0.2")
    assert h.taken() == [(EXIT, "left")]


def test_the_same_hello_again_is_answered_with_ours_on_a_fresh_link() -> None:
    """A peer that gave up on us (our HELLO never reached it: its allowlist refused our
    key then) says HELLO again: ours goes again, numbered from 1, and nothing is reported."""
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer)
    old = h.link(peer.endpoint)
    h.send(peer, peer.hello(), 2.0)
    new = h.link(peer.endpoint)
    assert old.closed and new is not old and new.kinds() == ["Hello"]
    assert new.sent[0].sequence == 1 and h.taken() == []
    assert h.session.counters.get("sessions_restarted") == 1
    h.ping(h.session.peers[peer.uuid])
    assert new.sent[-1].sequence == 2  # our numbering started over with the link
    h.send(peer, peer.whisper(b"on"), 2.0)
    assert h.taken() == [(WHISPER, b"on")]


def test_a_second_hello_while_a_whisper_waits_to_be_confirmed_is_a_restart() -> None:
    """What we sent may be lost with the session the peer gave up: the application
    hears of it (EXIT, ENTER), as of a restart."""
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer)
    h.session.peers[peer.uuid].unconfirmed = True  # (the node's whisper sets it)
    h.send(peer, peer.hello(), 2.0)
    assert h.taken() == [(EXIT, "restarted (new HELLO)"), (ENTER, "bob")]


@pytest.mark.parametrize("late", [0.5, CONFIG.interval + 0.5, CONFIG.evasive - 0.1])
def test_the_first_same_hello_after_ours_went_again_is_no_restart_however_late(
        late: float) -> None:
    """Its HELLO answers ours (or crossed it): it says nothing of what we sent since, and
    is not answered again (two nodes would start over each other for ever). A loaded
    node's answer may come long after ``interval``."""
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer)
    h.send(peer, peer.hello(), 2.0)  # bob gave up on us: ours goes again
    link = h.link(peer.endpoint)
    h.session.peers[peer.uuid].unconfirmed = True  # (we whispered to bob meanwhile)
    h.timer(2.0 + late)
    h.send(peer, peer.hello(), 2.0 + late)
    assert h.taken() == [] and h.link(peer.endpoint) is link and link.kinds() == ["Hello"]
    assert h.session.counters.get("sessions_restarted") == 1
    h.send(peer, peer.whisper(b"on"), 2.0 + late)
    assert h.taken() == [(WHISPER, b"on")]


def test_a_second_hello_crossing_ours_is_not_answered_and_the_next_is_a_restart() -> None:
    """bob said HELLO twice before ours reached him (his allowlist took our key late, and he
    gives up on a link without HELLO after ``evasive``): the second is not answered, so he
    has one HELLO of ours to take. A HELLO after that again, or another HELLO, is judged
    anew."""
    h = Harness()
    peer = Remote("bob", 50001)
    entered(h, peer)
    h.send(peer, peer.hello(), 2.0)
    h.send(peer, peer.hello(), 2.6)
    link = h.link(peer.endpoint)
    assert h.taken() == [] and link.kinds() == ["Hello"]
    h.session.peers[peer.uuid].unconfirmed = True
    h.send(peer, peer.hello(), 3.0)
    assert h.taken() == [(EXIT, "restarted (new HELLO)"), (ENTER, "bob")]
    h.send(peer, peer.hello(headers={"X-NEW": "1"}), 3.1)  # not the same: a restart
    assert h.taken() == [(EXIT, "restarted (new HELLO)"), (ENTER, "bob")]
    restarted = h.link(peer.endpoint)
    h.send(peer, peer.hello(headers={"X-NEW": "1"}), 3.1 + CONFIG.evasive)  # too late:
    assert h.link(peer.endpoint) is not restarted  # answered (ours again)
    assert h.session.counters.get("sessions_restarted") == 2 and h.taken() == []


# --------------------------------------------------------------------------
# The key gate in front of the session (a node with keys)

KEY = "K" * 40  # the Z85 key every remote here authenticated with


def gated(h: Harness) -> Callable[[Remote, zre.Message, float], None]:
    """A sender through a ``KeyGate`` (any key allowed) in front of ``h``'s session, its
    timer run with the session's by ``h.timer`` (as the node's timer runs both)."""
    from peermesh.io.zap import Allowlist
    from peermesh.zre.curve import KeyGate

    gate = h.gate = KeyGate(h.session, Allowlist(None))

    def send(peer: Remote, message: zre.Message, now: float) -> None:
        frames = zre.encode(message)
        if gate.admit(peer.identity, frames, KEY):
            h.receive(peer.identity, frames, now)
        else:
            h.take()  # (a key refused may remove its peer)

    return send


def test_the_key_gate_keeps_the_key_of_a_hello_the_session_still_decides_on() -> None:
    """A new node claims the endpoint of a peer whose link is open: the session PINGs the
    old one and holds the claim for up to ``interval``. A key-gate tick meanwhile must
    not forget which key the claimant's HELLO came with, or once the claim is settled
    everything the new peer sends is dropped as coming from an identity no key
    introduced."""
    h = Harness()
    send = gated(h)
    old, new = Remote("old", 50001), Remote("new", 50001)
    send(old, old.hello(headers={zre.PUBLIC_KEY_HEADER: KEY}), 0.0)
    assert (ENTER, "old") in h.taken()
    send(new, new.hello(headers={zre.PUBLIC_KEY_HEADER: KEY}), 1.0)
    assert h.taken() == []  # the claim waits for the old one's answer
    h.timer(1.5)
    h.timer(1.0 + CONFIG.interval)
    assert h.taken() == [(EXIT, "replaced by another node at its endpoint"), (ENTER, "new")]
    send(new, new.whisper(b"from new"), 2.5)
    assert h.taken() == [(WHISPER, b"from new")]


def test_the_key_gate_keeps_the_key_of_a_held_hello() -> None:
    """Past ``max_unproven`` a HELLO waits for a beacon from its endpoint; a key-gate tick
    meanwhile keeps its key, so the peer it lets in is heard."""
    h = Harness(CONFIG.replace(max_unproven=1))
    send = gated(h)
    first, held = Remote("first", 50001), Remote("held", 50002)
    send(first, first.hello(headers={zre.PUBLIC_KEY_HEADER: KEY}), 0.0)
    send(held, held.hello(headers={zre.PUBLIC_KEY_HEADER: KEY}), 0.1)
    assert held.uuid not in h.session.peers  # waits for a beacon from its endpoint
    h.timer(0.5)
    h.appeared(held.uuid, held.endpoint, 0.6)
    assert (ENTER, "held") in h.taken()
    send(held, held.whisper(b"from held"), 0.7)
    assert h.taken() == [(WHISPER, b"from held")]


# --------------------------------------------------------------------------
# The core contract: receive / handle_timer / next_deadline and what they return


def test_contract_a_hello_returns_dial_and_enter_and_whispers_come_as_deliver() -> None:
    c = Harness()
    peer = Remote("bob", 50001)
    me = b"\x01" + c.session.uuid.bytes
    assert c.send(peer, peer.hello(), 0.0) == [
        ("dial", peer.uuid, peer.endpoint, me), (ENTER, "bob", None)]
    # our HELLO waited for the link and went down it first
    assert c.link(peer.endpoint).kinds() == ["Hello"]
    assert c.send(peer, peer.whisper(b"one"), 0.1) == [("deliver", WHISPER, (b"one",))]
    assert c.send(peer, zre.Ping(peer.next()), 0.2) == []
    assert c.link(peer.endpoint).kinds() == ["Hello", "PingOk"]


def _bob_in_mine() -> tuple[Harness, Remote]:
    """A session in group "mine" that bob has said HELLO to."""
    c = Harness()
    c.add_group("mine")
    peer = Remote("bob", 50001)
    c.send(peer, peer.hello(), 0.0)
    return c, peer


def test_delivery_takes_in_what_receive_would_deliver_and_leaves_the_rest_to_it() -> None:
    c, peer = _bob_in_mine()
    session, identity = c.session, peer.identity
    event = session.delivery(identity, zre.encode(peer.whisper(b"one")), 0.1)
    assert event is not None and (event.type, event.name, event.frames) == (
        WHISPER, "bob", (b"one",))
    event = session.delivery(identity, zre.encode(zre.Shout(peer.next(), "mine", (b"a", b"b"))),
                             0.2)
    assert event is not None and (event.type, event.group, event.frames) == (
        SHOUT, "mine", (b"a", b"b"))
    assert (session.received_whispers, session.received_shouts) == (1, 1)
    assert session.peers[peer.uuid].last_seen == 0.2
    # anything else is left untouched for ``receive``: a PING, a SHOUT into another group,
    # a WHISPER out of sequence, one from a stranger
    others = [zre.Ping(peer.sequence + 1), zre.Shout(peer.sequence + 1, "other", (b"x",)),
              zre.Whisper(peer.sequence + 2, (b"gap",))]
    for message in others:
        assert session.delivery(identity, zre.encode(message), 0.3) is None
    stranger = Remote("stranger", 50002)
    assert session.delivery(stranger.identity, zre.encode(zre.Whisper(2, (b"x",))), 0.3) is None
    assert session.delivery(identity, [], 0.3) is None
    assert session.peers[peer.uuid].want == peer.sequence + 1  # (nothing taken in)
    # with outputs waiting (left outside ``receive``) the next WHISPER is ``receive``'s:
    # they come first, then its ``Deliver``
    session.peer_appeared(stranger.uuid, stranger.endpoint, 0.3)
    frames = zre.encode(peer.whisper(b"after"))
    assert session.delivery(identity, frames, 0.4) is None
    assert c.answer(session.receive(identity, frames, 0.4)) == [
        ("dial", stranger.uuid, stranger.endpoint, b"\x01" + session.uuid.bytes),
        ("deliver", WHISPER, (b"after",))]


def test_delivery_each_takes_a_batch_up_to_the_first_message_for_receive() -> None:
    c, peer = _bob_in_mine()
    session, identity = c.session, peer.identity
    stranger = Remote("stranger", 50002)

    def item(message: zre.Message) -> tuple[bytes, list[bytes]]:
        return identity, zre.encode(message)
    batch: list[tuple[bytes, object]] = [
        item(peer.whisper(b"one")), item(zre.Shout(peer.next(), "mine", (b"a", b"b"))),
        item(peer.whisper(b"two")), (identity, None),                  # oversized: stops
        item(peer.whisper(b"three")), item(zre.Ping(peer.next())),     # a command: stops
        item(peer.whisper(b"four")), (stranger.identity, zre.encode(zre.Whisper(1, (b"x",)))),
        item(zre.Whisper(peer.sequence + 5, (b"gap",))), (identity, [])]
    events: list[Event] = []
    assert session.delivery_each(batch, 0, 0.5, events.append) == 3
    assert [(e.type, e.group, e.frames) for e in events] == [
        (WHISPER, None, (b"one",)), (SHOUT, "mine", (b"a", b"b")), (WHISPER, None, (b"two",))]
    assert (session.received_whispers, session.received_shouts) == (2, 1)
    assert session.peers[peer.uuid].last_seen == 0.5
    assert session.delivery_each(batch, 3, 0.6, events.append) == 3       # (left as it was)
    assert session.delivery_each(batch, 4, 0.6, events.append) == 5
    assert c.answer(session.receive(*batch[5], 0.6)) == []   # (the PING, answered)
    assert session.delivery_each(batch, 6, 0.7, events.append) == 7       # the stranger's
    for start in (8, 9):                                                   # a gap, empty
        assert session.delivery_each(batch, start, 0.7, events.append) == start
    assert session.delivery_each(batch, len(batch), 0.7, events.append) == len(batch)
    assert [e.frames for e in events[3:]] == [(b"three",), (b"four",)]
    # with outputs waiting (left outside ``receive``) nothing is taken: they come first
    session.peer_appeared(stranger.uuid, stranger.endpoint, 0.8)
    assert session.delivery_each([item(peer.whisper(b"after"))], 0, 0.8, events.append) == 0
    assert len(events) == 5


@pytest.mark.parametrize("compiled", [False, True], ids=["python", "c"])
def test_a_batch_sink_gets_what_delivery_each_takes_with_the_octets(compiled: bool) -> None:
    # With ``batch_sink`` (and the extension's ``compiled_take``: one C call per run)
    # ``delivery_each`` takes in exactly what it takes one by one, the events equal to
    # those, handed on a batch at a time with each one's content octets
    from peermesh.io import zmqbatch

    take = getattr(zmqbatch.native, "zre_take", None)
    if compiled and take is None:
        pytest.skip(f"C extension unavailable: {zmqbatch.why_not}")
    runs = []
    for fast in (False, True):   # the reference (one by one), then the one tested
        c, peer = _bob_in_mine()
        session, identity = c.session, peer.identity
        if fast:   # (without compiled_take the batch sink is not used: sink is)
            session.compiled_take = take if compiled else None
            session.batch_sink = lambda got, octets: (events.extend(got), sizes.extend(octets))
        stranger = Remote("stranger", 50002)

        def item(message: zre.Message) -> tuple[bytes, Any]:
            return identity, zre.encode(message)
        batch: list[tuple[bytes, Any]] = [
            item(peer.whisper(b"one")), item(zre.Shout(peer.next(), "mine", (b"a", b"bc"))),
            item(zre.Whisper(peer.next(), ())), item(peer.whisper(b"two")), (identity, None),
            item(peer.whisper(b"three")), item(zre.Ping(peer.next())),
            item(zre.Shout(peer.next(), "other", (b"x",))),
            item(peer.whisper(b"four")), (stranger.identity, zre.encode(zre.Whisper(1, (b"x",)))),
            item(zre.Whisper(peer.sequence + 5, (b"gap",))), (identity, []),
            (identity, [b"\xaa\xa1\x02"])]
        events: list[Event] = []
        sizes: list[int] = []
        ends = []
        bob = session.peers[peer.uuid]
        for start, now in ((0, 0.5), (4, 0.6), (5, 0.6), (8, 0.7), (9, 0.7), (10, 0.7),
                           (11, 0.7), (12, 0.7), (len(batch), 0.7)):
            before = len(events)
            end = session.delivery_each(batch, start, now, events.append)
            if not (fast and compiled):
                sizes += [sum(map(len, e.frames)) for e in events[before:]]
            ends.append(end)
            if start == 5:   # the PING and the SHOUT into another group: receive's
                c.answer(session.receive(*batch[6], 0.6))
                c.answer(session.receive(*batch[7], 0.6))
                bob.next_ping, bob.evasive = 9.0, True   # (a silence: refreshed by the next)
        assert all(e == Event(e.type, bob.uuid, "bob", e.group, e.frames) for e in events)
        runs.append((ends, [(e.type, e.name, e.group, e.frames) for e in events], sizes,
                     session.received_whispers, session.received_shouts, bob.want,
                     bob.last_seen, bob.next_ping, bob.evasive))
    assert runs[0] == runs[1]
    ends, events, sizes = runs[1][:3]
    assert ends == [4, 4, 6, 9, 9, 10, 11, 12, 13]
    assert events == [
        (WHISPER, "bob", None, (b"one",)), (SHOUT, "bob", "mine", (b"a", b"bc")),
        (WHISPER, "bob", None, ()), (WHISPER, "bob", None, (b"two",)),
        (WHISPER, "bob", None, (b"three",)), (WHISPER, "bob", None, (b"four",))]
    assert sizes == [3, 3, 0, 3, 5, 4]
    assert runs[1][3:] == (5, 2, runs[1][5], 0.7, 0.0, False)   # (a SHOUT elsewhere counts)


def test_contract_a_silent_peer_is_evicted_at_the_deadline_it_named() -> None:
    c = Harness()
    peer = Remote("bob", 50001)
    c.send(peer, peer.hello(), 0.0)
    assert c.session.next_deadline() == 0.0  # (the first tick: at once)
    ran = c.run_until(CONFIG.expired + 5)
    assert ran == [(CONFIG.evasive, [(EVASIVE, "bob", None)]),
                   (CONFIG.silent, [(SILENT, "bob", None)]),
                   (CONFIG.expired, [(EXIT, "bob", "expired")])]
    assert peer.uuid not in c.session.peers and c.link(peer.endpoint).closed


def test_contract_a_discovery_report_dials_and_a_refused_dial_forgets_the_peer() -> None:
    c = Harness()
    found, refused = Remote("found", 50001), Remote("refused", 50002)
    c.session.peer_appeared(found.uuid, found.endpoint, 0.0)
    assert c.answer(c.session.take()) == [("dial", found.uuid, found.endpoint,
                                           b"\x01" + c.session.uuid.bytes)]
    assert c.link(found.endpoint).kinds() == ["Hello"]
    c.session.peer_appeared(refused.uuid, refused.endpoint, 0.0)
    assert c.answer(c.session.take(), refuse=True) == [  # forgotten quietly: it never entered
        ("dial", refused.uuid, refused.endpoint, b"\x01" + c.session.uuid.bytes)]
    assert refused.uuid not in c.session.peers and found.uuid in c.session.peers
    assert c.session.take() == []


def test_contract_a_claim_is_settled_on_the_deadlines_it_names() -> None:
    """A new node says HELLO from a live peer's endpoint: the old one is PINGed and the
    session asks for its timer at once and every few milliseconds after (its link may
    close at any time), backing off; no answer within ``interval`` and the new node is
    in: EXIT of the old, a Dial and ENTER of the new, at the deadline that reached it."""
    c = Harness(linked=lambda identity: True)
    old, new = Remote("old", 50001), Remote("new", 50001)
    c.send(old, old.hello(), 0.0)
    c.timer(0.0)
    assert c.send(new, new.hello(), 0.5) == []
    assert c.link(old.endpoint).kinds() == ["Hello", "Ping"]
    assert c.session.next_deadline() == 0.5  # settle at once
    ran = c.run_until(0.5 + CONFIG.interval)
    assert ran == [(0.5 + CONFIG.interval, [
        (EXIT, "old", "replaced by another node at its endpoint"),
        ("dial", new.uuid, new.endpoint, b"\x01" + c.session.uuid.bytes),
        (ENTER, "new", None)])]
    # nothing waits now: the next tick only, a period after the one that settled it
    assert c.session.next_deadline() == 0.5 + 2 * CONFIG.interval
