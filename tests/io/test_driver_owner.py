"""The driver's options for an owner that takes most of its core's traffic itself (a ZRE
node), on the simulated network: the per-message fast path (``delivery``), outputs
carried out by the owner before the core is fed again (``carry_out``), the owner's checks
before each timer run (``on_timer``) on the owner's clock (``clock``), a gate on a
message property checked inline (``listen(admit=, admitted=)``) and ``replies=False``."""

from __future__ import annotations

from typing import Any, Hashable, Optional, Sequence

import pytest

from peermesh.core import Dial, Emit, Output, Outputs, Send
from peermesh.io.driver import Driver
from peermesh.sim import SimNetwork
from waiting import poll_until


class Owned(Outputs):
    """A core whose owner answers its dials: a message "d..." is delivered on the fast path
    (``delivery``), any other one is ``receive``d; "dial" asks for a dial, and every
    message notes whether the last dial was answered before it came in."""

    def __init__(self) -> None:
        super().__init__()
        self.unanswered: Optional[bytes] = None  # the dial the owner has not answered yet
        self.fed: list[tuple[bytes, bool, float]] = []  # (first frame, all answered, now)
        self.deadline: Optional[float] = None
        self.timers: list[float] = []

    def delivery(self, link: Hashable, frames: list[bytes], now: float) -> Optional[bytes]:
        if not frames[0].startswith(b"d") or frames[0] == b"dial":
            return None
        self.fed.append((frames[0], self.unanswered is None, now))
        return frames[0]

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        self.fed.append((frames[0], self.unanswered is None, now))
        if frames[0] == b"dial":
            self.unanswered = b"%d" % len(self.fed)
            self._out(Dial(self.unanswered, "tcp://10.9.9.9:1"))
        self._out(Emit(frames[0]))
        if self.deadline is None:
            self.deadline = now + 1.0
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        self.timers.append(now)
        self.deadline = now + 1.0 if len(self.timers) < 2 else None
        return self.take()

    def next_deadline(self) -> Optional[float]:
        return self.deadline


class Clock:
    """The owner's clock: the network's, shifted, counting its readings."""

    def __init__(self, network: SimNetwork, offset: float) -> None:
        self.network, self.offset, self.reads = network, offset, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.network.clock.now() + self.offset


def test_fast_path_and_owner_outputs_keep_order_and_answer_before_the_next_message() -> None:
    network = SimNetwork(latency=0.001)
    server_transport, client_transport = network.transport(), network.transport()
    core, seen, before_timers = Owned(), [], []
    clock = Clock(network, 5_000.0)

    def carry_out(outputs: Sequence[Output]) -> None:
        for output in outputs:
            if type(output) is Dial:
                assert output.link == core.unanswered
                core.unanswered = None      # answered at once, before the next message
            else:
                seen.append(("event", output.event))   # type: ignore[union-attr]

    def on_timer(now: float) -> None:
        before_timers.append((now, len(core.timers)))

    driver = Driver(core, server_transport, on_deliver=lambda item: seen.append(("item", item)),
                    delivery=core.delivery, carry_out=carry_out, on_timer=on_timer,
                    clock=clock, name="owned")
    try:
        mailbox = server_transport.bind_mailbox("127.0.0.1", 1 << 16)
        driver.listen(mailbox, replies=False)
        assert mailbox.replies is False          # (a simulated mailbox keeps no links)
        link = client_transport.connect(b"sender", mailbox.endpoint, 1000)
        sent = [b"d0", b"dial", b"d1", b"x", b"dial", b"d2", b"dial", b"dial", b"d3"]
        for frame in sent:                       # one instant: read as one batch
            link.try_send([frame, b"body"])
        reads = clock.reads

        def handled() -> bool:
            network.clock.advance(0.01)
            return len(core.fed) == len(sent)
        poll_until(handled, 10, "every message handled", sleep=lambda s: None)
        assert [frame for frame, _, _ in core.fed] == sent
        assert all(answered for _, answered, _ in core.fed)   # dial answered before the next
        assert seen == [("item" if f.startswith(b"d") and f != b"dial" else "event", f)
                        for f in sent]                        # one order: fast path or not
        stamps = {now for _, _, now in core.fed}
        assert len(stamps) == 1 and stamps.pop() >= 5_000.0   # one reading, the owner's clock
        assert clock.reads - reads <= 3    # (the batch's reading, and the timer's: not each)
        assert driver.stats["received"] == len(sent)

        def ran_twice() -> bool:
            network.clock.advance(0.5)
            return len(core.timers) == 2
        poll_until(ran_twice, 10, "two timer runs", sleep=lambda s: None)
        assert [count for _, count in before_timers] == [0, 1]   # each before its run
        assert [now for now, _ in before_timers] == core.timers  # at the same time
        assert all(now >= 5_001.0 for now in core.timers)       # on the owner's clock
    finally:
        driver.close()


