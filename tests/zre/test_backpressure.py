"""An application that reads slowly pushes back on its peers: nothing is dropped, nobody
is reported gone for it.

Two real nodes on loopback without discovery (no beacon keeps either alive): the
sender learns the receiver's mailbox directly. The receiver's application stops
reading for longer than ``expired``; its queue fills to its bounds, its mailbox is
not read meanwhile, and yet neither node reports the other gone (an idle peer
without beacons is still reported EVASIVE once in a while, as ZRE does), and every
message arrives, in order, once it reads again.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterator

import pytest

from peermesh import ThreadedNode
from peermesh.events import Event, EventType

try:  # tests/ as a package
    from ..waiting import poll_until, wait_for
except ImportError:  # tests/ on sys.path
    from waiting import poll_until, wait_for

WAIT = 20.0
EXPIRED = 1.5
TIMERS = dict(interface="lo", discovery=(), evasive=0.3, silent=0.6, expired=EXPIRED)
IDLE = (EventType.EVASIVE, EventType.SILENT)


@pytest.fixture
def pair(free_udp_port: int) -> Iterator[tuple[ThreadedNode, ThreadedNode]]:
    """(receiver, sender), the sender entered at the receiver and the other way round."""
    with ThreadedNode("receiver", port=free_udp_port, event_queue=64,
                      event_queue_bytes=1_000_000, max_message=500_000, **TIMERS) as receiver, \
            ThreadedNode("sender", port=free_udp_port, **TIMERS) as sender:
        uuid, endpoint = receiver.uuid, receiver.endpoint
        sender.call(lambda node: node.peer_appeared(uuid, endpoint))
        wait_for(receiver, lambda e: e.type is EventType.ENTER, WAIT, "ENTER of the sender")
        wait_for(sender, lambda e: e.type is EventType.ENTER, WAIT, "ENTER of the receiver")
        yield receiver, sender


def take(node: ThreadedNode, count: int) -> list[Event]:
    events: list[Event] = []
    while len(events) < count:
        event = node.recv(WAIT)
        assert event is not None, f"{len(events)} of {count} events came"
        assert event.type is not EventType.EXIT, event
        if event.type not in IDLE:
            events.append(event)
        assert node.stats()["event_queue_bytes"] <= 1_000_000
    return events


@pytest.mark.parametrize("size,count", [(300_000, 12), (100, 3000)],
                         ids=["octets-bound", "count-bound"])
def test_a_stalled_reader_loses_nothing_and_nobody_leaves(
        pair: tuple[ThreadedNode, ThreadedNode], size: int, count: int) -> None:
    receiver, sender = pair
    for i in range(count):
        sender.whisper(receiver.uuid, i.to_bytes(4, "big") + b"x" * size)
    # the stall under test: the application reads nothing for twice ``expired``
    time.sleep(2 * EXPIRED)
    assert receiver.stats()["event_queue_bytes"] <= 1_000_000
    events = take(receiver, count)
    assert [int.from_bytes(e.frames[0][:4], "big") for e in events] == list(range(count))
    assert sender.flush(WAIT)
    assert receiver.stats()["events_dropped"] == 0
    while (event := sender.recv(0)) is not None:
        assert event.type is not EventType.EXIT, event
    assert receiver.peers() == [sender.uuid] and sender.peers() == [receiver.uuid]
    poll_until(lambda: not receiver.call(lambda node: node._events.blocked()), WAIT,
               "the receiver reading again")


def test_confirms_held_for_the_application(free_udp_port: int) -> None:
    """With ``hold_confirms`` a PING is the application's to answer (CONFIRM, ``confirm``):
    the sender's flush is True only once the application says it handled what came
    before; a flush that timed out leaves the peer unconfirmed for the next one."""
    with ThreadedNode("receiver", port=free_udp_port, setup=lambda node: node.hold_confirms(),
                      **TIMERS) as receiver, \
            ThreadedNode("sender", port=free_udp_port, **TIMERS) as sender:
        uuid, endpoint = receiver.uuid, receiver.endpoint
        sender.call(lambda node: node.peer_appeared(uuid, endpoint))
        wait_for(receiver, lambda e: e.type is EventType.ENTER, WAIT, "ENTER of the sender")
        wait_for(sender, lambda e: e.type is EventType.ENTER, WAIT, "ENTER of the receiver")
        answering, done = threading.Event(), threading.Event()
        seen: list[Event] = []

        def application() -> None:  # answers every CONFIRM, once allowed to
            held: list[Any] = []
            while not done.is_set():
                event = receiver.recv(0.05)
                if event is not None:
                    seen.append(event)
                    if event.type is EventType.CONFIRM:
                        held.append(event.peer)
                while held and answering.is_set():
                    peer = held.pop(0)
                    receiver.call(lambda node: node.confirm(peer))

        thread = threading.Thread(target=application)
        thread.start()
        try:
            sender.whisper(uuid, b"first")
            assert not sender.flush(0.3)  # not answered yet
            assert not sender.flush(0.3)  # still not: the failure is remembered
            answering.set()
            assert sender.flush(WAIT)
            kinds = [e.type for e in seen]
            assert EventType.WHISPER in kinds
            assert kinds.index(EventType.WHISPER) < kinds.index(EventType.CONFIRM)
        finally:
            done.set()
            thread.join(WAIT)
