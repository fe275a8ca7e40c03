"""``ThreadedNode``: the Node API from ordinary threads, without gevent in the caller.

Test bodies here use plain threads only (no gevent), except
``test_gevent_node_and_threaded_node_in_one_process``, where a gevent ``Node``
on the main thread's hub talks to a ``ThreadedNode``.
Every node runs on ``lo`` with a free UDP beacon port and is stopped by a
fixture finaliser.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Optional

import pytest

import waiting
from peermesh import (Event, EventType, InterfaceError, Node, NodeConfig, NodeStateError,
                      PeermeshError, ThreadedNode, UnknownPeerError)
from peermesh.overlay import ROLES_HEADER, Lifecycle, Overlay

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
WHISPER, SHOUT, STOP = EventType.WHISPER, EventType.SHOUT, EventType.STOP

INTERVAL = 0.05
TIMEOUT = 5.0


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float = TIMEOUT) -> Event:
    """``waiting.wait_for`` with this module's bound."""
    return waiting.wait_for(node, predicate, timeout)


drain = waiting.drain


def match(type: EventType, peer: Optional[uuid.UUID] = None,
          group: Optional[str] = None) -> Callable[[Event], bool]:
    def predicate(event: Event) -> bool:
        return (event.type is type and (peer is None or event.peer == peer)
                and (group is None or event.group == group))
    predicate.__name__ = f"match({type.value}, {peer and peer.hex[:8]}, {group})"
    return predicate


@pytest.fixture
def make_tnode(free_udp_port: int) -> Iterator[Callable[..., ThreadedNode]]:
    """``make_tnode(name, start=True, **settings)``: a loopback ThreadedNode, stopped
    at teardown."""
    nodes: list[ThreadedNode] = []

    def make(name: Optional[str] = None, *, start: bool = True, **settings: Any) -> ThreadedNode:
        settings.setdefault("interface", "lo")
        settings.setdefault("port", free_udp_port)
        settings.setdefault("interval", INTERVAL)
        node = ThreadedNode(name, config=NodeConfig(), **settings)
        nodes.append(node)
        return node.start() if start else node

    yield make
    for node in reversed(nodes):
        node.stop(timeout=0.5)


def meet(a: ThreadedNode, b: ThreadedNode) -> None:
    wait_for(a, match(ENTER, b.uuid))
    wait_for(b, match(ENTER, a.uuid))


def test_two_threaded_nodes_mesh_shout_and_whisper(make_tnode):
    alice = make_tnode("alice", groups=["g"], headers={"role": "a"})
    bob = make_tnode("bob", groups=["g"])
    entered = wait_for(alice, match(ENTER, bob.uuid))
    assert (entered.name, entered.address) == ("bob", bob.endpoint)
    wait_for(alice, match(JOIN, bob.uuid, "g"))
    entered = wait_for(bob, match(ENTER, alice.uuid))
    assert entered.headers == {"role": "a"}
    wait_for(bob, match(JOIN, alice.uuid, "g"))

    assert alice.peers() == [bob.uuid]
    assert bob.peer_name(alice.uuid) == "alice"
    assert bob.peer_address(alice.uuid) == alice.endpoint
    assert bob.peer_headers(alice.uuid) == {"role": "a"}
    assert bob.peer_header_value(alice.uuid, "role") == "a"
    assert bob.peer_groups(alice.uuid) == ["g"]
    assert bob.peers_by_group("g") == [alice.uuid]
    assert bob.known_groups() == ["g"]
    assert bob.groups() == ["g"]
    assert bob.find_peer("alice") == alice.uuid
    assert bob.peer_info(alice.uuid).name == "alice"
    (info,) = bob.peer_infos()
    assert (info.uuid, info.state, info.roles) == (alice.uuid, "alive", [])
    assert info.last_heard >= 0

    bob.shout("g", b"hello", b"", b"world")
    event = wait_for(alice, match(SHOUT, bob.uuid, "g"))
    assert event.frames == (b"hello", b"", b"world")
    alice.whisper(bob.uuid, b"psst")
    alice.whisper(bob.uuid.hex, b"by hex")
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"psst",)
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"by hex",)
    alice.whisper_packed(bob.uuid, {"k": [1, 2]})
    assert wait_for(bob, match(WHISPER, alice.uuid)).unpack() == {"k": [1, 2]}
    bob.shout_packed("g", "packed")
    assert wait_for(alice, match(SHOUT, bob.uuid)).unpack() == "packed"

    alice.join("more")
    assert wait_for(bob, match(JOIN, alice.uuid)).group == "more"
    alice.leave("more")
    assert wait_for(bob, match(LEAVE, alice.uuid)).group == "more"
    assert alice.groups() == ["g"]


