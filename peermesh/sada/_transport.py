"""ROUTER plumbing shared by channels and servers.

Sockets are plain pyzmq sockets driven on the gevent hub the way the node's
mailbox is (see ``peermesh.io.transport``): drained with ``NOBLOCK`` and
``recv(copy=False)`` + ``Frame.more`` from the descriptor's watcher, on the
hub itself; sends go one frame at a time with ``SNDMORE`` (several times
cheaper than ``send_multipart``), and the two commands every request
crosses, REQ and REP, have their own unrolled senders. Unlike the node's
mailbox, these ROUTERs are also written to, which needs care (see
``RouterSocket``). Monitor sockets report connects and disconnects.
"""

from __future__ import annotations

import logging
import random
import struct
import time
from functools import partial
from typing import Any, Callable, Optional, Sequence

import gevent
import gevent.event
import zmq

from ..io.waiter import SocketWaiter
from ..wire.sada import DELIMITER, PROTOCOL, Command

log = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)
_POLLIN = int(zmq.POLLIN)
_zmq_poll = zmq.zmq_poll
_REQ, _REP = Command.REQ.frame, Command.REP.frame
_MONITOR_EVENT = struct.Struct("=HI")  # (zmq.utils.monitor would import asyncio)
_BackendSocket: Any = zmq.Socket.__mro__[1]  # the Cython socket under pyzmq's Python layer
_BATCH = 256  # messages handled before the reader lets other greenlets run
_GUARD = 1.0  # seconds between guard looks at a socket, in case a wake-up was missed

#: (routing id, frames after it, the last zmq.Frame for metadata such as Peer-Address)
MessageHandler = Callable[[bytes, list, zmq.Frame], None]


