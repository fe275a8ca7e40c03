"""The driver's ``apply_all``: outputs gathered from several calls go out as a batch
read's do (with ``look_once`` each socket is looked at once after all the sends), in
order, counted; a send to a peer that is gone goes to ``on_send_failed`` and the rest go
on; a full link's queue holds the rest in its backlog, in order, as ``apply`` does.
``cork`` holds outputs for the end of the hub's turn, or until ``cork_limit`` wait."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from typing import Any, Hashable, Iterator, Optional

import gevent
import zmq

from peermesh.core import Deliver, Dial, Send
from peermesh.io.driver import Driver
from peermesh.io.routed import RoutedTransport, connecting_router
from peermesh.io.socket import GUARD, HubSocket, make_socket
from peermesh.io.transport import ZmqTransport

from test_driver import Caller  # (this folder's: tests/io)
from test_look_once import Handing, Logged
from waiting import poll_until


def _mandatory_router() -> HubSocket:
    """A ROUTER on loopback that fails a send to a peer it does not know."""
    sock = make_socket(zmq.ROUTER, {zmq.ROUTER_MANDATORY: 1, zmq.LINGER: 0})
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    return HubSocket(sock, endpoint=f"tcp://127.0.0.1:{port}")


def _greeted(transport: ZmqTransport, router: HubSocket, server: Driver,
             heard: list[Any]) -> tuple[Driver, Caller, list[Any]]:
    """A caller dialled to ``router`` (served by ``server``) that said hello: its driver,
    its core and what it got back; ``heard`` holds the hello."""
    caller = Caller(router.endpoint)
    got: list[Any] = []
    client = Driver(caller, transport, on_deliver=got.append, name="caller")
    client.apply(caller.start())
    client.apply(caller.say(b"hello"))
    poll_until(lambda: heard, GUARD, "the hello", sleep=gevent.sleep)
    return client, caller, got


@contextmanager
def _served(log: Optional[list[str]] = None,
            **options: Any) -> Iterator[tuple[Driver, list[Any], bytes, list[Any]]]:
    """A ``Handing`` core served on a mandatory ROUTER (its sockets' calls noted in
    ``log``, if given) and a caller that said hello to it: the server's driver, what it
    delivered, the caller's identity and what the caller got back. Both closed after."""
    transport = ZmqTransport()
    heard: list[Any] = []
    router = _mandatory_router()
    server = Driver(Handing(), transport, on_deliver=heard.append, look_once=True,
                    name="handing", **options)
    client = None
    try:
        server.listen(router if log is None else Logged(router, log))
        client, _, got = _greeted(transport, router, server, heard)
        yield server, heard, heard[0][0], got
    finally:
        if client is not None:
            client.close()
        server.close()


def test_outputs_of_several_calls_go_out_in_order_with_one_look() -> None:
    log: list[str] = []
    with _served(log) as (server, heard, identity, got):
        sent = server.stats["sent"]
        log.clear()
        outputs: list[Any] = [Send(identity, [b"%d" % i]) for i in range(20)]
        outputs.insert(10, Deliver("between"))
        server.apply_all(outputs)
        assert heard[-1] == "between"   # delivered in its place
        assert log == ["q"] * 20 + ["r"]   # each sent quietly, then one look
        assert server.stats["sent"] == sent + 20
        poll_until(lambda: len(got) == 20, GUARD, "20 messages", sleep=gevent.sleep)
        assert got == [("far", [b"%d" % i]) for i in range(20)]


def test_a_peer_gone_fails_its_send_and_the_rest_go_on() -> None:
    failed: list[tuple[Hashable, list[bytes], int]] = []
    with _served(on_send_failed=lambda link, frames, exc: failed.append(
            (link, list(frames), getattr(exc, "errno", 0)))) as (server, _, identity, got):
        dropped = server.stats["dropped"]
        server.apply_all([Send(identity, [b"1"]), Send(b"gone", [b"x"]),
                          Send(identity, [b"2"])])
        assert failed == [(b"gone", [b"x"], zmq.EHOSTUNREACH)]
        assert server.stats["dropped"] == dropped + 1
        poll_until(lambda: len(got) == 2, GUARD, "both messages", sleep=gevent.sleep)
        assert got == [("far", [b"1"]), ("far", [b"2"])]


