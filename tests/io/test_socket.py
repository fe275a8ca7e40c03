"""HubSocket on real sockets over 127.0.0.1, on both paths (the C extension and pyzmq alone).

Batches, whole-message sends, the edge re-armed after a send, the guard timer
finding a missed edge, waits with timeouts, close while waiting, and
``make_socket`` with the shared context. Every wait is bounded.
"""

from __future__ import annotations

import logging
import resource
import select
from collections.abc import Iterator

import gevent
import gevent.event
import pytest
import zmq

from peermesh.io import HubSocket, bind_ephemeral, make_socket, shared_context
from peermesh.io import socket as io_socket

pytestmark = pytest.mark.usefixtures("zmq_path")

WAIT = 5.0


@pytest.fixture
def pair() -> Iterator[tuple[HubSocket, HubSocket]]:
    """A ROUTER and a DEALER connected to it, both HubSockets."""
    router_sock = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router_sock, "127.0.0.1")
    router = HubSocket(router_sock, endpoint=endpoint, limit=1000, max_frames=8)
    dealer_sock = make_socket(zmq.DEALER, {zmq.IDENTITY: b"dealer"})
    dealer_sock.connect(endpoint)
    dealer = HubSocket(dealer_sock)
    yield router, dealer
    dealer.close()
    router.close()


def served(sock: HubSocket) -> tuple[list[tuple[bytes, list[bytes]]], list[bytes],
                                     gevent.Greenlet]:
    got: list[tuple[bytes, list[bytes]]] = []
    oversized: list[bytes] = []
    server = gevent.spawn(sock.serve, lambda first, rest: got.append((first, rest)),
                          oversized.append)
    return got, oversized, server


def wait_for(check: object, what: str) -> None:
    with gevent.Timeout(WAIT, AssertionError(f"no {what} within {WAIT} s")):
        while not check():  # type: ignore[operator]
            gevent.sleep(0.001)