class RouterSocket:
    """A plain ROUTER read on the hub and written by any greenlet of its hub.

    Messages are drained on the hub itself, from the descriptor's watcher
    callback (as the node's mailbox does): no greenlet switch per wake-up.
    ``on_message`` therefore runs on the hub and must not block.

    ZeroMQ's descriptor only signals that the socket's command queue changed,
    and any call on the socket (a ``send`` too) may take those commands in:
    a reply that arrives while another greenlet sends can be taken in by that
    ``send`` without the descriptor ever waking the hub (pyzmq issue 319). So
    a ``send`` made outside the drain checks the socket and schedules a drain
    when a message is ready (``poll`` does the same for other callers), and
    a slow guard timer looks once a second all the same. Whether a message
    waits is asked with ``zmq_poll`` and no wait, which takes the socket's
    commands in as reading ``EVENTS`` does at half its cost in pyzmq (and far
    less than a ``zmq.Again`` exception); the Cython methods are called
    without pyzmq's Python wrappers.
    """

    __slots__ = ("sock", "_loop", "_io", "_guard", "_draining", "_scheduled", "_send",
                 "_recv", "_readable", "_on_message", "_max_frames", "_on_oversized")

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self._loop = gevent.get_hub().loop
        self._io = self._loop.io(sock.getsockopt(zmq.FD), 1)
        self._guard = self._loop.timer(_GUARD, _GUARD)
        self._draining = False
        self._scheduled = False
        self._send = _BackendSocket.send.__get__(sock)
        self._recv = _BackendSocket.recv.__get__(sock)
        # zmq_poll with no wait: non-empty when a message waits; like reading EVENTS it
        # takes the socket's commands in (re-arming the descriptor), at half the cost
        self._readable = partial(_zmq_poll, [(sock, _POLLIN)], 0)
        self._on_message: Optional[MessageHandler] = None
        self._max_frames = 0
        self._on_oversized: Optional[Callable[[bytes], None]] = None

    def send(self, identity: bytes, frames: Sequence[bytes]) -> None:
        """Send ``identity`` + ``frames`` as one message without blocking.

        With ROUTER_MANDATORY, an unknown identity raises ``zmq.ZMQError``
        (EHOSTUNREACH) and a full pipe ``zmq.Again``, both on the first frame,
        so nothing half-sent stays behind.
        """
        send_frame = self._send
        send_frame(identity, _MORE)
        last = len(frames) - 1
        for i in range(last):
            send_frame(frames[i], _MORE)
        send_frame(frames[last], _NOBLOCK)
        if not self._draining:
            self.poll()

    def send_req(self, identity: bytes, request_id: bytes, service: bytes, version: bytes,
                 category: bytes, action: bytes, payload: bytes) -> None:
        """Send a REQ (frames 1-9 after ``identity``); raises as ``send`` does."""
        send_frame = self._send
        send_frame(identity, _MORE)   # the only frame that may fail
        send_frame(DELIMITER, _MORE)
        send_frame(PROTOCOL, _MORE)
        send_frame(_REQ, _MORE)
        send_frame(request_id, _MORE)
        send_frame(service, _MORE)
        send_frame(version, _MORE)
        send_frame(category, _MORE)
        send_frame(action, _MORE)
        send_frame(payload, _NOBLOCK)
        if not self._draining:
            self.poll()

    def send_rep(self, identity: bytes, request_id: bytes, status: bytes, payload: bytes) -> None:
        """Send a REP (frames 1-6 after ``identity``); raises as ``send`` does."""
        send_frame = self._send
        send_frame(identity, _MORE)
        send_frame(DELIMITER, _MORE)
        send_frame(PROTOCOL, _MORE)
        send_frame(_REP, _MORE)
        send_frame(request_id, _MORE)
        send_frame(status, _MORE)
        send_frame(payload, _NOBLOCK)
        if not self._draining:
            self.poll()

    def poll(self) -> bool:
        """True when a message waits; then a drain is scheduled (use instead of EVENTS)."""
        if self._readable():
            if not self._scheduled and self._on_message is not None:
                self._scheduled = True
                self._loop.run_callback(self._drain)
            return True
        return False

    def _drain(self) -> None:
        self._scheduled = False
        if self._draining or self._on_message is None:
            return
        if self._drain_batch():
            # more may wait: let other greenlets run first
            self._scheduled = True
            self._loop.run_callback(self._drain)

    def drain_pending(self, batches: int = 16) -> None:
        """Handle what is readable now (up to ``batches`` batches), here and at once.

        For decisions that must not overlook answers already received, such as
        declaring a peer dead. Does nothing when called from ``on_message``.
        """
        for _ in range(batches):
            if self._draining or self._on_message is None or not self._drain_batch():
                return

    def _drain_batch(self) -> bool:
        """Read up to one batch; True when the batch was full (more may wait)."""
        self._draining = True
        recv = self._recv
        readable = self._readable
        on_message = self._on_message
        max_frames = self._max_frames
        assert on_message is not None
        try:
            for i in range(_BATCH):
                # The first read goes ahead unasked: a wake-up nearly always means a
                # message (an empty socket costs a zmq.Again then, and is re-armed too).
                if i and not readable():
                    return False  # empty, and the descriptor is re-armed
                try:
                    frame = recv(_NOBLOCK, False)
                except zmq.Again:
                    return False
                identity = frame.bytes
                frames: list[bytes] = []
                append = frames.append
                while frame.more:
                    frame = recv(_NOBLOCK, False)
                    append(frame.bytes)
                    if len(frames) > max_frames:
                        self._discard(identity, frame)
                        break
                else:
                    try:
                        on_message(identity, frames, frame)
                    except Exception:
                        log.exception("failed to handle a message from %r", identity)
            return True
        except zmq.ZMQError as exc:  # the socket was closed under us
            log.debug("reading stopped: %s", exc)
            return False
        finally:
            self._draining = False

    def _discard(self, identity: bytes, frame: zmq.Frame) -> None:
        """Read the rest of an oversized message and drop it."""
        count = self._max_frames + 1
        while frame.more:
            frame = self._recv(_NOBLOCK, False)
            count += 1
        log.debug("dropped a message of %d frames from %r", count, identity)
        if self._on_oversized is not None:
            try:
                self._on_oversized(identity)
            except Exception:
                log.exception("failed to handle an oversized message from %r", identity)

    def serve(self, on_message: MessageHandler, max_frames: int,
              on_oversized: Optional[Callable[[bytes], None]] = None) -> None:
        """Call ``on_message`` (on the hub) for every message until killed.

        A message with more than ``max_frames`` frames after the identity is
        read to its end and dropped (``on_oversized``). Exceptions from
        ``on_message`` are logged, never fatal.
        """
        self._on_message = on_message
        self._max_frames = max_frames
        self._on_oversized = on_oversized
        self._io.start(self._drain)
        self._guard.start(self.poll)
        self._scheduled = True
        self._loop.run_callback(self._drain)  # messages may already be queued
        try:
            gevent.event.Event().wait()  # the watcher does the work
        finally:
            self.close()

    def close(self) -> None:
        """Stop reading (the socket itself is closed by its owner)."""
        self._on_message = None
        self._io.stop()
        self._io.close()
        self._guard.stop()
        self._guard.close()