def test_a_full_link_keeps_the_rest_in_its_backlog_in_order() -> None:
    """Nobody listens at the far end: what the link's queue does not take waits in the
    backlog in order, a later ``apply_all`` queues behind it, and all of it is dropped,
    counted, after ``send_timeout``."""
    held_port = socket.socket()   # bound, never listening: connections are refused
    held_port.bind(("127.0.0.1", 0))
    caller = Caller("tcp://127.0.0.1:%d" % held_port.getsockname()[1])
    driver = Driver(caller, ZmqTransport(), send_timeout=0.3, look_once=True, sndhwm=10,
                    name="caller")
    try:
        driver.apply(caller.start())
        count = 500
        driver.apply_all([Send("far", [b"%d" % i]) for i in range(count)])
        sent = driver.stats["sent"]
        backlog = driver._backlogs["far"]
        assert 0 < sent < count and len(backlog) == count - sent
        assert [frames[0] for frames in backlog] == [b"%d" % i for i in range(sent, count)]
        driver.apply_all([Send("far", [b"late"])])
        assert len(backlog) == count - sent + 1 and backlog[-1] == [b"late"]
        poll_until(lambda: "far" not in driver._backlogs, 10, "the backlog given up",
                   sleep=gevent.sleep)
        assert driver.stats["dropped"] == count - sent + 1
        assert driver.stats["sent"] == sent
    finally:
        driver.close()
        held_port.close()


def test_cork_holds_outputs_for_the_turn_or_until_its_limit() -> None:
    with _served(cork_limit=3) as (server, _, identity, got):
        sent = server.stats["sent"]
        for i in range(7):
            server.cork([Send(identity, [b"%d" % i])])
        assert server.stats["sent"] == sent + 6 and len(server.corked) == 1   # by threes
        poll_until(lambda: not server.corked, GUARD, "the turn's end", sleep=gevent.sleep)
        assert server.stats["sent"] == sent + 7
        poll_until(lambda: len(got) == 7, GUARD, "7 messages", sleep=gevent.sleep)
        assert got == [("far", [b"%d" % i]) for i in range(7)]
        server.cork([Send(identity, [b"uncorked"])])
        server.uncork()
        assert server.stats["sent"] == sent + 8 and not server.corked
        server.cork([Send(identity, [b"never"])])
        server.close()   # what it holds goes nowhere
        assert not server.corked


def test_cork_limit_counts_the_sends_to_each_link_apart() -> None:
    with _served(cork_limit=3) as (server, _, identity, got):
        sent, dropped = server.stats["sent"], server.stats["dropped"]
        for i in range(2):   # two to each of two links: neither has three
            server.cork([Send(identity, [b"%d" % i]), Send(b"\x00nobody", [b"lost"])])
        assert len(server.corked) == 4 and server.stats["sent"] == sent
        server.cork([Send(identity, [b"2"])])   # a third to one link: all five go now
        assert not server.corked
        assert server.stats["sent"] == sent + 3 and server.stats["dropped"] == dropped + 2
        poll_until(lambda: len(got) == 3, GUARD, "3 messages", sleep=gevent.sleep)
        assert got == [("far", [b"%d" % i]) for i in range(3)]
        server.cork([Send(identity, [b"%d" % i]) for i in range(3, 5)])   # counted anew
        assert len(server.corked) == 2


def _gone_noted(failed: list[tuple[Hashable, list[bytes], int]]) -> Any:
    return lambda link, frames, exc: failed.append((link, list(frames),
                                                    getattr(exc, "errno", 0)))


def test_addressed_sends_to_mailbox_peers_go_in_one_call_a_gone_peer_failing_alone() -> None:
    """``addressed``: the sends of a batch to mailbox peers go through the mailbox in one
    call (``try_send_each``, no send one by one); a peer gone fails its own sends (told
    to ``on_send_failed`` as they were made) and the rest go on, in order, counted."""
    failed: list[tuple[Hashable, list[bytes], int]] = []
    log: list[str] = []
    with _served(log, addressed=True, on_send_failed=_gone_noted(failed)) as (
            server, _, identity, got):
        sent, dropped = server.stats["sent"], server.stats["dropped"]
        log.clear()
        server.apply_all([Send(identity, [identity, b"1"]), Send(b"gone", [b"gone", b"x"]),
                          Send(identity, [identity, b"2"]), Send(identity, [identity, b"3"]),
                          Send(b"gone", [b"gone", b"y"])])
        assert "q" not in log and "s" not in log   # (not one by one)
        assert failed == [(b"gone", [b"gone", b"x"], zmq.EHOSTUNREACH),
                          (b"gone", [b"gone", b"y"], zmq.EHOSTUNREACH)]
        assert server.stats["sent"] == sent + 3 and server.stats["dropped"] == dropped + 2
        poll_until(lambda: len(got) == 3, GUARD, "3 messages", sleep=gevent.sleep)
        assert got == [("far", [b"1"]), ("far", [b"2"]), ("far", [b"3"])]


