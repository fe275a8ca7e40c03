"""Hostile input: a node must shrug off bad beacons and bad mailbox traffic.

Setup of every test (fixture ``mesh``): the node under test ("target") and one
good peer ("good"), both ``ThreadedNode``s on ``lo`` with a private beacon
port, in group "hostile". Once they have seen each other ENTER, a chatter
thread whispers numbered messages both ways every 20 ms for the whole test.
The hostile traffic comes from ``RawPeer`` (tests/rawpeer.py), which builds
every datagram and frame by hand.

After each hostile act a test calls ``mesh.assert_serving()``: a fresh token
goes good -> target and back, the chatter arrived complete and in order both
ways, and the target never dropped the good peer. ``mesh.raw_enters()`` lists
the ENTERs the target reported for anyone but the good peer, so each test
states exactly which ENTERs it expects (none are spurious).

Barriers instead of sleeps:

* beacons: a fresh probe ``RawPeer`` beacons its own mailbox; when the target's
  HELLO reaches the probe, every datagram sent before was handled. A hostile
  beacon carries the raw peer's UUID and mailbox port (or the target's own
  UUID with the raw peer's port), so wrongly accepting it would make the
  target say HELLO to the raw peer's mailbox, which is checked last;
* mailbox: ZeroMQ keeps the order of one connection, so a valid HELLO sent
  after the garbage on the same DEALER is handled after it: its ENTER proves
  the garbage was handled (and ignored).
"""

from __future__ import annotations

import errno
import itertools
import random
import socket
import threading
import time
import uuid as uuid_module
from collections.abc import Callable, Sequence
from typing import Optional
from uuid import UUID

import pytest
import zmq

from peermesh import ThreadedNode
from peermesh.events import Event, EventType
from peermesh.wire import zre

try:  # tests/ as a package
    from .rawpeer import RawPeer
except ImportError:  # tests/ on sys.path (pytest's default "prepend" import mode)
    from rawpeer import RawPeer
from waiting import poll_until

WAIT = 5.0  # seconds allowed for anything that should happen on loopback
QUIET = 0.3  # seconds a mailbox must stay quiet to show that something did NOT happen
MAX_MESSAGE = 4096  # the target's NodeConfig.max_message

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
WHISPER, SHOUT, STOP = EventType.WHISPER, EventType.SHOUT, EventType.STOP

pytestmark = pytest.mark.usefixtures("zmq_path")  # native C batches and pyzmq alone


# --------------------------------------------------------------------------
# Event collection


class Watcher:
    """Drains a ThreadedNode's events in a thread into a list tests can wait on."""

    def __init__(self, node: ThreadedNode) -> None:
        self.node = node
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"watch-{node.name}")
        self._thread.start()

    def _run(self) -> None:
        recv = self.node.recv
        while not self._quit.is_set():
            event = recv(0.05)
            if event is None:
                if not self.node.running:
                    return
                continue
            batch = [event]
            while len(batch) < 4096 and (event := recv(0)) is not None:
                batch.append(event)
            with self._cond:
                self.events.extend(batch)
                self._cond.notify_all()
            if batch[-1].type is STOP:
                return

    def close(self) -> None:
        self._quit.set()
        self._thread.join(2)

    def mark(self) -> int:
        """Index of the next event: pass it as ``start`` to look only at later events."""
        with self._cond:
            return len(self.events)

    def since(self, start: int, peer: Optional[UUID] = None) -> list[Event]:
        """Events from index ``start`` on (only those about ``peer`` if given)."""
        with self._cond:
            events = self.events[start:]
        return [e for e in events if peer is None or e.peer == peer]

    def collect(self, pred: Callable[[Event], bool], count: int, *, start: int = 0,
                timeout: float = WAIT, fail: Optional[Callable[[Event], bool]] = None
                ) -> list[tuple[int, Event]]:
        """Wait for ``count`` events matching ``pred`` from index ``start``: (index, event).

        An event matching ``fail`` on the way raises AssertionError at once.
        """
        deadline = time.monotonic() + timeout
        found: list[tuple[int, Event]] = []
        i = start
        with self._cond:
            while True:
                events = self.events
                while i < len(events) and len(found) < count:
                    if pred(events[i]):
                        found.append((i, events[i]))
                    elif fail is not None and fail(events[i]):
                        raise AssertionError(f"{self.node.name}: {events[i]} after {len(found)} "
                                             f"of {count} awaited events")
                    i += 1
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    tail = events[max(start, len(events) - 15):]
                    raise AssertionError(f"{self.node.name}: {len(found)} of {count} awaited "
                                         f"events within {timeout} s; last events: {tail}")
                self._cond.wait(remaining)

    def wait_for(self, pred: Callable[[Event], bool], *, start: int = 0,
                 timeout: float = WAIT) -> Event:
        """The first event from index ``start`` matching ``pred`` (waits up to ``timeout``)."""
        return self.collect(pred, 1, start=start, timeout=timeout)[0][1]

    def index_of(self, pred: Callable[[Event], bool], *, start: int = 0,
                 timeout: float = WAIT) -> int:
        """Index of the first event from ``start`` matching ``pred``."""
        return self.collect(pred, 1, start=start, timeout=timeout)[0][0]


def is_(kind: EventType, peer: UUID, frames: Optional[tuple[bytes, ...]] = None
        ) -> Callable[[Event], bool]:
    """Predicate: an event of ``kind`` about ``peer`` (with exactly ``frames`` if given)."""
    return lambda e: e.type is kind and e.peer == peer and (frames is None or e.frames == frames)


# --------------------------------------------------------------------------
# The mesh under test