def read_monitor(monitor: zmq.Socket, on_event: Callable[[int, str], None]) -> None:
    """Read a monitor socket for ever, calling ``on_event(event, endpoint)``."""
    waiter = SocketWaiter(monitor)
    try:
        while True:
            try:
                frames = monitor.recv_multipart(_NOBLOCK)
            except zmq.Again:
                waiter.wait(zmq.POLLIN)
                continue
            try:
                # frame 0: event (16 bits) and value (32 bits), native order; frame 1: endpoint
                event, _ = _MONITOR_EVENT.unpack(frames[0])
                on_event(event, frames[1].decode("utf-8", "replace"))
            except Exception:
                log.exception("failed to handle a monitor event")
    finally:
        waiter.close()


def close_monitored(sock: zmq.Socket, monitor: Optional[zmq.Socket], linger: int) -> None:
    """Close ``sock`` and its monitor socket (``linger`` ms for what ``sock`` still holds)."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass  # already closed or never monitored
    if monitor is not None:
        monitor.close(linger=0)
    sock.close(linger=linger)


def bind_router(sock: zmq.Socket, address: str, port: int, wait: float = 1.0) -> str:
    """Bind ``sock`` at ``tcp://address:port`` with its identity set to that endpoint.

    The identity has to be set before ``bind`` (connections copy it from the
    listener), so a free port is found by trying: ``port`` 0 picks one at
    random in %C000-%FFFF, as ZRE does for mailboxes. A given ``port`` still
    in use is tried again for up to ``wait`` seconds: ZeroMQ closes a
    listener in the background, so a channel restarted in the same process
    finds its port busy for a moment.
    """
    if port:
        deadline = time.monotonic() + wait
        endpoint = f"tcp://{address}:{port}"
        sock.setsockopt(zmq.ROUTING_ID, endpoint.encode("utf-8"))
        while True:
            try:
                sock.bind(endpoint)
                return endpoint
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                    raise
            gevent.sleep(0.01)
    for _ in range(1000):
        endpoint = f"tcp://{address}:{random.randint(0xC000, 0xFFFF)}"
        sock.setsockopt(zmq.ROUTING_ID, endpoint.encode("utf-8"))
        try:
            sock.bind(endpoint)
            return endpoint
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE:
                raise
    raise zmq.ZMQBindError(f"no free port in 49152-65535 on {address}")


def bind_endpoint(sock: zmq.Socket, endpoint: str) -> str:
    """Bind ``sock`` at an explicit endpoint (``tcp://ip:port`` or ``ipc://...``),
    its identity set to that endpoint."""
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[6:].rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"endpoint {endpoint!r} is not tcp://ADDRESS:PORT")
        if host in ("*", "0.0.0.0", ""):
            raise ValueError(f"endpoint {endpoint!r}: a channel's identity is its public "
                             "endpoint, so bind a concrete address, not a wildcard")
        return bind_router(sock, host, int(port))
    sock.setsockopt(zmq.ROUTING_ID, endpoint.encode("utf-8"))
    sock.bind(endpoint)
    return endpoint
