"""The link a node sends to one peer through, on gevent.

A ``PeerLink`` sends without ever blocking the hub: messages go straight to
the transport's link (a DEALER) while it has room; once that is full they
wait in a backlog that a flusher greenlet drains as the link becomes
writable again. Order and sequence numbers are kept because a message's
sequence is fixed when it is queued.

The backlog is bounded in octets (``NodeConfig.send_buffer``): each message
counts its frames' length plus ``MESSAGE_OVERHEAD`` (about what Python holds
per queued message), so many tiny messages are bounded too; and in messages
(``NodeConfig.send_queue``). ``has_room`` is False once either bound is
reached; the node then makes senders wait (see ``Node.whisper``).
"""

from __future__ import annotations

import logging
from collections import deque
from itertools import chain, islice, repeat
from typing import Any, Callable, Optional, Sequence

import gevent
import gevent.event

__all__ = ["PeerLink", "MESSAGE_OVERHEAD"]

log = logging.getLogger(__name__)

#: octets each queued message counts beyond its frames
MESSAGE_OVERHEAD = 128
_HELP = 64  # a sender moves the backlog along once per this many messages it queues


class PeerLink:
    """One transport link to one peer's mailbox, with a bounded backlog."""

    __slots__ = ("link", "limit", "max_messages", "backlog", "size", "stalled_since", "_room",
                 "_flusher", "_clock", "send_numbered")

    def __init__(self, link: Any, limit: int, max_messages: int,
                 clock: Callable[[], float]) -> None:
        self.link = link
        self.limit = limit                # octets in the backlog
        self.max_messages = max_messages  # messages in the backlog
        self.backlog: Optional[deque[Sequence[bytes]]] = None  # made on first use
        self.size = 0                     # octets in the backlog, counted as ``_cost``
        self.stalled_since: Optional[float] = None  # last progress while a backlog waits
        self._room: Optional[gevent.event.Event] = None
        self._flusher: Optional[gevent.Greenlet] = None
        self._clock = clock
        #: the link's ``numbered_sender`` (a ZeroMQ link: one C call sends a command whose
        #: header is numbered in the call), or None; only while ``backlog`` is empty, and
        #: what it cannot send now goes to ``offer``
        numbered = getattr(link, "numbered_sender", None)
        self.send_numbered: Optional[Callable[[bytes, int, Sequence[bytes]], bool]] = \
            numbered() if numbered is not None else None

    def queued(self) -> int:
        """Octets waiting in the backlog."""
        return self.size

    def has_room(self) -> bool:
        """True while the backlog is below both of its bounds."""
        backlog = self.backlog
        return not backlog or (self.size < self.limit and len(backlog) < self.max_messages)

    def offer(self, frames: Sequence[bytes]) -> None:
        """Send ``frames`` as one message now, or queue them behind the backlog.

        Callers check ``has_room`` first; the node's few control messages
        may go past the bounds. Every ``_HELP``-th message queued, the caller
        also moves what ZeroMQ has room for again, so a sender that never
        yields still feeds the link while it queues.
        """
        backlog = self.backlog
        if not backlog and self.link.try_send(frames):
            return
        if backlog is None:
            backlog = self.backlog = deque()
        backlog.append(frames)
        self.size += sum(map(len, frames)) + MESSAGE_OVERHEAD
        if self._flusher is None:
            self.stalled_since = self._clock()
            self._flusher = gevent.spawn(self._flush)
        elif not len(backlog) % _HELP:
            self._send_queued()
        if self.size >= self.limit or len(backlog) >= self.max_messages:   # (not has_room)
            self.room_event().clear()

    def offer_each(self, messages: Sequence[Sequence[bytes]]) -> int:
        """``offer`` each of ``messages`` in order while ``has_room``; how many it took.
        While there is no backlog they go straight to ZeroMQ in one call; what ZeroMQ
        has no room for joins the backlog at once."""
        count = len(messages)
        done = 0 if self.backlog else self.link.try_send_each(messages)
        if done == count or not self.has_room():
            return done
        backlog = self.backlog
        if backlog is None:
            backlog = self.backlog = deque()
        first, size, limit = done, self.size, self.limit
        room = self.max_messages - len(backlog)
        while done < count and room > 0 and size < limit:
            size += sum(map(len, messages[done])) + MESSAGE_OVERHEAD
            done += 1
            room -= 1
        backlog.extend(islice(messages, first, done))
        self.size = size
        if self._flusher is None:
            self.stalled_since = self._clock()
            self._flusher = gevent.spawn(self._flush)
        else:
            self._send_queued()
        if not self.has_room():
            self.room_event().clear()
        return done

    def room_event(self) -> gevent.event.Event:
        """Set whenever the backlog has drained to half its bounds (or the link closed)."""
        if self._room is None:
            self._room = gevent.event.Event()
            self._room.set()
        return self._room

    def _send_queued(self) -> None:
        """Send from the backlog while ZeroMQ takes messages; never blocks."""
        backlog = self.backlog
        assert backlog is not None
        sent = self.link.try_send_each(backlog)
        if sent:
            # the octets of the messages that went, counted over their frames in one pass
            # (no Python step per message), then the messages dropped from the backlog
            self.size -= sum(map(len, chain.from_iterable(islice(backlog, sent)))) \
                + sent * MESSAGE_OVERHEAD
            popleft = backlog.popleft
            for _ in repeat(None, sent):
                popleft()
            self.stalled_since = self._clock()
            if (self._room is not None and self.size <= self.limit // 2
                    and len(backlog) <= self.max_messages // 2):
                self._room.set()

    def _flush(self) -> None:
        backlog = self.backlog
        assert backlog is not None
        try:
            while backlog:
                self.link.wait_writable(0.5)
                self._send_queued()
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
        self.size = 0
        if self._room is not None:
            self._room.set()
        self.link.close(linger)
