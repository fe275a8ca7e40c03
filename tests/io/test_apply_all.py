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

from peermesh.core import Deliver, Send
from peermesh.io.driver import Driver
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
