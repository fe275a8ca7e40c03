"""The driver's ``look_once`` batches when a send has no way out: a core's answer to a
mailbox peer that is gone (a ROUTER_MANDATORY mailbox refuses it) is told to
``on_send_failed`` and counted, the answers beside it in the same batch still go out
whole and in order, and the driver goes on serving."""

from __future__ import annotations

from typing import Any, Hashable, Optional

import gevent
import zmq

from peermesh.core import Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.io.socket import GUARD
from peermesh.io.transport import ZmqTransport

from test_driver import Caller  # (this folder's: tests/io)
from waiting import poll_until

GONE = b"g" * 16   # the identity of a peer that never connected


class Addressing(Outputs):
    """Answers every message twice, addressed as a ROUTER's send is: first to a peer that
    is gone, then back to its sender with the frames reversed."""

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        assert isinstance(link, bytes)
        self._out(Send(GONE, [GONE, *frames]))
        self._out(Send(link, [link, *frames[::-1]]))
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        return []

    def next_deadline(self) -> Optional[float]:
        return None


def test_a_send_refused_in_a_batch_is_told_and_the_batch_goes_on() -> None:
    transport, drivers = ZmqTransport(), []
    got: list[Any] = []
    failed: list[tuple[Hashable, list[bytes], int]] = []
    rounds = 50
    try:
        server = Driver(Addressing(), transport, addressed=True, look_once=True,
                        on_send_failed=lambda link, frames, exc: failed.append(
                            (link, list(frames), getattr(exc, "errno", 0))),
                        name="addressing")
        drivers.append(server)
        mailbox = transport.bind_mailbox("127.0.0.1", 1 << 16)
        mailbox.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        server.listen(mailbox)
        caller = Caller(mailbox.endpoint)
        client = Driver(caller, transport, on_deliver=got.append, name="caller")
        drivers.append(client)
        client.apply(caller.start())
        for i in range(rounds):   # sent at once: the server reads them in batches
            client.apply(caller.say(b"%d" % i, b"x"))
        poll_until(lambda: len(got) == rounds, GUARD, f"{rounds} answers", sleep=gevent.sleep)
        assert got == [("far", [b"x", b"%d" % i]) for i in range(rounds)]
        assert failed == [(GONE, [GONE, b"%d" % i, b"x"], zmq.EHOSTUNREACH)
                          for i in range(rounds)]
        assert server.stats["dropped"] == rounds and server.stats["sent"] == rounds
        assert not server._backlogs
    finally:
        for driver in drivers:
            driver.close()
