"""The driver's ``pass_each``: a core's own fast path over a batch read sends what it
takes itself, the rest goes to ``receive``, and a batch's answers still leave in the
order its messages came (outputs held for earlier messages are carried out before the
fast path's first send); each socket it sent on is looked at after the batch."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Optional

import gevent
import zmq

from peermesh.core import Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.io.socket import GUARD
from peermesh.io.transport import ZmqTransport

from test_driver import Caller  # (this folder's: tests/io)
from waiting import poll_until


class Echoing(Outputs):
    """Answers every message with its frames, through the driver."""

    def __init__(self) -> None:
        super().__init__()
        self.received = 0

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        self.received += 1
        return [Send(link, frames)]

    def handle_timer(self, now: float) -> list[Output]:
        return []

    def next_deadline(self) -> Optional[float]:
        return None


def test_a_mixed_batch_is_answered_in_order() -> None:
    transport, drivers = ZmqTransport(), []
    core = Echoing()
    taken: list[int] = []
    flushed: list[bool] = []
    looked: list[Any] = []
    got: list[Any] = []
    try:
        server: Driver

        def pass_each(link: Optional[Hashable], batch: list, start: int, now: float,
                      looking: list[Any], flush: Optional[Callable[[], bool]]) -> int:
            """Echoes the messages whose first frame is b"fast" straight on the ROUTER."""
            assert link is None
            at = start
            while at < len(batch):
                identity, frames = batch[at]
                if not frames or frames[0] != b"fast":
                    break
                if flush is not None:
                    flushed.append(True)
                    if not flush():
                        break
                    flush = None
                mailbox: Any = server.mailbox
                mailbox.socket.send_multipart([identity, *frames], zmq.NOBLOCK)
                if mailbox not in looking:
                    looking.append(mailbox)
                    looked.append(mailbox)
                at += 1
            taken.append(at - start)
            return at

        server = Driver(core, transport, batch_clock=True, pass_each=pass_each, name="echo")
        drivers.append(server)
        mailbox = transport.bind_mailbox("127.0.0.1", 1 << 16)
        server.listen(mailbox)
        caller = Caller(mailbox.endpoint)
        client = Driver(caller, transport, on_deliver=got.append, name="caller")
        drivers.append(client)
        client.apply(caller.start())
        sent: list[list[bytes]] = []
        for burst in range(20):
            outputs: list[Output] = []
            for i in range(10):
                frames = [b"fast" if (burst + i) % 3 else b"slow", b"%d-%d" % (burst, i)]
                sent.append(frames)
                outputs += caller.say(*frames)
            client.apply(outputs)   # (one burst: read in one batch or a few)
            gevent.sleep(0)
        poll_until(lambda: len(got) == len(sent), GUARD, "every answer", sleep=gevent.sleep)
        assert [frames for _, frames in got] == sent
        assert core.received == sum(frames[0] == b"slow" for frames in sent)
        assert sum(taken) == sum(frames[0] == b"fast" for frames in sent)
        assert flushed and looked   # (a slow message's answer went before a fast one)
        assert server.stats["received"] == len(sent) and server.stats["sent"] == len(sent)
    finally:
        for driver in drivers:
            driver.close()
