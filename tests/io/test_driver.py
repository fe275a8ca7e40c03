"""The one driver on the real transport (ZeroMQ on loopback) and on the simulated one: a
core's sends go out in order, what it dials answers back through it, its timer runs on the
transport's clock, hangups close links, and a core that returns nothing costs nothing."""

from __future__ import annotations

import socket

from typing import Any, Hashable, Iterator, Optional

import gevent
import pytest

from peermesh.core import Core, Deliver, Dial, Hangup, Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.io.transport import ZmqTransport
from peermesh.sim import SimNetwork
from waiting import poll_until


class Echo(Outputs):
    """Answers every message with its frames reversed; counts timer runs."""

    def __init__(self, every: Optional[float] = None) -> None:
        super().__init__()
        self.every = every
        self.deadline: Optional[float] = None
        self.timers: list[float] = []

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        self._out(Send(link, frames[::-1]))
        if self.every is not None and self.deadline is None:
            self.deadline = now + self.every
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        self.timers.append(now)
        self.deadline = now + self.every if len(self.timers) < 3 and self.every else None
        return self.take()

    def next_deadline(self) -> Optional[float]:
        return self.deadline


class Caller(Outputs):
    """Dials ``endpoint`` as link "far", delivers what comes back on it."""

    def __init__(self, endpoint: str) -> None:
        super().__init__()
        self.endpoint = endpoint

    def start(self) -> list[Output]:
        self._out(Dial("far", self.endpoint, b"caller-1"))
        return self.take()

    def say(self, *frames: bytes) -> list[Output]:
        self._out(Send("far", list(frames)))
        return self.take()

    def hang_up(self) -> list[Output]:
        self._out(Hangup("far"))
        return self.take()

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        self._out(Deliver((link, frames)))
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        return []

    def next_deadline(self) -> Optional[float]:
        return None


@pytest.fixture(params=["zmq", "sim"])
def transports(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any, Any]]:
    """(server transport, client transport, advance(seconds)) of one kind."""
    if request.param == "zmq":
        transport = ZmqTransport()
        yield transport, transport, gevent.sleep
    else:
        network = SimNetwork(latency=0.001)
        yield network.transport(), network.transport(), network.clock.advance


def test_sends_answers_timers_and_hangups(transports: tuple[Any, Any, Any]) -> None:
    server_transport, client_transport, advance = transports
    echo, drivers = Echo(every=0.05), []
    try:
        server = Driver(echo, server_transport, name="echo")
        drivers.append(server)
        mailbox = server_transport.bind_mailbox("127.0.0.1", 1 << 16)
        server.listen(mailbox)
        caller = Caller(mailbox.endpoint)
        got: list[Any] = []
        client = Driver(caller, client_transport, on_deliver=got.append, name="caller")
        drivers.append(client)
        assert isinstance(echo, Core) and isinstance(caller, Core)
        client.apply(caller.start())
        for i in range(200):
            client.apply(caller.say(b"%d" % i, b"x"))

        def answered() -> bool:
            advance(0.01)
            return len(got) == 200 and len(echo.timers) == 3
        poll_until(answered, 10, "200 answers, in order, and three timer runs",
                   sleep=lambda s: None)
        assert got == [("far", [b"x", b"%d" % i]) for i in range(200)]
        first, second, third = echo.timers
        assert second - first >= 0.05 and third - second >= 0.05   # on the transport's clock
        assert server.stats["received"] == 200 and client.stats["sent"] == 200
        client.apply(caller.hang_up())
        assert "far" not in client.links
        client.apply(caller.say(b"after"))      # no link: dropped, counted, no traceback
        assert client.stats["dropped"] == 1
    finally:
        for driver in drivers:
            driver.close()
    assert all(driver.closed for driver in drivers)


def test_a_full_link_holds_its_backlog_then_drops_it_after_send_timeout() -> None:
    """Nobody listens at the far end: the link queues up to its high-water mark, the rest
    waits in the driver's backlog (in order, behind what waits) and is dropped, counted,
    once ``send_timeout`` passed; the driver goes on serving."""
    # a port held bound but never listening: connections are refused, and no other socket
    # of the run can take the port meanwhile (a port merely freed could be bound again)
    held_port = socket.socket()
    held_port.bind(("127.0.0.1", 0))
    endpoint = "tcp://127.0.0.1:%d" % held_port.getsockname()[1]
    caller = Caller(endpoint)
    driver = Driver(caller, ZmqTransport(), send_timeout=0.3, name="caller")
    try:
        driver.apply(caller.start())
        sent = 0
        while "far" not in driver._backlogs:   # until the link's queue is full
            driver.apply(caller.say(b"%d" % sent))
            sent += 1
            assert sent < 200_000, "the link never filled"
        for i in range(50):
            driver.apply(caller.say(b"late"))
        held = len(driver._backlogs["far"])
        assert held == 51
        poll_until(lambda: "far" not in driver._backlogs, 10, "the backlog given up",
                   sleep=gevent.sleep)
        assert driver.stats["dropped"] == held
        assert driver.stats["sent"] == sent - 1
        driver.apply(caller.hang_up())
        assert not driver.links
    finally:
        driver.close()
        held_port.close()