def test_addressed_sends_a_full_peer_does_not_take_wait_in_its_backlog_in_order() -> None:
    """A mailbox peer that reads nothing: what its queue does not take of one call's
    sends waits in that peer's backlog, in order, then is dropped after ``send_timeout``;
    the other peers' sends of the same batch go on."""
    transport = ZmqTransport()
    sock = make_socket(zmq.ROUTER, {zmq.ROUTER_MANDATORY: 1, zmq.LINGER: 0, zmq.SNDHWM: 10})
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    router = HubSocket(sock, endpoint=f"tcp://127.0.0.1:{port}")
    heard: list[Any] = []
    server = Driver(Handing(), transport, on_deliver=heard.append, look_once=True,
                    addressed=True, send_timeout=0.3, name="handing")
    slow = make_socket(zmq.DEALER, {zmq.ROUTING_ID: b"slow", zmq.RCVHWM: 10, zmq.LINGER: 0})
    client = None
    try:
        server.listen(router)
        client, _, got = _greeted(transport, router, server, heard)
        fast = heard[0][0]
        slow.connect(router.endpoint)
        slow.send(b"hello", zmq.NOBLOCK)
        poll_until(lambda: len(heard) == 2, GUARD, "the slow peer's hello", sleep=gevent.sleep)
        count = 500
        sent = server.stats["sent"]
        server.apply_all([Send(b"slow", [b"slow", b"%d" % i]) for i in range(count)]
                         + [Send(fast, [fast, b"after"])])
        backlog = server._backlogs[b"slow"]
        taken = server.stats["sent"] - sent - 1   # (the fast peer's went)
        assert 0 < taken < count and len(backlog) == count - taken
        assert [frames[1] for frames in backlog] == [b"%d" % i for i in range(taken, count)]
        poll_until(lambda: got == [("far", [b"after"])], GUARD, "the fast peer's message",
                   sleep=gevent.sleep)
        poll_until(lambda: b"slow" not in server._backlogs, 10, "the backlog given up",
                   sleep=gevent.sleep)
    finally:
        slow.close(linger=0)
        if client is not None:
            client.close()
        server.close()


def test_addressed_sends_down_one_routed_link_go_in_one_call_in_order() -> None:
    """A batch's sends all down one link of a connecting ROUTER (addressed: each names
    the connection first) go out in one ``try_send_each`` call, in order, counted."""
    transport = ZmqTransport()
    router = connecting_router(transport, {zmq.LINGER: 0}, max_message=1 << 20,
                               max_frames=16, linger=0.0)
    calls: list[int] = []
    each = router.try_send_each
    router.try_send_each = lambda messages: calls.append(1) or each(messages)
    far = make_socket(zmq.ROUTER, {zmq.LINGER: 0})
    endpoint = "tcp://127.0.0.1:%d" % far.bind_to_random_port("tcp://127.0.0.1")
    driver = Driver(Handing(), RoutedTransport(transport, router, addressed=True),
                    look_once=True, addressed=True, name="routed")
    got: list[bytes] = []

    def read() -> bool:
        while far.poll(0):
            got.append(far.recv_multipart(zmq.NOBLOCK)[-1])
        return len(got) == 20
    try:
        driver.listen(router)
        driver.apply([Dial(b"ch", endpoint, b"ch")])
        sent = driver.stats["sent"]
        driver.apply_all([Send(b"ch", [b"ch", b"%d" % i]) for i in range(20)])
        assert calls == [1] and driver.stats["sent"] == sent + 20
        poll_until(read, GUARD, "20 messages", sleep=gevent.sleep)
        assert got == [b"%d" % i for i in range(20)]
    finally:
        driver.close()
        far.close(linger=0)
