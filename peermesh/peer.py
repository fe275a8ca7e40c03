"""What a node knows about one peer, and the DEALER link it sends through.

A ``PeerLink`` sends without ever blocking the hub: messages go straight to
the DEALER while it has room; once ZeroMQ's queue is full (``zmq.Again``)
they wait in a bounded backlog that a flusher greenlet drains as the socket
becomes writable again. Order and sequence numbers are kept because a
message's sequence is fixed when it is queued.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Optional, Sequence
from uuid import UUID

import gevent
import gevent.event
import zmq

from .green import SocketWaiter

__all__ = ["Peer", "PeerLink"]

log = logging.getLogger(__name__)

_NOBLOCK = zmq.NOBLOCK
_MORE = zmq.NOBLOCK | zmq.SNDMORE


class PeerLink:
    """One DEALER connected to one peer's mailbox, with a bounded backlog."""

    def __init__(self, context: zmq.Context, identity: bytes, endpoint: str, sndhwm: int,
                 limit: int, clock: Callable[[], float]) -> None:
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, identity)
        socket.setsockopt(zmq.SNDHWM, sndhwm)
        socket.setsockopt(zmq.SNDTIMEO, 0)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        socket.connect(endpoint)
        self.socket = socket
        self.limit = limit
        self.backlog: deque[Sequence[bytes]] = deque()
        self.stalled_since: Optional[float] = None
        self._send = socket.send
        self._room = gevent.event.Event()
        self._room.set()
        self._flusher: Optional[gevent.Greenlet] = None
        self._clock = clock

    def has_room(self) -> bool:
        """True while the backlog is below its limit."""
        return len(self.backlog) < self.limit

    def offer(self, frames: Sequence[bytes]) -> None:
        """Send ``frames`` as one message now, or queue them behind the backlog.

        Callers check ``has_room`` first; the node's few control messages
        may go past the limit.
        """
        backlog = self.backlog
        if not backlog:
            send = self._send
            last = len(frames) - 1
            try:
                send(frames[0], _MORE if last else _NOBLOCK)
            except zmq.Again:
                pass
            else:
                # Once the first frame is taken ZeroMQ takes the whole message.
                for i in range(1, last):
                    send(frames[i], _MORE)
                if last:
                    send(frames[last], _NOBLOCK)
                return
        backlog.append(frames)
        if len(backlog) >= self.limit:
            self._room.clear()
        if self._flusher is None:
            self.stalled_since = self._clock()
            self._flusher = gevent.spawn(self._flush)

    def wait_room(self, timeout: float) -> bool:
        """Wait until the backlog has room again; False after ``timeout`` seconds."""
        return self._room.wait(timeout) and self.has_room()

    def _flush(self) -> None:
        waiter = SocketWaiter(self.socket)
        backlog = self.backlog
        try:
            while backlog:
                waiter.wait(zmq.POLLOUT)
                while backlog:
                    frames = backlog[0]
                    try:
                        self._send(frames[0], _MORE if len(frames) > 1 else _NOBLOCK)
                    except zmq.Again:
                        break
                    for i in range(1, len(frames)):
                        self._send(frames[i], _MORE if i < len(frames) - 1 else _NOBLOCK)
                    backlog.popleft()
                    self.stalled_since = self._clock()
                    if len(backlog) <= self.limit // 2:
                        self._room.set()
        except zmq.ZMQError as exc:  # socket closed under us: the peer is gone
            log.debug("flusher stopped: %s", exc)
        finally:
            waiter.close()
            self._flusher = None
            self.stalled_since = None
            self._room.set()

    def close(self, linger: float = 0) -> None:
        """Drop the backlog and close the socket; ZeroMQ may flush for ``linger`` seconds."""
        if self._flusher is not None:
            self._flusher.kill(block=False)
        self.backlog.clear()
        self._room.set()
        self.socket.close(linger=int(linger * 1000))


class Peer:
    """A remote node: identity, HELLO data, groups, sequence and liveness state."""

    __slots__ = ("uuid", "uuid_bytes", "identity", "endpoint", "link", "ready", "name",
                 "headers", "groups", "status", "want", "sent", "last_seen", "next_ping",
                 "evasive", "silent", "unconfirmed", "pong")

    def __init__(self, uuid_bytes: bytes, endpoint: str, link: PeerLink, now: float) -> None:
        self.uuid = UUID(bytes=uuid_bytes)
        self.uuid_bytes = uuid_bytes
        self.identity = b"\x01" + uuid_bytes
        self.endpoint = endpoint
        self.link = link
        self.ready = False          # HELLO received
        self.name = ""
        self.headers: dict[str, str] = {}
        self.groups: set[str] = set()
        self.status = 0             # peer's group status (mod 256)
        self.want = 1               # next sequence expected from the peer
        self.sent = 0               # last sequence sent to the peer
        self.last_seen = now
        self.next_ping = 0.0
        self.evasive = False        # EVASIVE reported for this silence
        self.silent = False         # SILENT reported for this silence
        self.unconfirmed = False    # application messages sent since the last PING-OK
        self.pong: Optional[gevent.event.Event] = None  # set when a PING-OK arrives

    def next_sequence(self) -> int:
        """The sequence number for the next message to this peer."""
        self.sent = (self.sent + 1) & 0xFFFF
        return self.sent

    def refresh(self, now: float) -> None:
        """Any sign of life: reset the silence timers."""
        self.last_seen = now
        self.next_ping = 0.0
        self.evasive = self.silent = False
