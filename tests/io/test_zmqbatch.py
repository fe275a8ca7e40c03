"""The transport's ZeroMQ paths: the C extension's batches, and pyzmq alone.

A real ROUTER mailbox and DEALER links on 127.0.0.1 (no beacons). Every test
runs on both paths (fixture ``zmq_path``), so the two behave the same; a few
check what only the extension promises. Every wait is bounded.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from typing import Any

import gevent
import pytest
import zmq

from peermesh.io import zmqbatch
from peermesh.zre.eventqueue import GreenEventQueue
from peermesh.io.transport import ZmqTransport

pytestmark = pytest.mark.usefixtures("zmq_path")

WAIT = 5.0
LIMIT = 1000  # the mailbox's max_message, in bytes


class Mailbox:
    """A served ``ZmqMailbox`` that records what it hands on."""

    def __init__(self, transport: ZmqTransport) -> None:
        self.box = transport.bind_mailbox("127.0.0.1", LIMIT)
        self.endpoint = f"tcp://127.0.0.1:{self.box.port}"
        self.messages: list[tuple[bytes, list[bytes]]] = []
        self.oversized: list[bytes] = []
        self.queue: GreenEventQueue[int] = GreenEventQueue(10_000)
        self.server = gevent.spawn(self.box.serve, self._on_message, self.oversized.append,
                                   self.queue)

    def _on_message(self, identity: bytes, frames: list[bytes]) -> None:
        self.messages.append((identity, frames))
        if frames == [b"boom"]:
            raise RuntimeError("a handler's bug")

    def wait(self, count: int) -> None:
        with gevent.Timeout(WAIT, AssertionError(f"{len(self.messages)} of {count} arrived")):
            while len(self.messages) + len(self.oversized) < count:
                gevent.sleep(0.001)

    def close(self) -> None:
        self.server.kill()
        self.box.close()


@pytest.fixture
def transport() -> Iterator[ZmqTransport]:
    transport = ZmqTransport(zmq.Context())
    yield transport
    transport.context.destroy(linger=0)  # also closes sockets a failed test left open


@pytest.fixture
def mailbox(transport: ZmqTransport) -> Iterator[Mailbox]:
    box = Mailbox(transport)
    yield box
    box.close()


def connect(transport: ZmqTransport, mailbox: Mailbox) -> Any:
    return transport.connect(b"\x01peer", mailbox.endpoint, sndhwm=100_000)


def test_messages_arrive_whole_and_in_order(transport: ZmqTransport, mailbox: Mailbox) -> None:
    link = connect(transport, mailbox)
    sent = [[b"head", b"%d" % i] if i % 3 else [b"head", b"a", b"", b"%d" % i]
            for i in range(1000)]  # more than one batch of 256
    for frames in sent:
        assert link.try_send(frames)
    mailbox.wait(len(sent))
    assert mailbox.messages == [(b"\x01peer", frames) for frames in sent]
    link.close()


def test_oversized_messages_are_reported_and_the_next_ones_arrive(
        transport: ZmqTransport, mailbox: Mailbox) -> None:
    link = connect(transport, mailbox)
    # (a single frame over the limit is libzmq's: MAXMSGSIZE drops the connection)
    assert link.try_send([b"x" * 600, b"y" * 600])  # too big in all
    assert link.try_send([b"x", b"y" * 600, b"z" * 600])
    assert link.try_send([b"after"])
    assert link.try_send([b"x" * 500, b"y" * 500])  # exactly the limit
    mailbox.wait(4)
    assert mailbox.oversized == [b"\x01peer", b"\x01peer"]
    assert mailbox.messages == [(b"\x01peer", [b"after"]), (b"\x01peer", [b"x" * 500, b"y" * 500])]
    link.close()


def test_a_failing_handler_does_not_stop_the_mailbox(
        transport: ZmqTransport, mailbox: Mailbox) -> None:
    link = connect(transport, mailbox)
    assert link.try_send([b"boom"])
    assert link.try_send([b"still here"])
    mailbox.wait(2)
    assert mailbox.messages[-1] == (b"\x01peer", [b"still here"])
    link.close()


def test_a_link_with_no_connection_says_it_is_full(transport: ZmqTransport) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    link = transport.connect(b"\x01peer", f"tcp://127.0.0.1:{port}", sndhwm=10)
    sent = [link.try_send([b"nobody", b"there"]) for _ in range(100)]
    full = sent.index(False)  # the high-water mark, then nothing more
    assert full >= 1 and all(sent[:full]) and not any(sent[full:])
    link.close()


def test_a_closed_link_raises_enotsock(transport: ZmqTransport, mailbox: Mailbox) -> None:
    link = connect(transport, mailbox)
    link.close()
    with pytest.raises(zmq.ZMQError) as caught:
        link.try_send([b"late"])
    assert caught.value.errno == errno.ENOTSOCK


def test_bytes_like_frames_are_sent(transport: ZmqTransport, mailbox: Mailbox) -> None:
    link = connect(transport, mailbox)
    assert link.try_send((b"head", bytearray(b"ba"), memoryview(b"mv")))
    mailbox.wait(1)
    assert mailbox.messages == [(b"\x01peer", [b"head", b"ba", b"mv"])]
    link.close()


def test_send_each_sends_in_order_until_one_cannot_go(transport: ZmqTransport,
                                                      mailbox: Mailbox) -> None:
    from collections import deque

    link = connect(transport, mailbox)
    backlog = deque([b"head", b"%d" % i] for i in range(300))
    assert link.try_send_each(backlog) == 300  # a deque (a node's backlog), in one call
    assert link.try_send_each(iter([[b"one"], (b"two", bytearray(b"2"))])) == 2
    assert link.try_send_each([]) == 0
    mailbox.wait(302)
    assert mailbox.messages == [(b"\x01peer", list(frames)) for frames in backlog] + \
        [(b"\x01peer", [b"one"]), (b"\x01peer", [b"two", b"2"])]
    with pytest.raises(TypeError):
        link.try_send_each([[b"fine"], [b"first", 5]])  # raised, as one send would
    link.close()
    with pytest.raises(zmq.ZMQError) as caught:
        link.try_send_each([[b"late"]])
    assert caught.value.errno == errno.ENOTSOCK


def test_send_each_stops_at_the_high_water_mark(transport: ZmqTransport) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    link = transport.connect(b"\x01peer", f"tcp://127.0.0.1:{port}", sndhwm=10)
    went = link.try_send_each([[b"nobody", b"there"]] * 100)
    assert 1 <= went < 100
    assert link.try_send_each([[b"more"]]) == 0 and not link.try_send([b"more"])
    link.close()


def native_only(zmq_path: str) -> Any:
    if zmq_path != "native":
        pytest.skip("a promise of the C extension only")
    return zmqbatch.native


def test_native_send_is_whole_or_nothing(zmq_path: str, transport: ZmqTransport,
                                         mailbox: Mailbox) -> None:
    native = native_only(zmq_path)
    link = connect(transport, mailbox)
    with pytest.raises(TypeError):
        link.try_send([b"first", 5])  # the bad frame is found before any is sent
    with pytest.raises(ValueError):
        link.try_send([])
    with pytest.raises(TypeError):
        native.send(link.socket.underlying, 5)
    assert link.try_send([b"next"])
    mailbox.wait(1)
    assert mailbox.messages == [(b"\x01peer", [b"next"])]  # nothing half-sent before it
    link.close()


def test_native_calls_check_their_arguments(zmq_path: str) -> None:
    native = native_only(zmq_path)
    with pytest.raises(TypeError):
        native.recv_batch(1, 2)
    with pytest.raises(zmq.ZMQError) as caught:
        native.recv_batch(0, 10, 10)
    assert caught.value.errno == errno.ENOTSOCK
    with pytest.raises(TypeError):
        native.send("not a handle", [b"x"])
    with pytest.raises(zmq.ZMQError) as caught:
        native.events(0)
    assert caught.value.errno == errno.ENOTSOCK
    with pytest.raises(TypeError):
        native.events("not a handle")


def test_zre_take_checks_its_arguments_and_makes_events_of_slots_only(zmq_path: str) -> None:
    from peermesh.events import Event, EventType
    from peermesh.wire import zre

    native = native_only(zmq_path)
    shape = (Event, zre.WHISPER_PREFIX, EventType.WHISPER, zre.SHOUT_PREFIX, EventType.SHOUT)
    assert native.zre_take([], 0, {}, {}, 0.0, [], None, shape) == (0, 0, 0)
    with pytest.raises(TypeError):
        native.zre_take([], 0, {}, {}, 0.0, [], None)
    with pytest.raises(TypeError):
        native.zre_take([], 0, {}, {}, 0.0, [], None, (Event, b"\xaa\xa1", 1, b"", 2))

    class Plain:   # (fields not slots: no event of it is made behind its __init__)
        type = peer = name = group = frames = headers = address = reason = None
    with pytest.raises(TypeError):
        native.zre_take([], 0, {}, {}, 0.0, [], None, (Plain, *shape[1:]))


def test_zre_take_refuses_a_start_that_is_not_an_index_into_its_batch(zmq_path: str) -> None:
    """(A negative start once read before the batch's items.)"""
    from peermesh.events import Event, EventType
    from peermesh.wire import zre

    native = native_only(zmq_path)
    shape = (Event, zre.WHISPER_PREFIX, EventType.WHISPER, zre.SHOUT_PREFIX, EventType.SHOUT)
    with pytest.raises(ValueError):
        native.zre_take([(b"x", [b"y"])], -1, {}, {}, 0.0, [], None, shape)
    with pytest.raises(TypeError):
        native.zre_take([], "0", {}, {}, 0.0, [], None, shape)
    assert native.zre_take([], 5, {}, {}, 0.0, [], None, shape) == (5, 0, 0)


def test_numbered_sends_write_the_sequence_into_the_head_and_go_whole_or_not_at_all(
        zmq_path: str, transport: ZmqTransport, mailbox: Mailbox) -> None:
    native = native_only(zmq_path)
    link = connect(transport, mailbox)
    send = link.numbered_sender()
    head = b"\xaa\xa1\x02\x02\x00\x00"
    assert send(head, 1, [b"one"]) and send(head, 0x1234, (b"two", bytearray(b"2")))
    assert send(head + b"\x05group", 0xFFFF, [b"three"]) and send(head, 7, [])
    assert send(b"h" * 300, 2, [b"long head"])      # (a head longer than the stack buffer)
    with pytest.raises(TypeError):
        send(head, 8, [b"first", 5])                 # found before anything is sent
    with pytest.raises(TypeError):
        send(b"short", 8, [b"x"])
    with pytest.raises(ValueError):
        send(head, 0x10000, [b"x"])
    with pytest.raises(TypeError):
        native.send_numbered(link.socket.underlying, head, 1)
    assert link.try_send([b"after"])
    mailbox.wait(6)
    assert mailbox.messages == [(b"\x01peer", frames) for frames in (
        [b"\xaa\xa1\x02\x02\x00\x01", b"one"], [b"\xaa\xa1\x02\x02\x12\x34", b"two", b"2"],
        [b"\xaa\xa1\x02\x02\xff\xff\x05group", b"three"], [b"\xaa\xa1\x02\x02\x00\x07"],
        [b"hhhh\x00\x02" + b"h" * 294, b"long head"], [b"after"])]
    assert native.send_numbered(link.socket.underlying, head, 9, [b"by handle"])
    with pytest.raises(TypeError):
        native.send_numbered([], head, 9, [b"an empty box"])
    with pytest.raises(RuntimeError):
        link.serve(lambda first, rest: None)         # never read once sent on so
    with pytest.raises(RuntimeError):
        link.wait_readable(0)
    link.close()
    with pytest.raises(zmq.ZMQError) as caught:
        send(head, 10, [b"late"])                    # its handle is read per call
    assert caught.value.errno == errno.ENOTSOCK


def test_numbered_sends_stop_at_the_high_water_mark(zmq_path: str,
                                                    transport: ZmqTransport) -> None:
    native_only(zmq_path)
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    link = transport.connect(b"\x01peer", f"tcp://127.0.0.1:{port}", sndhwm=10)
    send = link.numbered_sender()
    went = [send(b"\xaa\xa1\x02\x02\x00\x00", i, [b"nobody"]) for i in range(100)]
    full = went.index(False)
    assert full >= 1 and all(went[:full]) and not any(went[full:])
    link.close()


def test_without_the_extension_there_is_no_numbered_sender(zmq_path: str,
                                                           transport: ZmqTransport) -> None:
    if zmq_path == "native":
        pytest.skip("pyzmq alone only")
    link = transport.connect(b"\x01peer", "tcp://127.0.0.1:9", sndhwm=10)
    assert link.numbered_sender() is None
    link.close()


def test_native_events_say_what_pyzmq_says(zmq_path: str) -> None:
    native = native_only(zmq_path)
    context = zmq.Context()
    try:
        a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
        port = a.bind_to_random_port("tcp://127.0.0.1")
        assert native.events(b.underlying) == b.get(zmq.EVENTS) == 0   # no peer yet
        b.connect(f"tcp://127.0.0.1:{port}")
        b.send(b"ping")
        assert a.poll(int(WAIT * 1000)) == zmq.POLLIN
        assert native.events(a.underlying) == a.get(zmq.EVENTS) == zmq.POLLIN | zmq.POLLOUT
        assert a.recv() == b"ping"
        assert native.events(a.underlying) == a.get(zmq.EVENTS) == zmq.POLLOUT
    finally:
        context.destroy(linger=0)


def test_the_extension_is_used_where_it_was_built() -> None:
    try:
        import peermesh.io._zmqbatch  # noqa: F401
    except ImportError:
        pytest.skip("the C extension was not built (no C compiler at install)")
    if os.environ.get("PEERMESH_PURE_PYTHON"):
        pytest.skip("PEERMESH_PURE_PYTHON is set")
    native, why_not = zmqbatch._load()
    assert native is not None, why_not


def test_a_batch_notes_the_routing_id_of_each_connection_it_came_by(zmq_path: str) -> None:
    """With ``routes``, a batch whose messages come by several connections, interleaved,
    notes each connection's routing id under its descriptor (the C reader notes a run from
    one connection once)."""
    from peermesh.io.socket import HubSocket
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealers = []
    try:
        for name in (b"\x01one", b"\x01two"):
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.ROUTING_ID, name)
            dealers.append(dealer)
            dealer.connect(f"tcp://127.0.0.1:{port}")
        for i in range(6):
            dealers[i % 3 == 2].send(b"%d" % i, zmq.NOBLOCK)
        hub = HubSocket(router)
        routes: dict[int, bytes] = {}
        got: list[Any] = []
        with gevent.Timeout(WAIT, AssertionError(f"{len(got)} of 6 arrived")):
            while len(got) < 6:
                got += hub._batch(64, LIMIT, -1, None, routes)  # noqa: SLF001
                gevent.sleep(0.001)
        assert sorted(first for first, _ in got) == [b"\x01one"] * 4 + [b"\x01two"] * 2
        assert sorted(routes.values()) == [b"\x01one", b"\x01two"]
        assert len(routes) == 2 and all(fd >= 0 for fd in routes)
        hub.close()
    finally:
        for dealer in dealers:
            dealer.close(linger=0)
        context.destroy(linger=0)