def test_recv_times_out_with_none(make_tnode):
    lone = make_tnode("lone")
    started = time.monotonic()
    assert lone.recv(timeout=0.1) is None
    assert time.monotonic() - started < TIMEOUT
    assert list(lone.events(timeout=0.05)) == []


def test_events_iterates_until_stop(make_tnode):
    alice = make_tnode("alice")
    bob = make_tnode("bob")
    meet(alice, bob)
    for i in range(5):
        bob.whisper(alice.uuid, b"%d" % i)
    got = []
    for event in alice.events(timeout=TIMEOUT):
        if event.type is WHISPER:
            got.append(event.message)
            if len(got) == 5:
                break
    assert got == [b"0", b"1", b"2", b"3", b"4"]

    bob.whisper(alice.uuid, b"last")
    assert wait_for(alice, match(WHISPER, bob.uuid)).message == b"last"
    alice.stop()
    rest = list(alice.events(timeout=TIMEOUT))  # ends at STOP, not at a timeout
    assert rest and rest[-1].type is STOP, rest


def test_many_threads_whisper_through_one_node(make_tnode):
    sender = make_tnode("sender")
    receiver = make_tnode("receiver")
    meet(sender, receiver)
    threads_n, per_thread = 8, 250
    barrier = threading.Barrier(threads_n)
    errors: "queue.Queue[BaseException]" = queue.Queue()

    def worker(t: int) -> None:
        try:
            barrier.wait(TIMEOUT)
            for i in range(per_thread):
                sender.whisper(receiver.uuid, b"%d:%d" % (t, i))
        except BaseException as exc:  # reported by the main thread
            errors.put(exc)

    workers = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads_n)]
    for thread in workers:
        thread.start()
    got: dict[int, list[int]] = {t: [] for t in range(threads_n)}
    for _ in range(threads_n * per_thread):
        event = wait_for(receiver, lambda e: e.type in (WHISPER, EXIT), timeout=10)
        assert event.type is WHISPER, event
        t, i = map(int, event.message.split(b":"))
        got[t].append(i)
    for thread in workers:
        thread.join(TIMEOUT)
        assert not thread.is_alive()
    assert errors.empty(), errors.get()
    # Each thread's messages arrive, all of them, in the order it sent them.
    assert got == {t: list(range(per_thread)) for t in range(threads_n)}


def test_small_event_queue_read_slowly_from_a_thread_loses_nothing(make_tnode):
    """The receiving node pauses its mailbox whenever 50 events wait and resumes
    as this thread takes them: every message arrives, in order."""
    receiver = make_tnode("receiver", event_queue=50)
    sender = make_tnode("sender")
    meet(receiver, sender)
    count = 3000
    errors: list[BaseException] = []

    def send_all() -> None:
        try:
            for i in range(count):
                sender.whisper(receiver.uuid, i.to_bytes(4, "big") + b"x" * 1000)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=send_all, daemon=True)
    thread.start()
    got = []
    for event in receiver.events(timeout=TIMEOUT):
        assert event.type is WHISPER, event
        got.append(int.from_bytes(event.frames[0][:4], "big"))
        if len(got) == count:
            break
        if len(got) % 100 == 0:
            time.sleep(0.001)  # a slow reader
    thread.join(TIMEOUT)
    assert not errors, errors
    assert got == list(range(count))


def test_exceptions_reach_the_calling_thread(make_tnode):
    alice = make_tnode("alice")
    bob = make_tnode("bob")
    meet(alice, bob)
    with pytest.raises(UnknownPeerError):
        alice.whisper(uuid.uuid4(), b"nobody")
    with pytest.raises(TypeError):
        alice.whisper(bob.uuid, 42)
    with pytest.raises(ValueError):
        alice.join("x" * 256)
    with pytest.raises(UnknownPeerError, match="no peer"):
        alice.find_peer("carol")

    caught: list[BaseException] = []

    def other_thread() -> None:
        try:
            alice.peer_name(uuid.uuid4())
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(TIMEOUT)
    assert len(caught) == 1 and isinstance(caught[0], UnknownPeerError), caught

    # The node is unharmed.
    alice.whisper(bob.uuid, b"still fine")
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"still fine",)


def test_start_errors_reach_the_caller(make_tnode):
    node = make_tnode("twice")
    with pytest.raises(NodeStateError):
        node.start()
    lost = make_tnode("lost", interface="no-such-if0", start=False)
    with pytest.raises(InterfaceError):
        lost.start()
    assert not lost.running
    fresh = make_tnode("fresh", start=False)
    with pytest.raises(NodeStateError):
        fresh.whisper(uuid.uuid4(), b"x")
    with pytest.raises(NodeStateError):
        fresh.peers()
    with pytest.raises(NodeStateError):
        fresh.recv(0)