class Chatter:
    """Whispers ``chat:<n>`` good -> target and target -> good every 20 ms."""

    PREFIX = b"chat:"

    def __init__(self, target: ThreadedNode, good: ThreadedNode) -> None:
        self.target, self.good = target, good
        self.sent = 0
        self.error: Optional[BaseException] = None
        self._lock = threading.Lock()
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="chatter")
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._quit.wait(0.02):
                with self._lock:
                    n = self.sent + 1
                    payload = b"%s%d" % (self.PREFIX, n)
                    self.good.whisper(self.target.uuid, payload)
                    self.target.whisper(self.good.uuid, payload)
                    self.sent = n
        except BaseException as exc:  # reported by Mesh.assert_serving
            if not self._quit.is_set():
                self.error = exc

    def snapshot(self) -> int:
        """How many chat messages went each way so far."""
        with self._lock:
            return self.sent

    def close(self) -> None:
        self._quit.set()
        self._thread.join(5)


class Mesh:
    """The target node, the good peer, their event watchers and the chatter."""

    def __init__(self, port: int, **target_settings: object) -> None:
        self.port = port
        self.target_settings = target_settings
        self.target: Optional[ThreadedNode] = None
        self.good: Optional[ThreadedNode] = None
        self.watchers: list[Watcher] = []
        self.chatter: Optional[Chatter] = None
        self._tokens = itertools.count(1)

    def start(self) -> "Mesh":
        self.target = ThreadedNode("target", interface="lo", port=self.port,
                                   groups=("hostile",), headers={"role": "target"},
                                   **{"max_message": MAX_MESSAGE, **self.target_settings})
        self.target.start()
        self.events = Watcher(self.target)
        self.watchers.append(self.events)
        self.good = ThreadedNode("good", interface="lo", port=self.port, groups=("hostile",))
        self.good.start()
        self.good_events = Watcher(self.good)
        self.watchers.append(self.good_events)
        self.events.wait_for(is_(ENTER, self.good.uuid))
        self.good_events.wait_for(is_(ENTER, self.target.uuid))
        self.base = self.events.mark()
        self.chatter = Chatter(self.target, self.good)
        return self

    def close(self) -> None:
        if self.chatter is not None:
            self.chatter.close()
        for node in (self.good, self.target):
            if node is not None:
                node.stop(0.5)
        for watcher in self.watchers:
            watcher.close()

    @property
    def endpoint(self) -> str:
        assert self.target is not None and self.target.endpoint is not None
        return self.target.endpoint

    @property
    def uuid(self) -> UUID:
        assert self.target is not None
        return self.target.uuid

    def raw_enters(self) -> list[UUID]:
        """Peers of the ENTERs the target reported since the mesh formed."""
        return [e.peer for e in self.events.since(self.base) if e.type is ENTER]

    def assert_serving(self) -> None:
        """The target still exchanges whispers both ways with the good peer."""
        target, good, chatter = self.target, self.good, self.chatter
        assert target is not None and good is not None and chatter is not None
        assert target.running and good.running
        token = b"token-%d" % next(self._tokens)
        good.whisper(target.uuid, token)
        self.events.wait_for(is_(WHISPER, good.uuid, (token,)), start=self.base)
        target.whisper(good.uuid, token)
        self.good_events.wait_for(is_(WHISPER, target.uuid, (token,)))
        # The chatter so far arrived complete and in order, both ways.
        assert chatter.error is None, f"chatter failed: {chatter.error!r}"
        sent = chatter.snapshot()
        for watcher, sender in ((self.events, good.uuid), (self.good_events, target.uuid)):
            chat = [ev for _, ev in watcher.collect(
                lambda e: (e.type is WHISPER and e.peer == sender
                           and e.frames[:1] != () and e.frames[0].startswith(Chatter.PREFIX)),
                sent)]
            numbers = [int(e.frames[0][len(Chatter.PREFIX):]) for e in chat]
            assert numbers == list(range(1, sent + 1)), f"chatter out of order at {watcher.node}"
        exits = [e for e in self.events.since(0, good.uuid) if e.type is EXIT]
        assert not exits, f"target dropped the good peer: {exits}"
        assert target.uuid in good.peers() and good.uuid in target.peers()


@pytest.fixture
def mesh(free_udp_port: int, request: pytest.FixtureRequest) -> Mesh:
    """A running target + good peer on lo with a private beacon port."""
    m = Mesh(free_udp_port)
    request.addfinalizer(m.close)
    return m.start()


@pytest.fixture
def make_raw(request: pytest.FixtureRequest) -> Callable[..., RawPeer]:
    """``make_raw(**kw) -> RawPeer``, closed by the finaliser."""

    def make(**kw: object) -> RawPeer:
        peer = RawPeer(**kw)  # type: ignore[arg-type]
        request.addfinalizer(peer.close)
        return peer

    return make


# --------------------------------------------------------------------------
# Helpers