def test_known_frames_are_read_as_the_objects_given(zmq_path: str) -> None:
    """With ``known``, a frame after the first equal to one of them is that very object;
    any other frame (a longer one, a prefix of one, the first frame) is a bytes of its own;
    ``known`` must be a tuple of bytes."""
    native = native_only(zmq_path)
    assert zmqbatch.knows_frames
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.ROUTING_ID, b"SADA1")
    try:
        dealer.connect(f"tcp://127.0.0.1:{port}")
        sada, rep = b"".join([b"SADA", b"1"]), b"".join([b"RE", b"P"])   # (made, not literals)
        frames = [b"", b"SADA1", b"REP", b"SADA", b"SADA1x", b"REP"]
        dealer.send_multipart(frames, zmq.NOBLOCK)
        dealer.send_multipart([b"x"], zmq.NOBLOCK)
        got: list[Any] = []
        while len(got) < 2:
            assert router.poll(int(WAIT * 1000)) == zmq.POLLIN, "nothing arrived"
            got += native.recv_batch(router.underlying, 8, LIMIT, -1, None, None,
                                     (sada, rep, b""))
        (first, rest), (_, other) = got
        assert first == b"SADA1" and first is not sada and rest == frames and other == [b"x"]
        assert rest[1] is sada and rest[2] is rep and rest[5] is rep
        assert rest[3] is not sada and rest[4] is not sada
        with pytest.raises(TypeError):
            native.recv_batch(router.underlying, 8, LIMIT, -1, None, None, [sada])
        with pytest.raises(TypeError):
            native.recv_batch(router.underlying, 8, LIMIT, -1, None, None, (sada, "REP"))
        with pytest.raises(TypeError):
            native.recv_batch(router.underlying, 8, LIMIT, -1, None, None, (), 1)
        assert native.recv_batch(router.underlying, 8, LIMIT, -1, None, None, ()) == []
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        context.destroy(linger=0)