@pytest.mark.parametrize("direct", [True, False], ids=["fast-path", "general"])
def test_a_gate_on_a_message_property_is_checked_inline_once_admitted(direct: bool) -> None:
    network = SimNetwork(latency=0.001)
    server_transport = network.transport()
    senders = {name: network.transport() for name in (b"good", b"evil")}
    core = Owned()
    admitted: dict[bytes, Any] = {}
    asked: list[bytes] = []

    def admit(identity: bytes, frames: list[bytes], address: Any) -> bool:
        asked.append(identity)
        if identity != b"good":
            return False
        admitted[identity] = address
        return True

    owner: dict[str, Any] = {"delivery": core.delivery, "carry_out": lambda outputs: None}
    driver = Driver(core, server_transport, on_deliver=lambda item: None, name="gated",
                    **(owner if direct else {}))
    try:
        mailbox = server_transport.bind_mailbox("127.0.0.1", 1 << 16)
        driver.listen(mailbox, "Peer-Address", admit=admit, admitted=admitted.get,
                      replies=False)
        links = {name: t.connect(name, mailbox.endpoint, 1000) for name, t in senders.items()}
        for i in range(3):
            for name, link in links.items():
                link.try_send([b"d%d" % i, name])

        def handled() -> bool:
            network.clock.advance(0.01)
            return len(asked) >= 4 and len(core.fed) == 3
        poll_until(handled, 10, "the good sender's messages in", sleep=lambda s: None)
        assert [frame for frame, _, _ in core.fed] == [b"d0", b"d1", b"d2"]  # the evil: none
        assert asked == [b"good", b"evil", b"evil", b"evil"]   # the good one asked once
        assert admitted == {b"good": senders[b"good"].address}
    finally:
        driver.close()


class Counted(Owned):
    """``Owned`` counting how often the driver asks for its deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def next_deadline(self) -> Optional[float]:
        self.asked += 1
        return self.deadline


def test_a_batch_only_the_fast_path_took_leaves_the_timer_and_one_received_moves_it() -> None:
    network = SimNetwork(latency=0.001)
    server_transport, client_transport = network.transport(), network.transport()
    core, seen = Counted(), []
    driver = Driver(core, server_transport, on_deliver=seen.append, delivery=core.delivery,
                    carry_out=lambda outputs: seen.extend(outputs), name="counted")
    try:
        mailbox = server_transport.bind_mailbox("127.0.0.1", 1 << 16)
        driver.listen(mailbox, replies=False)
        link = client_transport.connect(b"sender", mailbox.endpoint, 1000)
        asked = core.asked
        for batch in range(3):                   # three batches, each the fast path's alone
            for i in range(4):
                link.try_send([b"d%d" % (batch * 4 + i)])
            poll_until(lambda: network.clock.advance(0.01) or len(seen) == 4 * (batch + 1),
                       10, "a batch delivered", sleep=lambda s: None)
        assert seen == [b"d%d" % i for i in range(12)]
        assert core.asked == asked               # no deadline can have moved: not asked
        assert core.timers == []
        start = network.clock.now()
        link.try_send([b"x"])                    # received: its deadline (now + 1) is armed
        poll_until(lambda: network.clock.advance(0.05) or bool(core.timers), 10,
                   "the timer run at the deadline the received message set",
                   sleep=lambda s: None)
        assert core.asked > asked
        assert start + 1.0 <= core.timers[0] <= start + 1.2
    finally:
        driver.close()


class Recorder(Outputs):
    """A core that notes each message (link, first frame, now), asks "go" of whatever link
    it has dialled, and answers a "go" with five messages at once."""

    def __init__(self) -> None:
        super().__init__()
        self.fed: list[tuple[Hashable, bytes, float]] = []

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        self.fed.append((link, frames[0], now))
        if frames[0] == b"go":
            for i in range(5):
                self._out(Send(link, [b"m%d" % i]))
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        return []

    def next_deadline(self) -> Optional[float]:
        return None


@pytest.mark.parametrize("batch_clock", [True, False], ids=["batch-clock", "per-message"])
def test_batch_clock_reads_the_clock_once_per_batch_on_the_mailbox_and_a_link(
        batch_clock: bool) -> None:
    network = SimNetwork(latency=0.001)
    served, far, sender = network.transport(), network.transport(), network.transport()
    core, far_core = Recorder(), Recorder()
    clock = Clock(network, 0.0)
    driver = Driver(core, served, clock=clock, batch_clock=batch_clock, name="stamped")
    far_driver = Driver(far_core, far, name="far")
    try:
        far_mailbox = far.bind_mailbox("127.0.0.1", 1 << 16)
        far_driver.listen(far_mailbox)
        mailbox = served.bind_mailbox("127.0.0.1", 1 << 16)
        driver.listen(mailbox)
        reads = clock.reads
        driver.apply([Dial("up", far_mailbox.endpoint, b"served"), Send("up", [b"go"])])
        link = sender.connect(b"sender", mailbox.endpoint, 1000)
        for i in range(4):                       # one instant: read as one batch
            link.try_send([b"s%d" % i])

        def handled() -> bool:
            network.clock.advance(0.01)
            return len(core.fed) == 9
        poll_until(handled, 10, "every message handled", sleep=lambda s: None)
        by_link: dict[Hashable, list[tuple[bytes, float]]] = {}
        for name, frame, now in core.fed:
            by_link.setdefault(name, []).append((frame, now))
        assert [f for f, _ in by_link["up"]] == [b"m%d" % i for i in range(5)]   # in order
        assert [f for f, _ in by_link[b"sender"]] == [b"s%d" % i for i in range(4)]
        assert driver.stats["received"] == 9
        if batch_clock:   # each batch stamped once, the link's and the mailbox's
            assert len({now for _, now in by_link["up"]}) == 1
            assert len({now for _, now in by_link[b"sender"]}) == 1
            assert clock.reads - reads == 2
        else:
            assert clock.reads - reads == 9
    finally:
        driver.close()
        far_driver.close()