def test_recv_batch_reads_every_waiting_message_in_batches(
        pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    sent = [[b"%d" % i, b"x" * (i % 5)] for i in range(600)]
    for frames in sent:
        assert dealer.try_send(frames)
    got: list[tuple[bytes, list[bytes]]] = []
    sizes: list[int] = []
    with gevent.Timeout(WAIT):
        while len(got) < len(sent):
            batch = router.recv_batch(256)
            if batch:
                sizes.append(len(batch))
                got.extend(batch)
            else:
                assert router.wait_readable(WAIT)
    assert got == [(b"dealer", frames) for frames in sent]
    assert max(sizes) == 256 and min(sizes) >= 1  # never more than asked for


def test_over_the_limits_a_message_is_none_and_the_next_one_arrives(
        pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    assert dealer.try_send([b"a" * 600, b"b" * 600])   # 1,200 bytes over a limit of 1,000
    assert dealer.try_send([b""] * 9)                  # 9 frames over a limit of 8
    assert dealer.try_send([b"a" * 500, b"b" * 500])   # exactly the limit
    assert dealer.try_send([b""] * 8)
    got: list[tuple[bytes, object]] = []
    with gevent.Timeout(WAIT):
        while len(got) < 4:
            got.extend(router.recv_batch(10) or [])
            if len(got) < 4:
                router.wait_readable(WAIT)
    assert got == [(b"dealer", None), (b"dealer", None),
                   (b"dealer", [b"a" * 500, b"b" * 500]), (b"dealer", [b""] * 8)]


def test_a_property_of_each_message_comes_with_it(pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    assert dealer.try_send([b"hello"])
    assert router.wait_readable(WAIT)
    ((first, rest, address),) = router.recv_batch(10, "Peer-Address")
    assert (first, rest, address) == (b"dealer", [b"hello"], "127.0.0.1")


def test_a_message_is_sent_whole_in_one_call(pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    got, _, server = served(router)
    assert dealer.try_send((b"one", bytearray(b"two"), memoryview(b"three")))
    wait_for(lambda: got, "message")
    assert got == [(b"dealer", [b"one", b"two", b"three"])]
    assert router.try_send([b"dealer", b"back", b"again"])   # a ROUTER's reply, routed
    assert dealer.wait_readable(WAIT)
    assert dealer.recv_batch() == [(b"back", [b"again"])]
    server.kill()


def test_a_full_socket_takes_nothing_and_wait_writable_times_out() -> None:
    sock = make_socket(zmq.DEALER, {zmq.SNDHWM: 5})
    sock.connect("tcp://127.0.0.1:9")  # nobody listens: the queue fills
    link = HubSocket(sock)
    try:
        sent = [link.try_send([b"a", b"b"]) for _ in range(50)]
        full = sent.index(False)
        assert full >= 1 and all(sent[:full]) and not any(sent[full:])
        assert not link.wait_writable(0.05)
    finally:
        link.close()
    with pytest.raises(zmq.ZMQError) as caught:  # a closed socket says so, never crashes
        link.try_send([b"late"])
    assert caught.value.errno == zmq.ENOTSOCK


def test_a_batch_is_sent_in_order_until_the_socket_is_full(
        pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    got, _, server = served(router)
    batch = [[b"%d" % i, b"x"] for i in range(300)]
    assert dealer.try_send_each(batch) == 300
    wait_for(lambda: len(got) == 300, "batch")
    assert got == [(b"dealer", frames) for frames in batch]
    server.kill()
    sock = make_socket(zmq.DEALER, {zmq.SNDHWM: 5})
    sock.connect("tcp://127.0.0.1:9")  # nobody listens: the queue fills
    link = HubSocket(sock)
    try:
        took = link.try_send_each([[b"a", b"b"]] * 50)
        assert 1 <= took < 50
        assert link.try_send_each([[b"a"]]) == 0
    finally:
        link.close()


def test_serve_drains_in_batches_and_survives_a_failing_handler(
        pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    got: list[bytes] = []

    def on_message(first: bytes, rest: list[bytes]) -> None:
        got.append(rest[0])
        if rest[0] == b"boom":
            raise RuntimeError("a handler's bug")

    server = gevent.spawn(router.serve, on_message)
    for i in range(1000):
        assert dealer.try_send([b"boom" if i == 3 else b"%d" % i])
    wait_for(lambda: len(got) == 1000, "1,000 messages")
    assert got[4:] == [b"%d" % i for i in range(4, 1000)]
    server.kill()


def test_a_handler_failing_on_every_message_logs_one_traceback_a_period(
        pair: tuple[HubSocket, HubSocket], caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What a remote sender can make fail at will must not fill the log with tracebacks."""
    router, dealer = pair
    monkeypatch.setattr(io_socket, "_traceback_due", [0.0])
    before = io_socket.HANDLER_FAILURES.get("handler_failures")
    seen: list[bytes] = []

    def on_message(first: bytes, rest: list[bytes]) -> None:
        seen.append(rest[0])
        raise ValueError("malformed")

    server = gevent.spawn(router.serve, on_message)
    with caplog.at_level(logging.DEBUG, "peermesh.io.socket"):
        for i in range(300):
            assert dealer.try_send([b"%d" % i])
        wait_for(lambda: len(seen) == 300, "300 messages")
    server.kill()
    assert io_socket.HANDLER_FAILURES.get("handler_failures") == before + 300
    assert len([r for r in caplog.records if r.exc_info]) == 1


def take_edge_unseen(sock: HubSocket) -> None:
    """Wait, blocking the hub, until a message waits at ``sock``, and take in the edge that
    announced it behind the adapter's back (as a send or ``EVENTS`` from elsewhere does):
    its descriptor will not signal that message again."""
    fd = sock.socket.getsockopt(zmq.FD)
    with gevent.Timeout(WAIT, AssertionError("no message arrived")):
        while not sock.socket.get(zmq.EVENTS) & zmq.POLLIN:
            select.select([fd], [], [], WAIT)


def test_a_send_looks_for_a_message_whose_edge_was_taken(
        pair: tuple[HubSocket, HubSocket], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_socket, "GUARD", 60.0)  # no guard to help
    router, dealer = pair
    got, _, server = served(router)
    gevent.sleep(0)  # serving
    assert dealer.try_send([b"unseen"])
    take_edge_unseen(router)
    assert router.try_send([b"dealer", b"reply"])  # only the look after it finds the message
    wait_for(lambda: got, "message found after the send")
    assert got == [(b"dealer", [b"unseen"])]
    server.kill()


def test_a_send_without_its_look_leaves_it_to_readable(
        pair: tuple[HubSocket, HubSocket], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_socket, "GUARD", 60.0)
    router, dealer = pair
    got, _, server = served(router)
    gevent.sleep(0)  # serving
    assert dealer.try_send([b"unseen"])
    take_edge_unseen(router)
    assert router.try_send([b"dealer", b"reply"], look=False)
    assert router.readable()  # the caller's one look after its sends finds the message
    wait_for(lambda: got, "message found by readable()")
    assert got == [(b"dealer", [b"unseen"])]
    server.kill()


def test_after_batch_follows_the_handlers_of_each_batch(
        pair: tuple[HubSocket, HubSocket], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_socket, "BATCH", 4)
    router, dealer = pair
    seen: list[object] = []
    server = gevent.spawn(router.serve, lambda first, rest: seen.append(rest[0]),
                          after_batch=lambda: seen.append("end"))
    for i in range(10):
        assert dealer.try_send([b"%d" % i])
    wait_for(lambda: b"9" in seen and seen[-1] == "end", "the last batch's end")
    assert [x for x in seen if x != "end"] == [b"%d" % i for i in range(10)]
    batches = " ".join("e" if x == "end" else "m" for x in seen).split("e")[:-1]
    assert all(1 <= batch.count("m") <= 4 for batch in batches)  # no empty batch, none over 4
    server.kill()


def test_take_handles_a_batch_until_it_stops_and_the_rest_goes_one_by_one(
        pair: tuple[HubSocket, HubSocket], monkeypatch: pytest.MonkeyPatch) -> None:
    # take() handles messages "t..." itself; "x..." it leaves (on_message), "boom" makes
    # it raise (logged as that message's failure, the batch goes on), an oversized one goes
    # to on_oversized. Each batch is whole in one take call while only "t..." come.
    monkeypatch.setattr(io_socket, "BATCH", 8)
    router, dealer = pair
    seen: list[object] = []
    calls: list[tuple[int, int]] = []

    def take(batch: list, start: int) -> int:
        at = start
        while at < len(batch):
            rest = batch[at][1]
            if rest == [b"boom"]:
                raise RuntimeError("a fast path's bug")
            if rest is None or not rest[0].startswith(b"t"):
                break
            seen.append(("take", rest[0]))
            at += 1
        calls.append((start, at))
        return at

    server = gevent.spawn(router.serve, lambda first, rest: seen.append(("one", rest[0])),
                          lambda first: seen.append(("oversized", first)),
                          after_batch=lambda: seen.append("end"), take=take)
    sent = [b"t0", b"t1", b"x2", b"t3", b"boom", b"t5", b"big", b"t7", b"t8", b"t9"]
    failures = io_socket.HANDLER_FAILURES.get("handler_failures")
    for frame in sent:
        assert dealer.try_send([b"y" * 2000] if frame == b"big" else [frame])
    wait_for(lambda: ("take", b"t9") in seen and seen[-1] == "end", "the last batch")
    handled = [x for x in seen if x != "end"]
    assert handled == [("take", b"t0"), ("take", b"t1"), ("one", b"x2"), ("take", b"t3"),
                       ("take", b"t5"), ("oversized", b"dealer"), ("take", b"t7"),
                       ("take", b"t8"), ("take", b"t9")]
    assert io_socket.HANDLER_FAILURES.get("handler_failures") > failures   # counted, logged
    assert all(end > start or end < 8 for start, end in calls)
    server.kill()


def test_a_waiting_reader_is_woken_by_the_look_after_a_send(
        pair: tuple[HubSocket, HubSocket], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_socket, "GUARD", 60.0)
    router, dealer = pair
    reader = gevent.spawn(router.wait_readable, WAIT * 2)
    gevent.sleep(0)  # the reader waits
    assert dealer.try_send([b"unseen"])
    take_edge_unseen(router)
    assert router.try_send([b"dealer", b"reply"])
    with gevent.Timeout(WAIT):
        assert reader.get() is True
    assert router.recv_batch() == [(b"dealer", [b"unseen"])]


def test_the_guard_timer_recovers_a_missed_edge(pair: tuple[HubSocket, HubSocket],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(io_socket, "GUARD", 0.05)
    router, dealer = pair
    got, _, server = served(router)
    gevent.sleep(0)  # serving
    assert dealer.try_send([b"unseen"])
    take_edge_unseen(router)  # and nothing is sent: only the guard can find it
    wait_for(lambda: got, "message found by the guard")
    assert got == [(b"dealer", [b"unseen"])]
    reader = gevent.spawn(dealer.wait_readable, WAIT * 2)  # a waiter is guarded too
    gevent.sleep(0)
    assert router.try_send([b"dealer", b"unseen too"])
    take_edge_unseen(dealer)
    with gevent.Timeout(WAIT):
        assert reader.get() is True
    server.kill()


def test_close_wakes_waiters_and_ends_serve(pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    reader = gevent.spawn(dealer.wait_readable)
    server = gevent.spawn(router.serve, lambda first, rest: None)
    gevent.sleep(0.01)
    assert not reader.ready() and not server.ready()
    dealer.close()
    router.close()
    with gevent.Timeout(WAIT):
        assert reader.get() is False
        assert server.get() is None
    assert not dealer.readable() and not dealer.wait_writable(0)
    with pytest.raises(zmq.ZMQError):
        dealer.recv_batch()


def test_a_wait_times_out() -> None:
    sock = HubSocket(make_socket(zmq.PAIR))
    try:
        assert not sock.wait_readable(0.02)
    finally:
        sock.close()


def test_backpressure_pauses_reading_and_wakes_once_per_batch(
        pair: tuple[HubSocket, HubSocket]) -> None:
    router, dealer = pair
    room = gevent.event.Event()
    calls: list[str] = []

    class Queue:
        items: list[bytes] = []

        def full(self) -> bool:
            return len(self.items) >= 5 and not room.is_set()

        def wait_room(self) -> None:
            room.wait()

        def hold(self) -> None:
            calls.append("hold")

        def release(self) -> None:
            calls.append("release")

    queue = Queue()
    server = gevent.spawn(router.serve, lambda first, rest: queue.items.append(rest[0]),
                          None, queue)
    for i in range(5):
        assert dealer.try_send([b"%d" % i])
    wait_for(lambda: len(queue.items) == 5, "5 messages")
    assert dealer.try_send([b"5"])
    # the drain found the queue full (after its batch): the next message waits unread
    wait_for(lambda: router._paused and router.readable(), "reading paused, a message waiting")
    assert len(queue.items) == 5
    room.set()
    wait_for(lambda: len(queue.items) == 6, "the 6th message")
    assert queue.items == [b"%d" % i for i in range(6)]
    assert calls == ["hold", "release"] * (len(calls) // 2)
    server.kill()


def test_every_socket_comes_from_the_shared_context_with_the_raised_limit() -> None:
    context = shared_context()
    assert shared_context() is context
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    wanted = 65536 if limit == resource.RLIM_INFINITY else max(1024, limit)
    assert context.get(zmq.MAX_SOCKETS) == min(wanted, context.get(zmq.SOCKET_LIMIT))
    assert context.get(zmq.MAX_SOCKETS) > 1023 or limit <= 1024
    sock = make_socket(zmq.DEALER, {zmq.SNDHWM: 7, zmq.IDENTITY: b"me"})
    try:
        assert sock.context is context
        assert (sock.get(zmq.LINGER), sock.get(zmq.SNDHWM), sock.get(zmq.IDENTITY)) == (0, 7,
                                                                                      b"me")
    finally:
        sock.close()
    with pytest.raises(zmq.ZMQError):  # an option libzmq refuses: no socket left open
        make_socket(zmq.DEALER, {zmq.SNDHWM: -5})
