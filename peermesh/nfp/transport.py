"""Plain pyzmq sockets driven on the gevent hub, for sockets that both send and receive.

How it works
------------
A ``Channel`` owns one plain (not ``zmq.green``) socket and one reader
greenlet. The reader drains every message that is ready, hands each to
``handler(frames)`` and only then waits on the socket's ``zmq.FD`` through
the hub. With the C extension (``peermesh.io.zmqbatch.native``) a batch of
messages is read in one call, a message's frames are sent in one call and
``EVENTS`` is asked in one call; without it (not built, or
``PEERMESH_PURE_PYTHON=1``) pyzmq does the same frame by frame (``EVENTS``
says POLLIN, then ``recv(NOBLOCK, copy=False)`` + ``Frame.more``; a
``send(frame, SNDMORE)`` loop). Either way the wait uses
one io watcher and one guard timer, made once and reused, which switch
straight back to the reader (no ``Event``, no ``Timeout``, no ``Again``
exception per message).

That descriptor is edge-triggered, and a ``send`` from another greenlet may
consume the edge that announced an incoming message (libzmq processes its
command pipe during send). So ``send`` checks ``EVENTS`` afterwards and wakes
the reader itself when something is waiting; the wait is also bounded, as a
guard. A batch read that finds the socket empty re-arms the edge, so the C
reader waits right after such a batch unless the socket was used since (a
send, or an ``EVENTS`` query, may have consumed the edge): then it looks
again first.

Sends made by a handler, in the reader greenlet, are held (**corked**) until
the reader has drained what is ready, then sent back to back: a broker that
receives a worker's RESPONSE and EVENT in one batch forwards both together,
which costs the ZeroMQ I/O thread (and the peer) one wake-up instead of two.
A send from any other greenlet first sends what is held, so the order of
messages on a channel is always the order of ``send`` calls. Sends never
block the hub: a full queue waits cooperatively up to ``send_timeout`` and
then drops the message (logged). A held message is reported sent (True); if it
is dropped at the flush, that is logged too and the requester's timeout
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
from zmq.backend import Socket as _BaseSocket

from ..io import zmqbatch
from ..wire.nfp import MAX_MESSAGE

__all__ = ["Channel", "bind_ephemeral", "nfp_socket"]

log = logging.getLogger(__name__)

_GUARD = 0.5   # seconds a reader trusts the edge-triggered FD alone
_BATCH = 256   # messages handled before the reader yields to other greenlets
_LIMIT = MAX_MESSAGE        # bytes of one message the native reader accepts (MAXMSGSIZE)
# plain ints: zmq's flag enums make every ``&`` a Python-level call
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE) | _NOBLOCK
_POLLIN = int(zmq.POLLIN)
_POLLOUT = int(zmq.POLLOUT)
_EVENTS = int(zmq.EVENTS)
_send = _BaseSocket.send
_get: Callable[[zmq.Socket, int], int] = _BaseSocket.get  # type: ignore[assignment]


def nfp_socket(context: zmq.Context, kind: int) -> zmq.Socket:
    """A socket for NFP: no linger, and a peer sending over ``MAX_MESSAGE`` is cut off."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
    return sock


def bind_ephemeral(sock: zmq.Socket, address: str) -> str:
    """Bind ``sock`` to a free TCP port on ``address``; the endpoint actually bound."""
    sock.bind(f"tcp://{address}:*")
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
    return endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)


