"""Plain pyzmq sockets driven on the gevent hub, for sockets that both send and receive.

How it works
------------
A ``Channel`` owns one plain (not ``zmq.green``) socket and one reader
greenlet. The reader drains every message that is ready with ``NOBLOCK``
(``recv(copy=False)`` + ``Frame.more``), hands each to ``handler(frames)``
and only then waits on the socket's ``zmq.FD`` through the hub.

That descriptor is edge-triggered, and a ``send`` from another greenlet may
consume the edge that announced an incoming message (libzmq processes its
command pipe during send). So ``send`` checks ``EVENTS`` afterwards and wakes
the reader itself when something is waiting; the wait is also bounded, as a
guard. Messages are sent frame by frame with ``SNDMORE`` (cheaper than
``send_multipart``) and never block the hub: a full queue waits cooperatively
up to ``send_timeout`` and then drops the message (logged).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional, Sequence

import gevent
import gevent.event
import zmq

__all__ = ["Channel", "bind_ephemeral"]

log = logging.getLogger(__name__)

_GUARD = 0.5   # seconds a reader trusts the edge-triggered FD alone
_BATCH = 256   # messages handled before the reader yields to other greenlets
_NOBLOCK = zmq.NOBLOCK
_MORE = zmq.SNDMORE | zmq.NOBLOCK
_POLLIN = zmq.POLLIN


def _events(getsockopt: Callable[[int], object]) -> int:
    return int(getsockopt(zmq.EVENTS))  # type: ignore[call-overload]


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
        self._ready = gevent.event.Event()
        self._watcher = self._hub.loop.io(sock.getsockopt(zmq.FD), 1)
        self._reader: Optional[gevent.Greenlet] = gevent.spawn(self._read)
        self.closed = False

    # --- receiving ------------------------------------------------------

    def _read(self) -> None:
        sock = self.socket
        recv = sock.recv
        getsockopt = sock.getsockopt
        handler = self._handler
        ready = self._ready
        watcher = self._watcher
        handled = 0
        while True:
            try:
                frame = recv(_NOBLOCK, copy=False)
            except zmq.Again:
                handled = 0
                ready.clear()
                if _events(getsockopt) & _POLLIN:
                    continue
                watcher.start(ready.set)
                try:
                    ready.wait(_GUARD)
                finally:
                    watcher.stop()
                continue
            except zmq.ZMQError as exc:
                if self.closed or exc.errno == zmq.ENOTSOCK:
                    return
                raise
            frames = [frame.bytes]
            while frame.more:
                frame = recv(_NOBLOCK, copy=False)
                frames.append(frame.bytes)
            try:
                handler(frames)
            except gevent.GreenletExit:
                raise
            except Exception:  # one bad message must not stop the channel
                log.exception("%s: handler failed on a message of %d frames", self.name,
                              len(frames))
            handled += 1
            if handled >= _BATCH:
                handled = 0
                gevent.sleep(0)

    def wake(self) -> None:
        """Let the reader look again (after a send that may have eaten the FD edge)."""
        if not self._ready.is_set() and _events(self.socket.getsockopt) & _POLLIN:
            self._ready.set()

    # --- sending --------------------------------------------------------

    def send(self, frames: Sequence[bytes]) -> bool:
        """Send one multipart message; False if it could not be queued in time (dropped)."""
        if self.closed:
            return False
        sock = self.socket
        send = sock.send
        last = len(frames) - 1
        try:
            send(frames[0], _MORE if last else _NOBLOCK)
        except zmq.Again:
            if not self._wait_writable():
                log.warning("%s: send queue full for %.1fs; message dropped", self.name,
                            self.send_timeout)
                return False
            try:
                send(frames[0], _MORE if last else _NOBLOCK)
            except zmq.Again:
                return False
        except zmq.ZMQError as exc:
            log.debug("%s: send failed: %s", self.name, exc)
            return False
        for i in range(1, last + 1):
            send(frames[i], _MORE if i < last else _NOBLOCK)
        if not self._ready.is_set() and _events(sock.getsockopt) & _POLLIN:
            self._ready.set()
        return True

    def _wait_writable(self) -> bool:
        deadline = self._hub.loop.now() + self.send_timeout
        delay = 0.0005
        while not _events(self.socket.getsockopt) & zmq.POLLOUT:
            if self._hub.loop.now() >= deadline or self.closed:
                return False
            gevent.sleep(delay)
            delay = min(delay * 2, 0.05)
        return True

    # --- closing --------------------------------------------------------

    def close(self, linger: float = 0.0) -> None:
        """Stop the reader and close the socket."""
        if self.closed:
            return
        self.closed = True
        reader, self._reader = self._reader, None
        if reader is not None and reader is not gevent.getcurrent():
            reader.kill(block=False)
        self._watcher.stop()
        self._watcher.close()
        self.socket.close(linger=int(linger * 1000))
