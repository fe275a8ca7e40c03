"""A ZRE ``Session`` driven by hand through its core contract, for the session tests.

``Harness`` plays the node: it feeds the session messages, discovery reports,
group calls and times, and applies what they return (or leave for ``take``)
as ``Node._apply`` does: each ``Dial`` is answered with an in-memory link
(``attach``), ``Emit`` and ``Deliver`` events are kept in ``events``.
``Remote`` plays a peer that numbers its commands; ``MemoryLink`` keeps what
the session sent a peer, decoded.
"""

from __future__ import annotations

import uuid as uuid_module
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence
from uuid import UUID

from peermesh.config import NodeConfig
from peermesh.core import Deliver, Dial, Emit, Output
from peermesh.events import Event, EventType
from peermesh.wire import zre
from peermesh.zre.session import SETTLE_STEP, Outbox, Peer, Session

if TYPE_CHECKING:
    from peermesh.zre.curve import KeyGate

ENTER = EventType.ENTER
OWN_ENDPOINT = "tcp://10.0.0.1:50000"
CONFIG = NodeConfig(interval=1.0, evasive=5.0, silent=10.0, expired=30.0, rtt_probe=0)
#: ``CONFIG`` with the timer due every 0.1 s (``min(interval, evasive / 2)``), for a test
#: that runs it at times closer than a second apart
FINE = CONFIG.replace(interval=0.1)


class MemoryLink:
    """A link that keeps what it is given, decoded; its backlog is set by the test."""

    def __init__(self, endpoint: str, limit: int = 1000) -> None:
        self.endpoint = endpoint
        self.limit = limit
        self.backlog = 0
        self.stalled_since: Optional[float] = None
        self.sent: list[zre.Message] = []
        self.closed = False

    def offer(self, frames: Sequence[bytes]) -> None:
        assert not self.closed, "sent on a closed link"
        self.sent.append(zre.decode(list(frames)))

    def offer_each(self, messages: Sequence[Sequence[bytes]]) -> int:
        for frames in messages:
            self.offer(frames)
        return len(messages)

    def queued(self) -> int:
        return self.backlog

    def has_room(self) -> bool:
        return self.backlog < self.limit

    def close(self, linger: float = 0) -> None:
        self.closed = True

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.sent]


