"""The driver's ``look_once``: the sends made while a batch is handled skip the look after
each send, and the socket is looked at once when the batch is done; sends made outside a
batch look at once; answers go out whole and in order."""

from __future__ import annotations

from typing import Any, Hashable, Optional

import gevent

from peermesh.core import Deliver, Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.io.socket import GUARD
from peermesh.io.transport import ZmqTransport

from test_driver import Caller  # (this folder's: tests/io)
from waiting import poll_until


class Handing(Outputs):
    """Delivers every message for its owner to answer."""

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        return [Deliver((link, frames))]

    def handle_timer(self, now: float) -> list[Output]:
        return []

    def next_deadline(self) -> Optional[float]:
        return None


class Logged:
    """A mailbox that logs each send made quietly ("q") or looking ("s"), and each look
    ("r")."""

    def __init__(self, mailbox: Any, log: list[str]) -> None:
        self.mailbox, self.log = mailbox, log

    def try_send(self, frames: Any, look: bool = True) -> bool:
        self.log.append("s" if look else "q")
        return bool(self.mailbox.try_send(frames, look))

    def readable(self) -> bool:
        self.log.append("r")
        return bool(self.mailbox.readable())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.mailbox, name)


def test_answers_in_batches_are_sent_quietly_and_nothing_stalls() -> None:
    transport, drivers = ZmqTransport(), []
    log: list[str] = []
    got: list[Any] = []
    rounds = 200
    try:
        server = Driver(Handing(), transport, look_once=True, name="handing")
        drivers.append(server)
        server.on_deliver = lambda item: server.apply([Send(item[0], item[1][::-1])])
        mailbox = transport.bind_mailbox("127.0.0.1", 1 << 16)
        server.listen(Logged(mailbox, log))
        caller = Caller(mailbox.endpoint)

        def answered(item: Any) -> None:   # one message at a time: the next once answered
            got.append(item)
            if len(got) < rounds:
                client.apply(caller.say(b"%d" % len(got), b"x"))

        client = Driver(caller, transport, on_deliver=answered, name="caller")
        drivers.append(client)
        client.apply(caller.start())
        client.apply(caller.say(b"0", b"x"))
        poll_until(lambda: len(got) == rounds, GUARD, f"{rounds} answers", sleep=gevent.sleep)
        assert got == [("far", [b"x", b"%d" % i]) for i in range(rounds)]
        assert log == ["q", "r"] * rounds   # each answer sent quietly, then one look
        assert server.mailbox is not None
        server.mailbox.try_send([b"nobody-knows", b"x"])   # (a ROUTER drops it)
        assert log[-1] == "s"           # outside a batch: looked after at once
    finally:
        for driver in drivers:
            driver.close()


def test_sends_applied_to_look_later_go_at_once_and_are_looked_at_once_per_turn() -> None:
    transport, drivers = ZmqTransport(), []
    log: list[str] = []
    got: list[Any] = []
    try:
        server = Driver(Handing(), transport, look_once=True, name="handing")
        drivers.append(server)
        heard: list[Any] = []
        server.on_deliver = heard.append
        mailbox = transport.bind_mailbox("127.0.0.1", 1 << 16)
        logged = Logged(mailbox, log)
        server.listen(logged)
        caller = Caller(mailbox.endpoint)
        client = Driver(caller, transport, on_deliver=got.append, name="caller")
        drivers.append(client)
        client.apply(caller.start())
        client.apply(caller.say(b"hello", b"x"))
        poll_until(lambda: heard, GUARD, "the caller heard", sleep=gevent.sleep)
        far = heard[0][0]   # (its identity)
        log.clear()
        for i in range(3):   # one turn of the hub: sent at once, looked at after it
            server.apply([Send(far, [b"%d" % i])], look_now=False)
        assert log == ["q", "q", "q"]
        poll_until(lambda: len(got) == 3, GUARD, "three answers", sleep=gevent.sleep)
        assert log == ["q", "q", "q", "r"]   # one look for the turn
        assert [frames for _, frames in got] == [[b"0"], [b"1"], [b"2"]]
        server.apply([Send(far, [b"3"])])     # (looking now: as before)
        assert log[-1] == "s"
    finally:
        for driver in drivers:
            driver.close()