def test_stop_is_clean_and_idempotent(make_tnode):
    before = set(threading.enumerate())
    alice = make_tnode("alice")
    bob = make_tnode("bob")
    meet(alice, bob)
    assert len(set(threading.enumerate()) - before) == 2  # one thread per node

    alice.stop()
    assert not alice.running
    alice.stop()  # again: nothing happens
    assert len(set(threading.enumerate()) - before) == 1  # alice's thread has ended
    assert wait_for(bob, match(EXIT, alice.uuid)).reason == "left"
    rest = drain(alice)
    assert rest and rest[-1].type is STOP, rest
    assert alice.recv(0.05) is None
    with pytest.raises(NodeStateError):
        alice.whisper(bob.uuid, b"after stop")
    with pytest.raises(NodeStateError):
        alice.peers()

    bob.stop()
    bob.stop()
    assert set(threading.enumerate()) - before == set()


def test_stop_flushes_what_was_sent(make_tnode):
    alice = make_tnode("alice")
    bob = make_tnode("bob")
    meet(alice, bob)
    for i in range(100):
        alice.whisper(bob.uuid, b"%d" % i)
    alice.stop()
    got = []
    while True:
        event = wait_for(bob, lambda e: e.type in (WHISPER, EXIT))
        if event.type is EXIT:
            break
        got.append(event.message)
    assert got == [b"%d" % i for i in range(100)]
    assert event.reason == "left"


def test_gevent_node_and_threaded_node_in_one_process(make_tnode, free_udp_port):
    """A Node on the main thread's hub and a ThreadedNode talk to each other. Waits on
    the ThreadedNode run in gevent's thread pool so the main hub keeps serving."""
    import gevent

    pool = gevent.get_hub().threadpool
    green = Node("green", config=NodeConfig(), interface="lo", port=free_udp_port,
                 interval=INTERVAL, groups=["mixed"])
    threaded = make_tnode("threaded", start=False, groups=["mixed"])
    try:
        green.start()
        pool.apply(threaded.start)
        entered = wait_for(green, match(ENTER, threaded.uuid))
        assert entered.address == threaded.endpoint
        wait_for(green, match(JOIN, threaded.uuid, "mixed"))
        entered = pool.apply(wait_for, (threaded, match(ENTER, green.uuid)))
        assert entered.address == green.endpoint
        pool.apply(wait_for, (threaded, match(JOIN, green.uuid, "mixed")))

        green.whisper(threaded.uuid, b"from green")
        event = pool.apply(wait_for, (threaded, match(WHISPER, green.uuid)))
        assert event.frames == (b"from green",)
        pool.apply(threaded.shout, ("mixed", b"from", b"threaded"))
        event = wait_for(green, match(SHOUT, threaded.uuid, "mixed"))
        assert event.frames == (b"from", b"threaded")
        pool.apply(threaded.whisper, (green.uuid, b"reply"))
        assert wait_for(green, match(WHISPER, threaded.uuid)).frames == (b"reply",)

        pool.apply(threaded.stop)
        assert wait_for(green, match(EXIT, threaded.uuid)).reason == "left"
    finally:
        pool.apply(threaded.stop)
        green.stop(timeout=0.5)


def test_whisper_copies_its_frames_and_checks_them_in_the_caller(make_tnode):
    alice = make_tnode("alice", groups=["g"])
    bob = make_tnode("bob", groups=["g"])
    meet(alice, bob)
    buffer = bytearray(b"before")
    alice.whisper(bob.uuid, buffer, memoryview(b"+view"), "+text")
    buffer[:] = b"after!"  # the send was queued: what it sends was copied at the call
    assert wait_for(bob, match(WHISPER, alice.uuid)).frames == (b"before", b"+view", b"+text")

    with pytest.raises(UnknownPeerError, match="not a peer UUID"):
        alice.whisper("bob", b"x")
    with pytest.raises(UnknownPeerError):
        alice.whisper_packed(uuid.uuid4().hex, [1])
    with pytest.raises(TypeError):
        alice.shout("g", b"ok", None)
    with pytest.raises(ValueError):
        alice.shout("g" * 300, b"x")
    with pytest.raises(TypeError):
        alice.shout_packed("g", object())
    with pytest.raises(ValueError, match="at least one content frame"):
        alice.whisper(bob.uuid)
    with pytest.raises(ValueError, match="at least one content frame"):
        alice.shout("g")
    alice.shout("g", b"still", b"fine")
    assert wait_for(bob, match(SHOUT, alice.uuid, "g")).frames == (b"still", b"fine")


