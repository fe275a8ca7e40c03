"""The driver's ``gather`` option: what is applied while a batch's outputs are carried out
(here an ``on_deliver`` that answers at once) joins them, so a batch's sends leave after
all of its deliveries, back to back; nothing is lost or reordered."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Optional

import gevent
import pytest

from peermesh.core import Deliver, Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.io.routed import BatchedMailbox
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


class Marked(BatchedMailbox):
    """A mailbox that logs its sends and the end of each batch in ``log``."""

    def __init__(self, mailbox: Any, log: list[str]) -> None:
        super().__init__(mailbox)
        self.log = log

    def serve(self, on_message: Any, on_oversized: Any = None, backpressure: Any = None, *,
              metadata: Optional[str] = None,
              after_batch: Optional[Callable[[], None]] = None) -> None:
        def done() -> None:
            assert after_batch is not None
            after_batch()
            self.log.append("|")
        super().serve(on_message, on_oversized, backpressure, metadata=metadata,
                      after_batch=done)

    def try_send(self, frames: Any) -> bool:
        self.log.append("S")
        return super().try_send(frames)


@pytest.mark.parametrize("gather", [True, False])
def test_a_batchs_answers_leave_after_its_deliveries(gather: bool) -> None:
    transport, log, drivers = ZmqTransport(), [], []
    got: list[Any] = []
    try:
        server = Driver(Handing(), transport, name="handing", gather=gather)
        drivers.append(server)

        def answer(item: Any) -> None:
            log.append("D")
            link, frames = item
            server.apply([Send(link, frames[::-1])])

        server.on_deliver = answer
        mailbox = transport.bind_mailbox("127.0.0.1", 1 << 16)
        server.listen(Marked(mailbox, log))
        caller = Caller(mailbox.endpoint)
        client = Driver(caller, transport, on_deliver=got.append, name="caller")
        drivers.append(client)
        client.apply(caller.start())
        for i in range(300):     # sent in one go: the server reads them in batches
            client.apply(caller.say(b"%d" % i, b"x"))
        poll_until(lambda: len(got) == 300, 10, "300 answers", sleep=gevent.sleep)
        assert got == [("far", [b"x", b"%d" % i]) for i in range(300)]
        batches = "".join(log).split("|")
        assert "".join(batches).count("D") == "".join(batches).count("S") == 300
        if gather:   # every answer of a batch after every delivery of it
            assert all(batch == "D" * (len(batch) // 2) + "S" * (len(batch) // 2)
                       for batch in batches)
        else:        # each answer at once
            assert all(batch == "DS" * (len(batch) // 2) for batch in batches)
    finally:
        for driver in drivers:
            driver.close()