def beacon_barrier(mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    """Return once the target's beacon listener handled everything sent before.

    A fresh probe beacons its mailbox (again every 100 ms, in case the burst
    before overflowed the socket buffer) until the target's HELLO arrives,
    then says goodbye with a port-0 beacon.
    """
    probe = make_raw(name="probe")
    deadline = time.monotonic() + WAIT
    while True:
        probe.beacon(mesh.port)
        got = probe.recv_from(0.1)
        while got is not None and got[0] != mesh.uuid:
            got = probe.recv_from(0.1)
        if got is not None:
            assert isinstance(got[1], zre.Hello) and got[1].sequence == 1
            break
        assert time.monotonic() < deadline, "the target's beacon listener stopped answering"
    probe.beacon(mesh.port, 0)
    probe.close()


def assert_no_mail(raw: RawPeer, timeout: float = QUIET) -> None:
    """Nobody connected to ``raw``'s mailbox and said anything within ``timeout``."""
    got = raw.recv_from(timeout)
    assert got is None, f"unexpected message to {raw}: {got}"


def assert_none(watcher: Watcher, pred: Callable[[Event], bool], *, start: int,
                window: float = QUIET) -> None:
    """No event matching ``pred`` from index ``start`` within ``window`` seconds."""
    try:
        found = watcher.wait_for(pred, start=start, timeout=window)
    except AssertionError:
        return
    raise AssertionError(f"unexpected {found}")


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def enter_raw(mesh: Mesh, raw: RawPeer, **hello: object) -> Event:
    """Connect ``raw`` to the target and say HELLO: the ENTER (the target's HELLO is eaten)."""
    start = mesh.events.mark()
    if raw.dealer is None:
        raw.connect(mesh.endpoint)
    raw.hello(**hello)  # type: ignore[arg-type]
    enter = mesh.events.wait_for(is_(ENTER, raw.uuid), start=start)
    answer = raw.expect(zre.Hello, sender=mesh.uuid)
    assert answer.sequence == 1
    return enter


def assert_whisper_delivered(mesh: Mesh, raw: RawPeer, payload: bytes) -> None:
    """``raw`` whispers ``payload`` with its next sequence and the target reports it."""
    start = mesh.events.mark()
    raw.whisper(payload)
    mesh.events.wait_for(is_(WHISPER, raw.uuid, (payload,)), start=start)


# Hand-built ZRE fields (spec 36/ZRE), so tests can also build wrong ones.

def s1(data: bytes) -> bytes:
    """string: 1-octet length + octets."""
    return bytes([len(data)]) + data


def s4(data: bytes) -> bytes:
    """longstr: 4-octet length + octets."""
    return len(data).to_bytes(4, "big") + data


def n4(value: int) -> bytes:
    return value.to_bytes(4, "big")


def header(command: int, sequence: int = 1, *, signature: bytes = b"\xaa\xa1",
           version: int = 2) -> bytes:
    return signature + bytes([command, version]) + sequence.to_bytes(2, "big")


def hello_frame(endpoint: bytes, *, groups: Sequence[bytes] = (), status: int = 0,
                name: bytes = b"raw", headers: Sequence[tuple[bytes, bytes]] = (),
                groups_count: Optional[int] = None, headers_count: Optional[int] = None,
                sequence: int = 1, signature: bytes = b"\xaa\xa1", version: int = 2) -> bytes:
    """A HELLO command frame built field by field; counts may lie."""
    return b"".join((
        header(1, sequence, signature=signature, version=version),
        s1(endpoint),
        n4(len(groups) if groups_count is None else groups_count),
        *(s4(g) for g in groups),
        bytes([status]),
        s1(name),
        n4(len(headers) if headers_count is None else headers_count),
        *(s1(k) + s4(v) for k, v in headers),
    ))


# --------------------------------------------------------------------------
# Beacons


def malformed_beacons(raw: RawPeer, target: UUID) -> dict[str, list[bytes]]:
    """Datagrams a node must drop, each carrying ``raw``'s UUID and mailbox port."""
    good = raw.beacon_bytes()
    body = good[4:]
    return {
        "empty": [b""],
        "truncated": [good[:n] for n in range(1, 22)],
        "valid-prefix-too-long": [good + b"\x00", good + b"\x00" * 2, good + b"\x00" * 10,
                                  good + bytes(42)],
        "valid-prefix-oversized": [good + bytes(n - 22) for n in (64, 65, 512, 1500, 2000)],
        "zyre-curve-v3-54-bytes": [b"ZRE\x03" + body + bytes(range(32))],
        "curve-header-v3-22-bytes": [b"ZRE\x03" + body],
        "wrong-version": [b"ZRE" + bytes([v]) + body for v in (0, 2, 3, 0x7F, 0xFF)],
        "wrong-header": [b"ZRF\x01" + body, b"zre\x01" + body, b"\x00RE\x01" + body,
                         b"ZR\x00\x01" + body],
        "own-uuid": [zre.encode_beacon(zre.Beacon(target.bytes, raw.port))],
    }


MALFORMED_KINDS = ["empty", "truncated", "valid-prefix-too-long", "valid-prefix-oversized",
                   "zyre-curve-v3-54-bytes", "curve-header-v3-22-bytes", "wrong-version",
                   "wrong-header", "own-uuid"]


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
def test_malformed_beacon_is_dropped(mesh: Mesh, make_raw: Callable[..., RawPeer],
                                     kind: str) -> None:
    raw = make_raw()
    datagrams = malformed_beacons(raw, mesh.uuid)[kind]
    for data in datagrams:
        raw.datagram(mesh.port, data)
    beacon_barrier(mesh, make_raw)
    mesh.assert_serving()
    assert_no_mail(raw)  # nobody took it for a beacon and connected to raw
    assert mesh.raw_enters() == []


def test_random_datagrams_on_beacon_port(mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    rng = random.Random(0x5EED)
    raw = make_raw()
    good = raw.beacon_bytes()
    datagrams = [bytes(rng.getrandbits(8) for _ in range(n))
                 for n in [0, 1, 3, 4, 21, 22, 23, 53, 54, 55, 64, 65, 1000, 2000]
                 + [rng.randint(0, 2000) for _ in range(120)]]
    # Random tails and random lengths behind a valid header.
    datagrams += [b"ZRE\x01" + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 60)))
                  for _ in range(60)]
    datagrams += [good + bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 1978)))
                  for _ in range(20)]
    # Random 22-octet datagrams that are not beacons.
    datagrams += [b"ZRE" + bytes([rng.choice([0, 2, 3, 0xFF])]) + bytes(
        rng.getrandbits(8) for _ in range(18)) for _ in range(20)]
    rng.shuffle(datagrams)
    for i in range(0, len(datagrams), 25):  # bursts small enough for the socket buffer
        for data in datagrams[i:i + 25]:
            raw.datagram(mesh.port, data)
        beacon_barrier(mesh, make_raw)
    mesh.assert_serving()
    assert_no_mail(raw)
    assert mesh.raw_enters() == []