def flood(sender: ThreadedNode, slow: ThreadedNode, count: int = 1000) -> None:
    """Whisper more than ``slow`` (a small event queue nobody reads) takes in: its
    mailbox pauses, and what follows (a PING) stays unread until its events are read."""
    for i in range(count):
        sender.whisper(slow.uuid, b"%d" % i)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; the list gets its result or its exception."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:  # reported by the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_call_waiting_on_a_slow_peer_holds_up_no_other_thread(make_tnode):
    alice = make_tnode("alice")
    slow = make_tnode("slow", event_queue=20)
    meet(alice, slow)
    carol = make_tnode("carol")  # now: meet() skips the events before the one it waits for
    meet(alice, carol)
    flood(alice, slow)
    flushing = threading.Event()

    def flush_on_hub(node: Node) -> bool:
        flushing.set()
        return node.flush(TIMEOUT * 2)  # waits for slow's PING-OK

    thread, outcome = in_thread(lambda: alice.call(flush_on_hub))
    assert flushing.wait(TIMEOUT)
    # The flush is under way and cannot end before slow is read; other calls go on.
    alice.whisper(carol.uuid, b"not held up")
    assert wait_for(carol, match(WHISPER, alice.uuid)).frames == (b"not held up",)
    assert sorted(alice.peers()) == sorted([slow.uuid, carol.uuid])
    assert thread.is_alive() and outcome == []

    got = []
    while len(got) < 1000:
        got.append(wait_for(slow, match(WHISPER, alice.uuid)).message)
    assert got == [b"%d" % i for i in range(1000)]
    thread.join(TIMEOUT)
    assert outcome == [True]


def test_stop_ends_a_call_that_waits(make_tnode):
    alice = make_tnode("alice")
    slow = make_tnode("slow", event_queue=20)
    meet(alice, slow)
    flood(alice, slow)
    flushing = threading.Event()

    def flush_on_hub(node: Node) -> bool:
        flushing.set()
        return node.flush(60)

    thread, outcome = in_thread(lambda: alice.call(flush_on_hub))
    assert flushing.wait(TIMEOUT)
    alice.stop(timeout=0.2)
    thread.join(TIMEOUT)
    assert len(outcome) == 1 and isinstance(outcome[0], NodeStateError), outcome
    assert not alice.running


class Recorder(Overlay):
    """An overlay that advertises a header and records its life on ``log``."""

    roles = ("test-recorder",)

    def __init__(self, label: str, log: list[tuple[str, str, bool, str]]) -> None:
        super().__init__()
        self.label = label
        self.log = log

    def headers(self) -> dict[str, str]:
        return {f"X-TEST-{self.label}": "yes"}

    def _record(self, what: str) -> None:
        assert self.node is not None
        self.log.append((self.label, what, self.node.running, threading.current_thread().name))

    def on_attach(self, node: Node) -> None:
        self._record("attach")

    def on_start(self) -> None:
        self._record("start")

    def on_stop(self, timeout: float) -> None:
        self._record("stop")


class BrokenError(PeermeshError):
    pass


class Broken(Overlay):
    def on_start(self) -> None:
        raise BrokenError("cannot start")


def test_overlays_live_on_the_hub_around_the_node(make_tnode):
    log: list[tuple[str, str, bool, str]] = []
    first, second = Recorder("a", log), Recorder("b", log)
    alice = make_tnode("alice", overlays=[first, second])
    bob = make_tnode("bob")
    entered = wait_for(bob, match(ENTER, alice.uuid))
    assert entered.headers == {"X-TEST-a": "yes", "X-TEST-b": "yes",
                               ROLES_HEADER: "test-recorder"}
    assert alice.call(lambda node: (first.running, second.running)) == (True, True)

    alice.stop()
    hub = "peermesh-alice"
    assert log == [("a", "attach", False, hub), ("b", "attach", False, hub),
                   ("a", "start", True, hub), ("b", "start", True, hub),
                   ("b", "stop", True, hub), ("a", "stop", True, hub)]
    assert first.lifecycle is second.lifecycle is Lifecycle.STOPPED
    assert wait_for(bob, match(EXIT, alice.uuid)).reason == "left"


def test_an_overlay_that_fails_to_start_stops_those_started(make_tnode):
    before = set(threading.enumerate())
    log: list[tuple[str, str, bool, str]] = []
    started = Recorder("a", log)
    node = make_tnode("alice", start=False, overlays=[started, Broken()])
    with pytest.raises(BrokenError, match="cannot start"):
        node.start()
    assert [entry[:2] for entry in log] == [("a", "attach"), ("a", "start"), ("a", "stop")]
    assert started.lifecycle is Lifecycle.STOPPED
    assert not node.running
    with pytest.raises(NodeStateError):
        node.peers()
    for thread in set(threading.enumerate()) - before:
        thread.join(TIMEOUT)
        assert not thread.is_alive()
