"""What a node knows about one peer, and the link it sends through.

A ``PeerLink`` sends without ever blocking the hub: messages go straight to
the transport's link (a DEALER) while it has room; once that is full they
wait in a bounded backlog that a flusher greenlet drains as the link becomes
writable again. Order and sequence numbers are kept because a message's
sequence is fixed when it is queued.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import AbstractSet, Any, Callable, Optional, Sequence
from uuid import UUID

import gevent
import gevent.event

__all__ = ["Peer", "PeerLink"]

log = logging.getLogger(__name__)


class PeerLink:
    """One transport link to one peer's mailbox, with a bounded backlog."""

    __slots__ = ("link", "limit", "backlog", "stalled_since", "_room", "_flusher", "_clock")

    def __init__(self, link: Any, limit: int, clock: Callable[[], float]) -> None:
        self.link = link
        self.limit = limit
        self.backlog: Optional[deque[Sequence[bytes]]] = None  # made on first use
        self.stalled_since: Optional[float] = None
        self._room: Optional[gevent.event.Event] = None
        self._flusher: Optional[gevent.Greenlet] = None
        self._clock = clock

    def queued(self) -> int:
        """Messages waiting in the backlog."""
        return len(self.backlog) if self.backlog else 0

    def has_room(self) -> bool:
        """True while the backlog is below its limit."""
        return not self.backlog or len(self.backlog) < self.limit

    def offer(self, frames: Sequence[bytes]) -> None:
        """Send ``frames`` as one message now, or queue them behind the backlog.

        Callers check ``has_room`` first; the node's few control messages
        may go past the limit.
        """
        backlog = self.backlog
        if not backlog and self.link.try_send(frames):
            return
        if backlog is None:
            backlog = self.backlog = deque()
        backlog.append(frames)
        if len(backlog) >= self.limit:
            self._room_event().clear()
        if self._flusher is None:
            self.stalled_since = self._clock()
            self._flusher = gevent.spawn(self._flush)

    def _room_event(self) -> gevent.event.Event:
        if self._room is None:
            self._room = gevent.event.Event()
            self._room.set()
        return self._room

    def wait_room(self, timeout: float) -> bool:
        """Wait until the backlog has room again; False after ``timeout`` seconds."""
        return self._room_event().wait(timeout) and self.has_room()

    def _flush(self) -> None:
        backlog = self.backlog
        assert backlog is not None
        try:
            while backlog:
                self.link.wait_writable(0.5)
                while backlog and self.link.try_send(backlog[0]):
                    backlog.popleft()
                    self.stalled_since = self._clock()
                    if len(backlog) <= self.limit // 2 and self._room is not None:
                        self._room.set()
        except Exception as exc:  # the link was closed under us: the peer is gone
            log.debug("flusher stopped: %s", exc)
        finally:
            self._flusher = None
            self.stalled_since = None
            if self._room is not None:
                self._room.set()

    def close(self, linger: float = 0) -> None:
        """Drop the backlog and close the link; it may flush for ``linger`` seconds."""
        if self._flusher is not None:
            self._flusher.kill(block=False)
        if self.backlog:
            self.backlog.clear()
        if self._room is not None:
            self._room.set()
        self.link.close(linger)


class Peer:
    """A remote node: identity, HELLO data, groups, sequence and liveness state."""

    __slots__ = ("uuid", "uuid_bytes", "identity", "endpoint", "link", "ready", "name",
                 "headers", "groups", "status", "want", "sent", "last_seen", "next_ping",
                 "evasive", "silent", "unconfirmed", "pong", "total", "pings", "confirmed")

    def __init__(self, uuid: UUID, endpoint: str, link: PeerLink, now: float) -> None:
        self.uuid = uuid
        self.uuid_bytes = uuid.bytes
        self.identity = b"\x01" + self.uuid_bytes
        self.endpoint = endpoint
        self.link = link
        self.ready = False          # HELLO received
        self.name = ""
        self.headers: dict[str, str] = {}
        self.groups: AbstractSet[str] = frozenset()  # a set once it joins (few peers do)
        self.status = 0             # peer's group status (mod 256)
        self.want = 1               # next sequence expected from the peer
        self.sent = 0               # last sequence sent to the peer
        self.last_seen = now
        self.next_ping = 0.0
        self.evasive = False        # EVASIVE reported for this silence
        self.silent = False         # SILENT reported for this silence
        self.unconfirmed = False    # application messages sent since the last flush
        self.pong: Optional[gevent.event.Event] = None  # set on each PING-OK, made on demand
        self.total = 0              # messages sent to the peer, ever
        self.pings: Optional[deque[int]] = None  # ``total`` when each unanswered PING went
        self.confirmed = 0          # messages the peer is known to have handled

    def next_sequence(self) -> int:
        """The sequence number for the next message to this peer."""
        self.total += 1
        self.sent = (self.sent + 1) & 0xFFFF
        return self.sent

    def refresh(self, now: float) -> None:
        """Any sign of life: reset the silence timers."""
        self.last_seen = now
        self.next_ping = 0.0
        self.evasive = self.silent = False