class Channel:
    """One socket, a reader greenlet calling ``handler(frames)``, and a non-blocking send."""

    def __init__(self, sock: zmq.Socket, handler: Callable[[list[bytes]], None],
                 name: str = "channel", send_timeout: float = 5.0) -> None:
        self.socket = sock
        self.name = name
        self.send_timeout = send_timeout
        self._handler = handler
        self._hub = gevent.get_hub()
        loop = self._hub.loop
        self._watcher = loop.io(sock.getsockopt(zmq.FD), 1)
        self._guard = loop.timer(_GUARD, _GUARD)   # restarted with again(): see _park
        self._waiting = False
        self._corked = False
        self._used = False     # the socket was sent on or asked for EVENTS (see _read_batches)
        self._outbox: list[Sequence[bytes]] = []
        self._backlog: deque[Sequence[bytes]] = deque()   # refused while on the hub
        self._backlog_sender: Optional[gevent.Greenlet] = None
        self.closed = False
        native = zmqbatch.native
        self._native_send: Optional[Callable[[int, Sequence[bytes]], bool]] = \
            native.send if native is not None else None
        self._handle: int = sock.underlying if native is not None else 0
        self._reader: Optional[gevent.Greenlet] = gevent.spawn(
            self._read if native is None else self._read_batches)

    # --- receiving ------------------------------------------------------

    def _read(self) -> None:
        sock = self.socket
        recv = sock.recv
        outbox = self._outbox
        handled = 0
        while True:
            try:
                ready = _get(sock, _EVENTS) & _POLLIN
            except zmq.ZMQError as exc:
                if self.closed or exc.errno == zmq.ENOTSOCK:
                    return
                raise
            if ready:
                frame = recv(_NOBLOCK, copy=False)
                frames = [frame.bytes]
                while frame.more:
                    frame = recv(_NOBLOCK, copy=False)
                    frames.append(frame.bytes)
                self._corked = True
                try:
                    self._dispatch(frames)
                finally:
                    self._corked = False
                handled += 1
                if handled < _BATCH:
                    continue
                handled = 0
                if outbox:
                    self._flush()
                gevent.sleep(0)
                continue
            handled = 0
            if outbox:
                self._flush()
                continue   # sending may have eaten the edge: look again before waiting
            self._park()

    def _read_batches(self) -> None:
        """``_read`` with the C extension: every waiting message in one call."""
        recv_batch = zmqbatch.native.recv_batch   # type: ignore[union-attr]
        handle = self._handle
        dispatch = self._dispatch
        outbox = self._outbox
        while not self.closed:
            self._used = False
            try:
                batch = recv_batch(handle, _BATCH, _LIMIT)
            except zmq.ZMQError as exc:
                if self.closed or exc.errno == zmq.ENOTSOCK:
                    return
                raise
            if batch:
                self._corked = True
                try:
                    for first, frames in batch:
                        if self.closed:     # a handler closed the channel
                            return
                        if frames is None:
                            log.warning("%s: a message over %d bytes dropped", self.name,
                                        _LIMIT)
                            continue
                        frames.insert(0, first)
                        dispatch(frames)
                finally:
                    self._corked = False
                if outbox and not self.closed:
                    self._flush()
                if len(batch) == _BATCH:
                    gevent.sleep(0)
                    continue
                if self._used:
                    continue   # the socket was used since it was found empty: look again
            # a short batch found the socket empty, which re-armed the edge the wait is for
            if self.closed:
                return
            self._park()

    def _park(self) -> None:
        """Wait on the hub for the descriptor's edge, a ``wake`` or the guard timer."""
        self._waiting = True
        self._watcher.start(self._wake)
        self._guard.again(self._wake)  # (a stopped one-shot timer started again fires at once)
        try:
            self._hub.switch()
        finally:
            self._waiting = False
            self._watcher.stop()
            self._guard.stop()

    def _dispatch(self, frames: list[bytes]) -> None:
        try:
            self._handler(frames)
        except gevent.GreenletExit:
            raise
        except Exception:  # one bad message must not stop the channel
            log.exception("%s: handler failed on a message of %d frames", self.name,
                          len(frames))

    def _events(self) -> int:
        """The socket's ZMQ_EVENTS (through the C extension: no option enum per call);
        ENOTSOCK, as pyzmq says it, once the socket is closed (also behind the channel's
        back, e.g. by ``Context.destroy``): the extension never sees a freed handle."""
        if not self._handle:
            return _get(self.socket, _EVENTS)
        if self.socket.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        return zmqbatch.native.events(self._handle)  # type: ignore[union-attr,no-any-return]

    def _wake(self) -> None:
        # on the hub (a watcher or a callback): let the waiting reader look again
        if self._waiting and self._reader is not None:
            self._waiting = False
            self._reader.switch()

    def wake(self) -> None:
        """Let the reader look again (after a send that may have eaten the FD edge)."""
        if self._waiting and self._events() & _POLLIN:
            self._hub.loop.run_callback(self._wake)

    def readable(self) -> bool:
        """True if a message waits to be read (the reader has not got to it yet)."""
        if self.closed:
            return False
        self._used = True
        try:
            ready = self._events() & _POLLIN
        except zmq.ZMQError:
            return False
        if ready and self._waiting:     # asking may have eaten the edge the reader waits for
            self._hub.loop.run_callback(self._wake)
        return bool(ready)

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
        self._used = True
        native_send = self._native_send
        if native_send is not None:
            return self._send_native(native_send, frames)
        sock = self.socket
        last = len(frames) - 1
        try:
            _send(sock, frames[0], _MORE if last else _NOBLOCK)
        except zmq.Again:
            full = self._when_full(frames)
            if full is not None:
                return full
            try:
                _send(sock, frames[0], _MORE if last else _NOBLOCK)
            except zmq.Again:
                return False
        except zmq.ZMQError as exc:
            log.debug("%s: send failed: %s", self.name, exc)
            return False
        for i in range(1, last):
            _send(sock, frames[i], _MORE)
        if last:
            _send(sock, frames[last], _NOBLOCK)
        self.wake()
        return True

    def _send_native(self, native_send: Callable[[int, Sequence[bytes]], bool],
                     frames: Sequence[bytes]) -> bool:
        """``_send_now`` with the C extension: the whole message in one call."""
        if self.closed:
            return False
        try:
            if not native_send(self._handle, frames):
                full = self._when_full(frames)
                if full is not None:
                    return full
                if self.closed or not native_send(self._handle, frames):
                    return False
        except zmq.ZMQError as exc:
            log.debug("%s: send failed: %s", self.name, exc)
            return False
        self.wake()
        return True

    def _when_full(self, frames: Sequence[bytes]) -> Optional[bool]:
        """The send queue is full: None once there is room (send again), else what the
        send reports - True if a hub callback (which cannot wait) handed ``frames`` to the
        backlog greenlet, False if no room came within ``send_timeout`` (dropped, logged)."""
        if gevent.getcurrent() is self._hub:
            self._backlog.append(frames)
            if self._backlog_sender is None:
                self._backlog_sender = gevent.spawn(self._send_backlog)
            return True
        if not self._wait_writable():
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

    def _wait_writable(self) -> bool:
        self._used = True
        deadline = self._hub.loop.now() + self.send_timeout
        delay = 0.0005
        while not self._events() & _POLLOUT:
            if self._hub.loop.now() >= deadline or self.closed:
                return False
            gevent.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

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
        self._waiting = False
        for greenlet in (reader, self._backlog_sender):
            if greenlet is not None and greenlet is not gevent.getcurrent():
                greenlet.kill(block=False)
        self._backlog.clear()
        self._watcher.stop()
        self._watcher.close()
        self._guard.stop()
        self._guard.close()
        self.socket.close(linger=int(linger * 1000))

    def __repr__(self) -> str:
        return f"<Channel {self.name}{' closed' if self.closed else ''}>"
