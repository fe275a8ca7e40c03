"""NFP's sockets: ``nfp_socket`` (the bound on message size, CURVE), ``guarded`` (a ROUTER
under the connection policy), and ``CorkedSocket``.

The NFP overlays read and send only through the one driver
(``peermesh.io.driver``); ``CorkedSocket`` stays for the benchmarks' floor
(``scripts/harness.py``), which measures the same message pattern without NFP.

How it works
------------
A ``CorkedSocket`` owns one socket, driven by the I/O layer's ``HubSocket``
(batched reads, whole-message sends, the edge re-armed after a send, the
guard timer), and one reader greenlet. The reader takes every message that
is ready, hands each to ``handler(frames)`` and only then waits for more.
Handlers run in that greenlet, so they may wait (unlike ``HubSocket.serve``,
whose handlers run on the hub).

Sends made by a handler, in the reader greenlet, are held (**corked**) until
the reader has handled its batch, then sent back to back: a broker that
receives a worker's RESPONSE and EVENT in one batch forwards both together,
which costs the ZeroMQ I/O thread (and the peer) one wake-up instead of two.
A send from any other greenlet first sends what is held, so the order of
messages on a channel is always the order of ``send`` calls. Sends never
block the hub: a full queue waits cooperatively up to ``send_timeout`` and
then drops the message (logged). A held message is reported sent (True); if
it is dropped at the flush, that is logged too and the requester's timeout
answers for it. A send from a hub callback (where nothing may wait) that
finds the queue full is handed, with every later message, to a greenlet
that waits for room.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable, Optional, Sequence

import gevent
import zmq

from ..counters import Counters
from ..io import HubSocket, make_socket
from ..io.connections import GuardedListener
from ..io.curve import Curve
from ..io.zap import Allowlist
from ..wire.nfp import MAX_MESSAGE

__all__ = ["CorkedSocket", "nfp_socket", "guarded"]

log = logging.getLogger(__name__)


def nfp_socket(context: Optional[zmq.Context], kind: int, curve: Optional[Curve] = None
               ) -> zmq.Socket:
    """A socket for NFP: no linger, and a peer sending over ``MAX_MESSAGE`` is cut off;
    with ``curve`` (the node's keys) a CURVE server admitting the node's allowed keys."""
    return make_socket(kind, {zmq.MAXMSGSIZE: MAX_MESSAGE}, context, curve=curve)


def guarded(sock: zmq.Socket, endpoint: str, counters: Counters, allowlist: Optional[Allowlist],
            on_revoked: Callable[[frozenset[str]], None]) -> GuardedListener:
    """A bound NFP ROUTER under the process's connection policy: with ``allowlist`` (the
    node's), the connections of keys it drops are closed and ``on_revoked(keys)`` called."""
    return GuardedListener(HubSocket(sock, endpoint=endpoint, limit=MAX_MESSAGE), counters,
                           allowlist=allowlist, on_revoked=on_revoked)


class CorkedSocket:
    """One socket, a reader greenlet calling ``handler(frames)``, and a non-blocking send."""

    def __init__(self, sock: zmq.Socket, handler: Callable[[list[bytes]], None],
                 name: str = "channel", send_timeout: float = 5.0, keyed: bool = False,
                 listener: Optional[GuardedListener] = None) -> None:
        self.socket = sock
        self.name = name
        self.send_timeout = send_timeout
        self._handler = handler
        #: ``keyed`` (a CURVE socket): the key (Z85) the message being handled was sent with
        self.sender_key: Optional[str] = None
        self._keyed = keyed
        #: a bound ROUTER's guard (``peermesh.io.connections``), stopped with the socket
        self.listener = listener
        self._io = listener.listener if listener is not None else HubSocket(sock, limit=MAX_MESSAGE)
        self._hub = gevent.get_hub()
        self._corked = False
        self._outbox: list[Sequence[bytes]] = []
        self._backlog: deque[Sequence[bytes]] = deque()   # refused while on the hub
        self._backlog_sender: Optional[gevent.Greenlet] = None
        self.closed = False
        self._reader: Optional[gevent.Greenlet] = gevent.spawn(self._read)

    # --- receiving ------------------------------------------------------

    def _read(self) -> None:
        self._io.read(self._on_batch, "User-Id" if self._keyed else None)

    def _on_batch(self, batch: list) -> None:
        dispatch, keyed = self._dispatch, self._keyed
        self._corked = True
        try:
            for item in batch:
                if self.closed:     # a handler closed the channel
                    return
                if keyed:
                    first, frames, self.sender_key = item
                else:
                    first, frames = item
                if frames is None:
                    log.warning("%s: a message over %d bytes dropped", self.name, MAX_MESSAGE)
                    continue
                frames.insert(0, first)
                dispatch(frames)
        finally:
            self._corked = False
        if self._outbox and not self.closed:
            self._flush()

    def _dispatch(self, frames: list[bytes]) -> None:
        try:
            self._handler(frames)
        except gevent.GreenletExit:
            raise
        except Exception:  # one bad message must not stop the channel
            log.exception("%s: handler failed on a message of %d frames", self.name,
                          len(frames))

    def readable(self) -> bool:
        """True if a message waits to be read (the reader has not got to it yet)."""
        return not self.closed and self._io.readable()

    # --- sending --------------------------------------------------------

    def send(self, frames: Sequence[bytes]) -> bool:
        """Send one multipart message; False if it could not be queued in time (dropped)."""
        if self.closed:
            return False
        if self._corked and gevent.getcurrent() is self._reader:
            self._outbox.append(frames)      # the reader sends it once the batch is done
            return True
        if self._backlog:
            self._backlog.append(frames)     # behind what waits for room
            return True
        if self._outbox:
            self._flush()
        return self._send_now(frames)

    def _flush(self) -> None:
        outbox = self._outbox          # cleared in place: the reader holds a reference
        held = outbox[:]
        outbox.clear()
        if self._backlog:
            self._backlog.extend(held)
            return
        for frames in held:
            if not self._send_now(frames) and not self.closed:
                log.warning("%s: a held message could not be sent; dropped", self.name)

    def _send_now(self, frames: Sequence[bytes]) -> bool:
        if self.closed:
            return False
        try:
            if self._io.try_send(frames):
                return True
            full = self._when_full(frames)
            if full is not None:
                return full
            return not self.closed and self._io.try_send(frames)
        except zmq.ZMQError as exc:
            log.debug("%s: send failed: %s", self.name, exc)
            return False

    def _when_full(self, frames: Sequence[bytes]) -> Optional[bool]:
        """The send queue is full: None once there is room (send again), else what the
        send reports - True if a hub callback (which cannot wait) handed ``frames`` to the
        backlog greenlet, False if no room came within ``send_timeout`` (dropped, logged)."""
        if gevent.getcurrent() is self._hub:
            self._backlog.append(frames)
            if self._backlog_sender is None:
                self._backlog_sender = gevent.spawn(self._send_backlog)
            return True
        if not self._io.wait_writable(self.send_timeout):
            if not self.closed:
                log.warning("%s: send queue full for %.1fs; message dropped", self.name,
                            self.send_timeout)
            return False
        return None

    def _send_backlog(self) -> None:
        backlog = self._backlog
        try:
            while backlog and not self.closed:
                if not self._send_now(backlog[0]):
                    log.warning("%s: a message waiting for room was dropped", self.name)
                backlog.popleft()
        finally:
            self._backlog_sender = None

    # --- closing --------------------------------------------------------

    def close(self, linger: float = 0.0) -> None:
        """Send what is held, stop the reader and close the socket."""
        if self.closed:
            return
        if self._outbox:
            try:
                self._flush()
            except zmq.ZMQError:
                pass
        self.closed = True
        reader, self._reader = self._reader, None
        for greenlet in (reader, self._backlog_sender):
            if greenlet is not None and greenlet is not gevent.getcurrent():
                greenlet.kill(block=False)
        self._backlog.clear()
        if self.listener is not None:
            self.listener.stop()  # (its monitor before the socket)
        self._io.close(linger)

    def __repr__(self) -> str:
        return f"<CorkedSocket {self.name}{' closed' if self.closed else ''}>"