def test_beacon_with_unreachable_port_is_harmless(mesh: Mesh,
                                                  make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    ghost = uuid_module.uuid4()
    raw.beacon(mesh.port, free_tcp_port(), uuid=ghost)  # nothing listens there
    raw.beacon(mesh.port, free_tcp_port(), uuid=ghost)  # and again: only a refresh
    beacon_barrier(mesh, make_raw)
    mesh.assert_serving()
    assert mesh.raw_enters() == []
    assert ghost not in mesh.target.peers()  # type: ignore[union-attr]
    # The node still takes new peers.
    enter_raw(mesh, raw)
    assert_whisper_delivered(mesh, raw, b"still fine")
    assert mesh.raw_enters() == [raw.uuid]


@pytest.mark.parametrize("whose", ["target", "good"])
def test_beacon_advertising_a_known_mailbox(mesh: Mesh, make_raw: Callable[..., RawPeer],
                                            whose: str) -> None:
    # A beacon from a new UUID whose port is the target's mailbox, or the good
    # peer's. Both nodes hear it, so each time one of them is told to connect
    # to the other's mailbox. They may connect there, but their link must not
    # suffer and nobody may ENTER.
    node = mesh.target if whose == "target" else mesh.good
    assert node is not None and node.endpoint is not None and mesh.good is not None
    start = mesh.events.mark()
    good_start = mesh.good_events.mark()
    raw = make_raw()
    raw.beacon(mesh.port, int(node.endpoint.rsplit(":", 1)[1]), uuid=uuid_module.uuid4())
    beacon_barrier(mesh, make_raw)
    assert_none(mesh.events, lambda e: e.type in (EXIT, ENTER), start=start)
    assert_none(mesh.good_events, lambda e: e.type in (EXIT, ENTER), start=good_start,
                window=0)
    mesh.assert_serving()
    assert mesh.raw_enters() == []


def test_port_zero_beacon_reports_exit_at_once(mesh: Mesh,
                                               make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    enter_raw(mesh, raw)
    start = mesh.events.mark()
    began = time.monotonic()
    raw.beacon(mesh.port, 0)  # a leaving node says goodbye and closes its link
    raw.disconnect()
    exit_ = mesh.events.wait_for(is_(EXIT, raw.uuid), start=start, timeout=1.0)
    assert time.monotonic() - began < 1.0  # well before any timeout could expire it
    assert exit_.reason == "left"
    assert raw.uuid not in mesh.target.peers()  # type: ignore[union-attr]
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


# --------------------------------------------------------------------------
# Mailbox: garbage from a node that never said a valid HELLO


def garbage(raw: RawPeer, kind: str) -> list[list[bytes]]:
    """Mailbox messages (frame lists) a node must ignore without harm."""
    ep = raw.endpoint.encode()
    full = hello_frame(ep, groups=[b"g1", "grün".encode()], status=3, name=b"evil",
                       headers=[(b"X-Key", b"value"), (b"K2", "wërt".encode())])
    rng = random.Random(f"garbage-{kind}")
    if kind == "empty-frames":
        return [[b""], [b"", b""], [b""] * 5, [b"", full]]
    if kind == "hello-id-wrong-version-6-bytes":
        return [[bytes.fromhex("AAA101010001")]]
    if kind == "short-frames":
        return [[full[:n]] for n in range(1, 6)] + [[b"\xaa"], [b"\xaa\xa1"]]
    if kind == "wrong-signature":
        return [[hello_frame(ep, signature=sig)] for sig in (b"\xaa\xa0", b"\xa1\xaa",
                                                             b"\x00\x00", b"\xff\xff")]
    if kind == "wrong-version":
        return [[hello_frame(ep, version=v)] for v in (0, 1, 3, 0xFF)]
    if kind == "truncated-hello":
        return [[full[:n]] for n in range(6, len(full))]
    if kind == "hello-trailing-octets":
        return [[full + b"\x00"], [full + b"garbage"]]
    if kind == "hello-with-content-frames":
        return [[full, b"extra"], [full, b"", b""]]
    if kind == "hello-invalid-utf8":
        bad = b"\xff\xfe\xc3("
        return [[hello_frame(bad)], [hello_frame(ep, name=bad)],
                [hello_frame(ep, groups=[bad])],
                [hello_frame(ep, headers=[(bad, b"v")])],
                [hello_frame(ep, headers=[(b"k", bad)])],
                [hello_frame(ep, name=b"ok\xed\xa0\x80")]]  # an encoded surrogate
    if kind == "hello-huge-counts":
        return [[hello_frame(ep, groups_count=0xFFFFFFFF)],
                [hello_frame(ep, groups=[b"g"], groups_count=0x7FFFFFFF)],
                [hello_frame(ep, headers_count=0xFFFFFFFF)],
                [hello_frame(ep, headers=[(b"k", b"v")], headers_count=1 << 31)],
                # a longstr that claims 4 GiB
                [header(1) + s1(ep) + n4(1) + n4(0xFFFFFFFF) + b"abc"],
                # a string that claims more than the frame holds
                [header(1) + b"\xff" + ep]]
    if kind == "hello-wrong-sequence":
        return [[hello_frame(ep, sequence=s)] for s in (0, 2, 0xFFFF)]
    if kind == "hello-unusable-endpoint":
        return [[hello_frame(e)] for e in (b"", b"tcp://", b"tcp://127.0.0.1",
                                           b"tcp://127.0.0.1:notaport", b"tcp://:",
                                           b"ipc:///tmp/peermesh-hostile", b"inproc://x",
                                           b"garbage")]
    if kind == "random-frame-lists":
        messages = []
        for _ in range(300):
            frames = []
            for _ in range(rng.randint(1, 5)):
                size = rng.choice([0, 1, 5, 6, 7, 8, 20, 100, rng.randint(0, MAX_MESSAGE)])
                data = bytes(rng.getrandbits(8) for _ in range(size))
                if rng.random() < 0.5 and size >= 6:  # a valid header in front
                    data = header(rng.randint(0, 12), rng.randint(0, 0xFFFF)) + data[6:]
                frames.append(data)
            messages.append(frames)
        return messages
    raise ValueError(kind)


GARBAGE_KINDS = ["empty-frames", "hello-id-wrong-version-6-bytes", "short-frames",
                 "wrong-signature", "wrong-version", "truncated-hello", "hello-trailing-octets",
                 "hello-with-content-frames", "hello-invalid-utf8", "hello-huge-counts",
                 "hello-wrong-sequence", "hello-unusable-endpoint", "random-frame-lists"]


@pytest.mark.parametrize("kind", GARBAGE_KINDS)
def test_mailbox_garbage_is_ignored(mesh: Mesh, make_raw: Callable[..., RawPeer],
                                    kind: str) -> None:
    raw = make_raw()
    start = mesh.events.mark()
    raw.connect(mesh.endpoint)
    for frames in garbage(raw, kind):
        raw.send(frames)
    # The valid HELLO behind the garbage, on the same connection, is the barrier.
    raw.hello(groups=["g1"], headers={"after": "garbage"})
    i = mesh.events.index_of(is_(ENTER, raw.uuid), start=start)
    assert [e for e in mesh.events.since(start, raw.uuid)][0].type is ENTER, \
        "garbage produced events before the valid HELLO"
    enter = mesh.events.events[i]
    assert enter.headers == {"after": "garbage"} and enter.address == raw.endpoint
    answer = raw.expect(zre.Hello, sender=mesh.uuid)
    assert answer.sequence == 1
    assert_whisper_delivered(mesh, raw, b"after garbage")  # sequence 2: nothing counted
    assert mesh.target.peer_groups(raw.uuid) == ["g1"]  # type: ignore[union-attr]
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


def test_hello_with_bad_identity_is_dropped(mesh: Mesh,
                                            make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()  # its mailbox is what a wrongly accepted HELLO would connect to
    for identity in (b"\x02" + raw.uuid_bytes, b"\x01" + raw.uuid_bytes[:15],
                     b"\x01" + raw.uuid_bytes + b"\x00", b"\x01" + mesh.uuid.bytes,
                     b"peer"):
        raw.connect(mesh.endpoint, identity=identity)
        raw.hello(name="impostor")
        assert raw.wait_dealer_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, WAIT)
    # A valid peer on its own connection still enters.
    other = make_raw()
    enter_raw(mesh, other)
    assert_no_mail(raw)
    mesh.assert_serving()
    assert mesh.raw_enters() == [other.uuid]


def test_many_hellos_with_unusable_endpoint_leak_nothing(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # More than ZeroMQ's default limit of 1023 sockets per context.
    raw = make_raw()
    raw.connect(mesh.endpoint, sndhwm=0)
    for _ in range(1100):
        raw.hello(endpoint="tcp://127.0.0.1")  # no port: the node cannot connect back
    raw.hello()  # same connection: handled after all of the above
    mesh.events.wait_for(is_(ENTER, raw.uuid), start=mesh.base)
    raw.expect(zre.Hello, sender=mesh.uuid)
    other = make_raw()  # and the node can still open links to new peers
    enter_raw(mesh, other)
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid, other.uuid]


def test_oversized_message_is_refused(mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    big = b"x" * (2 * MAX_MESSAGE)
    # Before HELLO: an otherwise valid HELLO that is too big.
    raw = make_raw()
    raw.connect(mesh.endpoint)
    raw.hello(headers={"big": big.decode()})
    assert raw.wait_dealer_event(zmq.EVENT_DISCONNECTED, WAIT), "the node kept the connection"
    mesh.assert_serving()
    # A ready peer sends a WHISPER whose content frame is too big.
    raw.connect(mesh.endpoint)
    enter_raw(mesh, raw)
    start = mesh.events.mark()
    raw.whisper(big)
    assert raw.wait_dealer_event(zmq.EVENT_DISCONNECTED, WAIT), "the node kept the connection"
    mesh.assert_serving()
    # The sender can come back: a fresh connection and the same HELLO start its session
    # over (nothing sent to it was unconfirmed: no EXIT and ENTER)
    raw.connect(mesh.endpoint)
    raw.hello()
    assert_whisper_delivered(mesh, raw, b"small again")
    assert not [e for e in mesh.events.since(mesh.base, raw.uuid)
                if e.type is WHISPER and big in e.frames]
    assert [e.headers for e in mesh.events.since(mesh.base, raw.uuid) if e.type is ENTER] \
        == [{}]  # the oversized HELLO never counted
    assert not [e for e in mesh.events.since(start, raw.uuid) if e.type is EXIT]
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


def test_oversized_multiframe_message_is_refused(mesh: Mesh,
                                                 make_raw: Callable[..., RawPeer]) -> None:
    # NodeConfig.max_message bounds the whole message. ZeroMQ's MAXMSGSIZE
    # only bounds single frames, so three 2000-octet content frames (6006
    # octets with the command frame) must be refused by the node itself: the
    # message is dropped and the sender removed (EXIT), not delivered.
    raw = make_raw()
    enter_raw(mesh, raw)
    start = mesh.events.mark()
    frames = [b"a" * 2000, b"b" * 2000, b"c" * 2000]
    raw.whisper(*frames)
    exit_ = mesh.events.wait_for(is_(EXIT, raw.uuid), start=start)
    assert exit_.reason is not None and "max_message" in exit_.reason, exit_.reason
    raw.ping()  # no longer a peer: ignored, never answered
    assert not isinstance(raw.recv(0.3), zre.PingOk)
    mesh.assert_serving()
    delivered = [e for e in mesh.events.since(start, raw.uuid) if e.type is WHISPER]
    assert not delivered, \
        f"a {sum(map(len, frames)) + 6}-octet message passed max_message={MAX_MESSAGE}"


# --------------------------------------------------------------------------
# Mailbox: commands before HELLO


@pytest.mark.parametrize("known", [False, True], ids=["unknown-identity", "known-by-beacon"])
def test_commands_before_hello_are_ignored(mesh: Mesh, make_raw: Callable[..., RawPeer],
                                           known: bool) -> None:
    raw = make_raw()
    if known:  # the node has a (not yet ready) peer for this UUID and sent it HELLO
        raw.beacon(mesh.port)
        raw.expect(zre.Hello, sender=mesh.uuid)
    start = mesh.events.mark()
    raw.connect(mesh.endpoint)
    raw.whisper(b"before hello", sequence=2)
    raw.join("sneaky")
    raw.shout("hostile", b"shout before hello")
    raw.leave("hostile")
    raw.ping()
    raw.command(8, s1(b"hostile") + s1(raw.uuid.hex.encode()))
    raw.whisper(b"before hello again")
    raw.hello(groups=[])  # the barrier; numbering starts again at 1
    mesh.events.wait_for(is_(ENTER, raw.uuid), start=start)
    assert [e.type for e in mesh.events.since(start, raw.uuid)] == [ENTER]
    if not known:
        raw.expect(zre.Hello, sender=mesh.uuid)
    assert_whisper_delivered(mesh, raw, b"first after hello")  # sequence 2 still expected
    assert mesh.target.peer_groups(raw.uuid) == []  # type: ignore[union-attr]
    assert [e.type for e in mesh.events.since(start, raw.uuid)] == [ENTER, WHISPER]
    mail = []
    while (got := raw.recv_from(0)) is not None:
        mail.append(got)
    assert not [m for m in mail if not isinstance(m[1], zre.Hello)], \
        f"the node answered commands sent before HELLO: {mail}"
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


# --------------------------------------------------------------------------
# Mailbox: a raw peer that said HELLO


def test_garbage_from_ready_peer(mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    start = mesh.events.mark()
    enter_raw(mesh, raw)
    # Messages without the signature or version are discarded before their
    # sequence number is read: they do not count.
    nxt = raw.sequence + 1
    for frames in ([b""], [b"", b"x"], [b"\xaa\xa1"], [header(2, nxt)[:5]],
                   [header(2, nxt, signature=b"\xaa\xa0"), b"bad signature"],
                   [header(2, nxt, version=1), b"version 1"],
                   [header(2, nxt, version=3), b"version 3"],
                   [bytes.fromhex("AAA101010001")]):
        raw.send(frames)
    assert_whisper_delivered(mesh, raw, b"numbering unaffected")
    # Well-formed headers, malformed bodies: no event, no harm.
    raw.command(4, b"\x05ab")                        # JOIN, group truncated
    raw.command(5, s1(b"\xff\xfe") + b"\x01")        # LEAVE, group not UTF-8
    raw.command(3, s1(b"hostile") + b"trailing", b"content")  # SHOUT, octets after group
    raw.command(3, s1(b"\xff\xfe"), b"content")     # SHOUT, group not UTF-8
    raw.command(3, b"\x08hostile", b"content")       # SHOUT, group length past the end
    raw.command(6, b"extra")                          # PING with a body
    raw.command(2, b"extra", b"content")              # WHISPER, octets in the command frame
    raw.command(1, b"\x03ab")                         # HELLO, truncated
    mesh.assert_serving()
    # Whatever the node made of that, the peer can start over with HELLO (numbered
    # from 1 again: the whisper after it is delivered).
    raw.hello()
    assert_whisper_delivered(mesh, raw, b"after the malformed bodies")
    types = {e.type for e in mesh.events.since(start, raw.uuid)}
    assert types <= {ENTER, EXIT, WHISPER}, types
    assert not [e for e in mesh.events.since(start, raw.uuid)
                if e.type is WHISPER and e.frames not in ((b"numbering unaffected",),
                                                          (b"after the malformed bodies",))]
    assert not [m for m in iter(lambda: raw.recv_from(0), None)
                if not isinstance(m[1], zre.Hello)], "the node answered malformed commands"
    mesh.assert_serving()


def test_hello_from_unknown_node_makes_it_a_peer(mesh: Mesh,
                                                 make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw(name="rawbob", headers={"X-Kind": "raw", "Ünï": "cödé ✓"})
    start = mesh.events.mark()
    raw.connect(mesh.endpoint)
    raw.hello(groups=["hostile", "raw-only"], status=2)
    enter = mesh.events.wait_for(is_(ENTER, raw.uuid), start=start)
    assert enter.name == "rawbob"
    assert enter.headers == {"X-Kind": "raw", "Ünï": "cödé ✓"}
    assert enter.address == raw.endpoint
    joins = mesh.events.collect(lambda e: e.type is JOIN and e.peer == raw.uuid, 2, start=start)
    assert sorted(e.group for _, e in joins) == ["hostile", "raw-only"]
    # The node connected back to the advertised mailbox and said HELLO, sequence 1.
    answer = raw.expect(zre.Hello, sender=mesh.uuid)
    assert answer.sequence == 1
    assert answer.endpoint == mesh.endpoint
    assert answer.name == "target" and answer.headers == {"role": "target"}
    assert answer.groups == ("hostile",)
    info = mesh.target.peer_info(raw.uuid)  # type: ignore[union-attr]
    assert (info.name, info.address, info.groups) == ("rawbob", raw.endpoint,
                                                      ["hostile", "raw-only"])
    # Both ways.
    assert_whisper_delivered(mesh, raw, b"raw -> target")
    mesh.target.whisper(raw.uuid, b"target -> raw")  # type: ignore[union-attr]
    whisper = raw.expect(zre.Whisper, sender=mesh.uuid)
    assert (whisper.sequence, whisper.content) == (2, (b"target -> raw",))
    mesh.target.shout("hostile", b"to the group")  # type: ignore[union-attr]
    shout = raw.expect(zre.Shout, sender=mesh.uuid)
    assert (shout.sequence, shout.group, shout.content) == (3, "hostile", (b"to the group",))
    raw.shout("hostile", b"raw shouts")
    mesh.events.wait_for(lambda e: e.type is SHOUT and e.peer == raw.uuid
                         and e.group == "hostile" and e.frames == (b"raw shouts",), start=start)
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


@pytest.mark.parametrize("whose", [
    "target",
    "good",
])
def test_hello_advertising_a_known_mailbox(mesh: Mesh, make_raw: Callable[..., RawPeer],
                                           whose: str) -> None:
    # The raw peer claims a mailbox that is not its own: the target's own, or
    # the good peer's. Whatever the target makes of the raw peer, its link
    # with the good peer must not suffer.
    node = mesh.target if whose == "target" else mesh.good
    assert node is not None and node.endpoint is not None
    raw = make_raw()
    start = mesh.events.mark()
    good_start = mesh.good_events.mark()
    raw.connect(mesh.endpoint)
    raw.hello(endpoint=node.endpoint)
    barrier = make_raw()  # a valid HELLO on another connection, handled after
    enter_raw(mesh, barrier)
    assert mesh.good is not None
    assert_none(mesh.events, lambda e: e.type in (EXIT, ENTER) and e.peer == mesh.good.uuid,
                start=start)
    assert_none(mesh.good_events, lambda e: e.type in (EXIT, ENTER), start=good_start,
                window=0)
    mesh.assert_serving()


def test_live_peers_identity_cannot_be_taken_over(mesh: Mesh,
                                                   make_raw: Callable[..., RawPeer]) -> None:
    # UUIDs are broadcast, so anyone who reaches the mailbox can connect under
    # a live peer's routing identity. That connection must get nowhere: not
    # a restart (HELLO), not a sequence gap that evicts the real peer, not a
    # message delivered as the good peer's.
    target, good = mesh.target, mesh.good
    assert target is not None and good is not None and good.endpoint is not None
    raw = make_raw()
    start = mesh.events.mark()
    good_start = mesh.good_events.mark()
    raw.connect(mesh.endpoint, identity=b"\x01" + good.uuid.bytes)
    assert raw.wait_dealer_event(zmq.EVENT_HANDSHAKE_SUCCEEDED, WAIT)
    raw.whisper(b"forged, out of sequence", sequence=7)
    raw.hello(endpoint=good.endpoint)
    raw.whisper(b"forged after hello")
    barrier = make_raw()  # a valid HELLO on another connection, handled after
    enter_raw(mesh, barrier)
    mesh.assert_serving()
    assert_none(mesh.events, lambda e: e.peer == good.uuid and (
        e.type in (EXIT, ENTER) or (e.type is WHISPER and b"forged" in e.message)),
        start=start)
    assert_none(mesh.good_events, lambda e: e.type in (EXIT, ENTER), start=good_start,
                window=0)
    assert mesh.raw_enters() == [barrier.uuid]


def disconnect_and_readmit(mesh: Mesh, raw: RawPeer, bad: Callable[[], object]) -> None:
    """HELLO, one good whisper, ``bad()`` -> EXIT for sequence; a new HELLO re-admits."""
    start = mesh.events.mark()
    enter_raw(mesh, raw)
    assert_whisper_delivered(mesh, raw, b"one")
    assert_whisper_delivered(mesh, raw, b"two")
    bad()
    exit_ = mesh.events.wait_for(is_(EXIT, raw.uuid), start=start)
    assert exit_.reason is not None and "sequence" in exit_.reason, exit_.reason
    assert raw.uuid not in mesh.target.peers()  # type: ignore[union-attr]
    raw.whisper(b"ignored: no longer a peer")
    mesh.assert_serving()
    # A fresh HELLO (sequence 1) re-admits it; the node connects back anew.
    enter_raw(mesh, raw)
    assert_whisper_delivered(mesh, raw, b"back")
    assert [(e.type, e.frames) for e in mesh.events.since(start, raw.uuid)] == [
        (ENTER, ()), (WHISPER, (b"one",)), (WHISPER, (b"two",)), (EXIT, ()), (ENTER, ()),
        (WHISPER, (b"back",))]
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid, raw.uuid]


def test_sequence_gap_disconnects_then_hello_readmits(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    disconnect_and_readmit(mesh, raw, lambda: raw.whisper(
        b"gap", sequence=raw.sequence + 2))  # skips one number


@pytest.mark.parametrize("back", [0, 1], ids=["repeated", "older"])
def test_out_of_order_disconnects_then_hello_readmits(
        mesh: Mesh, make_raw: Callable[..., RawPeer], back: int) -> None:
    raw = make_raw()
    disconnect_and_readmit(mesh, raw, lambda: raw.whisper(
        b"out of order", sequence=raw.sequence - back))


def test_second_hello_is_a_restart(mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    start = mesh.events.mark()
    enter_raw(mesh, raw, name="first")
    assert_whisper_delivered(mesh, raw, b"before restart")
    assert_whisper_delivered(mesh, raw, b"before restart 2")
    raw.hello(name="second", groups=["after-restart"])
    mesh.events.wait_for(lambda e: e.type is JOIN and e.peer == raw.uuid, start=start)
    answer = raw.expect(zre.Hello, sender=mesh.uuid)  # a new link, numbered from 1
    assert answer.sequence == 1
    assert_whisper_delivered(mesh, raw, b"after restart")  # sequence 2
    assert [(e.type, e.name) for e in mesh.events.since(start, raw.uuid)] == [
        (ENTER, "first"), (WHISPER, "first"), (WHISPER, "first"), (EXIT, "first"),
        (ENTER, "second"), (JOIN, "second"), (WHISPER, "second")]
    assert mesh.target.peer_groups(raw.uuid) == ["after-restart"]  # type: ignore[union-attr]
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid, raw.uuid]


def raw_at_port(make_raw: Callable[..., RawPeer], port: int, **kw: object) -> RawPeer:
    """A new raw peer (new UUID) whose mailbox is bound at ``port`` on 127.0.0.1."""
    raw = make_raw(**kw)
    raw.router.close(linger=0)
    raw.router = raw.context.socket(zmq.ROUTER)
    raw.router.setsockopt(zmq.LINGER, 0)
    raw.router.setsockopt(zmq.ROUTER_HANDOVER, 1)

    def bound() -> bool:
        try:
            raw.router.bind(f"tcp://127.0.0.1:{port}")
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return False
        return True
    # (a mailbox closed just before lets go of the port in libzmq's I/O thread, later)
    poll_until(bound, 10.0, f"port {port} to be free")
    raw.port, raw.endpoint = port, f"tcp://127.0.0.1:{port}"
    return raw


def test_restart_with_a_new_uuid_at_the_same_endpoint_replaces_the_old_peer(
        mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    # Zyre binds the first free port from 49152, so one that crashes and comes
    # back is at the same endpoint under a new UUID. Its HELLO must replace the
    # old peer within about a beacon interval (not after `expired`, 30 s), and
    # both ways work at once after.
    old = make_raw(name="old")
    enter_raw(mesh, old)
    start = mesh.events.mark()
    old.close()  # crashed: no goodbye
    new = raw_at_port(make_raw, old.port, name="new")
    new.connect(mesh.endpoint)
    new.hello()
    gone = mesh.events.wait_for(is_(EXIT, old.uuid), start=start)
    assert gone.reason == "replaced by another node at its endpoint"
    enter = mesh.events.wait_for(is_(ENTER, new.uuid), start=start)
    assert (enter.name, enter.address) == ("new", new.endpoint)
    assert new.expect(zre.Hello, sender=mesh.uuid).sequence == 1
    assert_whisper_delivered(mesh, new, b"new -> target")
    mesh.target.whisper(new.uuid, b"target -> new")  # type: ignore[union-attr]
    whisper = new.expect(zre.Whisper, sender=mesh.uuid)
    assert whisper.content == (b"target -> new",)
    assert set(mesh.target.peers()) == {mesh.good.uuid, new.uuid}  # type: ignore[union-attr]
    mesh.assert_serving()


def test_join_with_mismatched_status(mesh: Mesh, make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    start = mesh.events.mark()
    enter_raw(mesh, raw, status=0)
    raw.join("g-a", status=42)  # expected 1
    raw.join("g-b", status=42)  # expected 43: the same again
    raw.leave("g-a", status=0)  # going backwards
    raw.join("hostile", status=0xFF)
    raw.join("g-c", status=200)
    assert_whisper_delivered(mesh, raw, b"groups done")
    assert [(e.type, e.group) for e in mesh.events.since(start, raw.uuid)
            if e.type in (JOIN, LEAVE)] == [(JOIN, "g-a"), (JOIN, "g-b"), (LEAVE, "g-a"),
                                            (JOIN, "hostile"), (JOIN, "g-c")]
    target = mesh.target
    assert target is not None
    assert target.peer_groups(raw.uuid) == ["g-b", "g-c", "hostile"]
    assert raw.uuid in target.peers_by_group("g-b")
    assert raw.uuid not in target.peers_by_group("g-a")
    assert [e.type for e in mesh.events.since(start, raw.uuid)].count(EXIT) == 0
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


@pytest.mark.parametrize("command, body, content", [
    (8, s1(b"hostile") + s1(b"challenger-0123456789abcdef"), ()),  # Zyre ELECT
    (8, b"", ()),
    (9, s1(b"hostile") + s1(b"leader-0123456789abcdef"), ()),      # Zyre LEADER
    (10, b"", (b"frame",)),
    (0, b"\x00\x01", ()),
    (0xFF, bytes(100), (b"a", b"b")),
], ids=["elect", "elect-bare", "leader", "id10-with-frames", "id0", "id255"])
def test_unknown_command_keeps_sequencing(mesh: Mesh, make_raw: Callable[..., RawPeer],
                                          command: int, body: bytes,
                                          content: tuple[bytes, ...]) -> None:
    raw = make_raw()
    start = mesh.events.mark()
    enter_raw(mesh, raw)
    raw.command(command, body, *content)  # sequence 2
    raw.command(command, body, *content)  # sequence 3
    assert_whisper_delivered(mesh, raw, b"after unknown command")  # sequence 4
    assert raw.ping() == 5
    assert raw.expect(zre.PingOk, sender=mesh.uuid).sequence == 2
    assert [e.type for e in mesh.events.since(start, raw.uuid)] == [ENTER, WHISPER]
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


def test_ping_gets_ping_ok_with_next_sequence(mesh: Mesh,
                                              make_raw: Callable[..., RawPeer]) -> None:
    raw = make_raw()
    enter_raw(mesh, raw)  # the node's HELLO to raw was sequence 1
    raw.ping()
    assert raw.expect(zre.PingOk, sender=mesh.uuid).sequence == 2
    mesh.target.whisper(raw.uuid, b"in between")  # type: ignore[union-attr]
    assert raw.expect(zre.Whisper, sender=mesh.uuid).sequence == 3
    raw.ping()
    raw.ping()
    assert raw.expect(zre.PingOk, sender=mesh.uuid).sequence == 4
    assert raw.expect(zre.PingOk, sender=mesh.uuid).sequence == 5
    # A PING-OK nobody asked for is harmless and keeps the numbering.
    raw.ping_ok()
    assert_whisper_delivered(mesh, raw, b"after pings")
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]


def test_sequence_wraps_past_65536_messages(mesh: Mesh,
                                            make_raw: Callable[..., RawPeer]) -> None:
    total = 65_540
    raw = make_raw()
    start = mesh.events.mark()
    raw.connect(mesh.endpoint, sndhwm=0)
    enter_raw(mesh, raw)
    assert raw.sequence == 1
    payloads = [i.to_bytes(4, "big") for i in range(total)]
    send = raw.dealer.send  # type: ignore[union-attr]
    whisper_header = zre.whisper_header
    sequence = raw.sequence
    for payload in payloads:
        sequence = (sequence + 1) & 0xFFFF  # ... 65534, 65535, 0, 1, 2 ...
        send(whisper_header(sequence), zmq.SNDMORE)
        send(payload)
    raw.sequence = sequence
    assert sequence == (1 + total) % 65536
    got = mesh.events.collect(lambda e: e.type is WHISPER and e.peer == raw.uuid, total,
                              start=start, timeout=20, fail=is_(EXIT, raw.uuid))
    assert [e.frames for _, e in got] == [(p,) for p in payloads]
    assert_whisper_delivered(mesh, raw, b"after the wrap")
    raw.ping()
    raw.expect(zre.PingOk, sender=mesh.uuid)
    assert [e for e in mesh.events.since(start, raw.uuid) if e.type is EXIT] == []
    mesh.assert_serving()
    assert mesh.raw_enters() == [raw.uuid]
