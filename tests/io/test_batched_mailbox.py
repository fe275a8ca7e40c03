"""``peermesh.io.routed.BatchedMailbox``: the sends made while a batch is handled skip the
look after each send (they are looked after once, when the batch is done); sends made
outside a batch look at once; answers go out whole and in order."""

from __future__ import annotations

from typing import Any, Hashable, Optional

import gevent

from peermesh.core import Deliver, Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.io.routed import BatchedMailbox
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


class Logged(BatchedMailbox):
    """Logs whether each send was made quietly (inside a batch: "q") or not ("s")."""

    def __init__(self, mailbox: Any, log: list[str]) -> None:
        super().__init__(mailbox)
        self.log = log

    def try_send(self, frames: Any) -> bool:
        self.log.append("q" if self._batching else "s")
        return super().try_send(frames)


def test_answers_in_batches_are_sent_quietly_and_nothing_stalls() -> None:
    transport, log, drivers = ZmqTransport(), [], []
    got: list[Any] = []
    rounds = 200
    try:
        server = Driver(Handing(), transport, name="handing")
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
        assert log == ["q"] * rounds    # every answer made inside its batch: quiet
        assert server.mailbox is not None
        server.mailbox.try_send([b"nobody-knows", b"x"])   # (a ROUTER drops it)
        assert log[-1] == "s"           # outside a batch: looked after at once
    finally:
        for driver in drivers:
            driver.close()
