"""The rows of a ZRE session's peer table: ``Peer`` and the ``Outbox`` it sends through.

A ``Peer`` is what ``session.Session`` knows of one remote node (identity,
its HELLO's data, groups, sequence numbers, liveness and round-trip state);
the session decides every change to it. ``Outbox`` is the peer's outgoing
link as the session sees it (``peer.PeerLink`` on gevent); ``Dialling``
stands in for it until the driver answers the session's ``Dial``. No I/O
here.
"""

from __future__ import annotations

from collections import deque
from typing import AbstractSet, Optional, Protocol, Sequence
from uuid import UUID

from .roundtrip import RoundTrip

__all__ = ["Outbox", "Dialling", "Peer"]


class Outbox(Protocol):
    """A peer's outgoing link as the session sees it (``peer.PeerLink`` on gevent)."""

    limit: int
    stalled_since: Optional[float]

    def offer(self, frames: Sequence[bytes]) -> None:
        """Send now or queue behind the backlog; never blocks."""

    def offer_each(self, messages: Sequence[Sequence[bytes]]) -> int:
        """``offer`` each of ``messages`` in order while ``has_room``; how many it took."""

    def queued(self) -> int:
        """How much waits in the backlog, in the unit of ``limit``."""

    def has_room(self) -> bool:
        """True while the backlog is below ``limit``."""

    def close(self, linger: float = 0) -> None:
        """Drop the backlog and close."""


class Dialling:
    """The ``Outbox`` of a peer whose ``Dial`` the driver has not answered yet: it keeps
    what is offered (a HELLO, the commands of the same input) for ``Session.attach`` to
    hand to the real one, in order. A driver answers every ``Dial`` before it feeds the
    session again, so it never holds more than one input's commands."""

    __slots__ = ("limit", "stalled_since", "frames", "octets", "closed")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stalled_since: Optional[float] = None
        self.frames: list[Sequence[bytes]] = []
        self.octets = 0
        self.closed = False

    def offer(self, frames: Sequence[bytes]) -> None:
        """Keep ``frames`` for the real link."""
        if not self.closed:
            self.frames.append(frames)
            self.octets += sum(map(len, frames))

    def offer_each(self, messages: Sequence[Sequence[bytes]]) -> int:
        """Keep each of ``messages``; all of them."""
        for frames in messages:
            self.offer(frames)
        return len(messages)

    def queued(self) -> int:
        """Octets kept."""
        return self.octets

    def has_room(self) -> bool:
        """True while under ``limit`` octets."""
        return self.octets < self.limit

    def close(self, linger: float = 0) -> None:
        """Drop what is kept; the real link, when it comes, is closed at once."""
        self.closed = True
        self.frames.clear()
        self.octets = 0


class _Waker(Protocol):
    """What ``flush`` waits on (a gevent event in the node)."""

    def set(self) -> None: ...


#: the groups of every peer that joined none (one object: ``frozenset()`` makes a new one)
_NO_GROUPS: frozenset[str] = frozenset()


class Peer:
    """A remote node: identity, HELLO data, groups, sequence and liveness state."""

    __slots__ = ("uuid", "uuid_bytes", "identity", "endpoint", "link", "ready", "name",
                 "headers", "groups", "status", "want", "sent", "last_seen", "next_ping",
                 "evasive", "silent", "unconfirmed", "pong", "total", "pings", "confirmed",
                 "since", "rtt", "next_probe")

    def __init__(self, uuid: UUID, endpoint: str, link: Outbox, now: float) -> None:
        self.uuid = uuid
        self.uuid_bytes = uuid.bytes
        self.identity = b"\x01" + self.uuid_bytes
        self.endpoint = endpoint
        self.link = link
        self.ready = False          # HELLO received
        self.name = ""
        self.headers: dict[str, str] = {}
        self.groups: AbstractSet[str] = _NO_GROUPS  # a set once it joins (few peers do)
        self.status = 0             # peer's group status (mod 256)
        self.want = 1               # next sequence expected from the peer
        self.sent = 0               # last sequence sent to the peer
        self.last_seen = now
        self.next_ping = 0.0
        self.evasive = False        # EVASIVE reported for this silence
        self.silent = False         # SILENT reported for this silence
        self.unconfirmed = False    # application messages sent since the last flush
        self.pong: Optional[_Waker] = None  # set on each PING-OK and on removal (flush waits)
        self.total = 0              # messages sent to the peer, ever
        #: (``total``, the time or None) when each unanswered PING went
        self.pings: Optional[deque[tuple[int, Optional[float]]]] = None
        self.confirmed = 0          # messages the peer is known to have handled
        self.since = now            # when it entered the table
        self.rtt: Optional[RoundTrip] = None  # PING to PING-OK times, once it answered one
        self.next_probe = now       # when to PING it for a round-trip time (``rtt_probe``)

    @property
    def state(self) -> str:
        """Liveness: "alive", "evasive" (PINGed after ``evasive`` of silence) or "silent"."""
        return "silent" if self.silent else "evasive" if self.evasive else "alive"

    def next_sequence(self) -> int:
        """The sequence number for the next message to this peer."""
        self.total += 1
        self.sent = (self.sent + 1) & 0xFFFF
        return self.sent

    def advance(self, count: int) -> None:
        """Count ``count`` messages sent, numbered after ``sent`` (headers made ahead,
        from ``(sent + 1) & 0xFFFF`` on)."""
        self.total += count
        self.sent = (self.sent + count) & 0xFFFF

    def refresh(self, now: float) -> None:
        """Any sign of life: reset the silence timers."""
        self.last_seen = now
        self.next_ping = 0.0
        self.evasive = self.silent = False