class Harness:
    """One session, its links (by endpoint, newest last) and its events.

    ``refuse``: every ``Dial`` is answered with no link. ``link`` makes the links
    (``MemoryLink`` by default). ``gate``: a ``KeyGate`` whose timer runs with the
    session's, as the node's does.
    """

    def __init__(self, config: NodeConfig = CONFIG, headers: Optional[dict[str, str]] = None,
                 refuse: bool = False, uuid: Optional[UUID] = None, name: str = "me",
                 endpoint: str = OWN_ENDPOINT,
                 link: Optional[Callable[[UUID, str], Outbox]] = None,
                 linked: Optional[Callable[[bytes], Optional[bool]]] = None) -> None:
        self.links: dict[str, list[Any]] = {}
        self.events: list[Event] = []
        self.refuse = refuse
        self.make_link: Callable[[UUID, str], Outbox] = \
            link if link is not None else lambda uuid, endpoint: MemoryLink(endpoint)
        self.gate: Optional["KeyGate"] = None
        self.now = 0.0  # when the timer last ran
        self.session = Session(uuid or uuid_module.uuid4(), name, dict(headers or {}), config,
                               linked=linked)
        self.session.start(endpoint)

    # --- applying outputs, as the node does -------------------------------------------

    def answer(self, outputs: list[Output], refuse: Optional[bool] = None) -> list[Any]:
        """Apply ``outputs`` in order (each ``Dial`` answered, no link if ``refuse``; the
        events of a peer no link was made to, after its ``Dial``, dropped); what they
        were, as comparable tuples: ``("dial", uuid, endpoint, identity)``, ``(type, name,
        reason)`` for an ``Emit``, ``("deliver", type, frames)``."""
        refuse = self.refuse if refuse is None else refuse
        seen: list[Any] = []
        failed: set[Any] = set()
        for output in outputs:
            if isinstance(output, Dial):
                seen.append(("dial", output.link, output.endpoint, output.identity))
                link = None if refuse else self.make_link(output.link, output.endpoint)
                if link is not None:
                    self.links.setdefault(output.endpoint, []).append(link)
                if not self.session.attach(output.link, link):
                    if link is not None:
                        link.close()
                    else:
                        failed.add(output.link)
                continue
            if isinstance(output, Emit):
                event = output.event
                told: tuple = (event.type, event.name, event.reason)
            elif isinstance(output, Deliver):
                event = output.item
                told = ("deliver", event.type, event.frames)
            else:
                raise AssertionError(f"a ZRE session returned {output!r}")
            if event.peer not in failed:
                self.events.append(event)
                seen.append(told)
        if failed:
            seen.extend(self.take())  # (forgetting a peer may start a wave)
        return seen

    def take(self) -> list[Any]:
        """Apply what the session's calls outside ``receive``/``handle_timer`` left."""
        return self.answer(self.session.take())

    # --- the session's inputs -----------------------------------------------------------

    def receive(self, identity: bytes, frames: list[bytes], now: float) -> list[Any]:
        return self.answer(self.session.receive(identity, frames, now))

    def send(self, peer: "Remote", message: zre.Message, now: float) -> list[Any]:
        """``peer``'s ``message`` arrives in the mailbox at ``now``."""
        return self.receive(peer.identity, zre.encode(message), now)

    def timer(self, now: float) -> list[Any]:
        """Run the timer at ``now``, which must be due (``next_deadline``)."""
        assert self.session.next_deadline() <= now, (
            f"the timer is due at {self.session.next_deadline()}, not at {now}")
        self.now = now
        if self.gate is not None:
            self.gate.tick(now)
        return self.answer(self.session.handle_timer(now))

    def run_until(self, until: float) -> list[tuple[float, list[Any]]]:
        """The timer at each deadline the session names, up to ``until``: (time, outputs)
        of the runs that returned some."""
        ran = []
        now = self.session.next_deadline()
        while now <= until:
            outputs = self.timer(now)
            if outputs:
                ran.append((now, outputs))
            following = self.session.next_deadline()
            assert following > now, "a deadline that does not move on"
            now = following
        return ran

    def settling(self) -> bool:
        """Whether the session asks for its timer again within ``SETTLE_STEP`` of its last
        run: a claim or departure still waits on a peer's link."""
        return self.session.next_deadline() <= self.now + SETTLE_STEP

    def appeared(self, uuid: UUID, endpoint: str, now: float) -> list[Any]:
        self.session.peer_appeared(uuid, endpoint, now)
        return self.take()

    def left(self, uuid: UUID, now: float, address: Optional[str] = None) -> list[Any]:
        self.session.peer_left(uuid, now, address)
        return self.take()

    def add_group(self, group: str) -> list[Any]:
        self.session.add_group(group)
        return self.take()

    def remove_group(self, group: str) -> list[Any]:
        self.session.remove_group(group)
        return self.take()

    def contest(self, group: str) -> list[Any]:
        self.session.contest(group)
        return self.take()

    def ping(self, peer: Peer) -> list[Any]:
        self.session.ping(peer)
        return self.take()

    def oversized(self, identity: bytes) -> list[Any]:
        self.session.on_oversized(identity)
        return self.take()

    def remove(self, peer: Peer, reason: str) -> list[Any]:
        self.session.remove(peer, reason)
        return self.take()

    # --- reading back -------------------------------------------------------------------

    def link(self, endpoint: str) -> Any:
        """The newest link to ``endpoint``."""
        return self.links[endpoint][-1]

    def taken(self) -> list[tuple[EventType, Any]]:
        """Events so far as (type, reason, group, first frame or name), then forgotten."""
        got = [(e.type, e.reason or e.group or (e.frames and e.frames[0]) or e.name)
               for e in self.events]
        self.events.clear()
        return got


class Remote:
    """A peer as the test plays it: numbers its commands."""

    def __init__(self, name: str, port: int, uuid: Optional[UUID] = None) -> None:
        self.name = name
        self.uuid = uuid or uuid_module.uuid4()
        self.identity = b"\x01" + self.uuid.bytes
        self.endpoint = f"tcp://10.0.0.2:{port}"
        self.sequence = 0

    def next(self) -> int:
        self.sequence = (self.sequence + 1) & 0xFFFF
        return self.sequence

    def hello(self, groups: tuple[str, ...] = (), headers: Optional[dict[str, str]] = None,
              endpoint: Optional[str] = None) -> zre.Hello:
        self.sequence = 0
        return zre.Hello(self.next(), endpoint or self.endpoint, groups, len(groups), self.name,
                         headers or {})

    def whisper(self, data: bytes = b"hi") -> zre.Whisper:
        return zre.Whisper(self.next(), (data,))


def entered(h: Harness, peer: Remote, now: float = 0.0, **hello: Any) -> None:
    """``peer`` says HELLO to ``h`` and enters."""
    h.send(peer, peer.hello(**hello), now)
    assert (ENTER, peer.name) in h.taken()
