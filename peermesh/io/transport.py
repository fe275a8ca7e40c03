"""How a node's frames and beacons move: the real transport on ZeroMQ and UDP.

A node talks to its transport through a small interface, so the same node
and protocol code also runs on the simulated network (``peermesh.sim``):

* ``interface(choice)`` - the ``Interface`` to use;
* ``bind_mailbox(address, max_message)`` - a mailbox with ``port``,
  ``serve(on_message, on_oversized, backpressure)`` and ``close()``;
* ``connect(identity, endpoint, sndhwm)`` - an outgoing link with
  ``try_send(frames) -> bool`` (False when full), ``wait_writable(timeout)``
  and ``close(linger)``;
* ``beacon_socket(port)`` - UDP with ``sendto``, ``recvfrom``, ``close``;
* ``now()`` and ``sleep(seconds)`` - the clock the node's timers use;
* ``check_capacity(peers)`` - raise before a new peer would exhaust resources.

Here mailboxes are ROUTER sockets and links DEALER sockets, driven without
blocking the hub (see ``green.SocketWaiter``).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import random
import resource
import socket
import time
from typing import Any, Callable, Optional, Sequence

import gevent
import gevent.event
import gevent.socket
import zmq
from zmq.backend.cython import _zmq

from . import zmqbatch
from ..errors import PeermeshError
from .waiter import SocketWaiter
from ..net.interfaces import Interface, select_interface

__all__ = ["ZmqTransport", "ZmqMailbox", "ZmqLink", "CapacityError", "shared_context"]

log = logging.getLogger(__name__)

_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_BATCH = 256  # messages handled before the mailbox lets other greenlets run
#: file descriptors one peer costs in one process: its DEALER's connection, the
#: peer's connection to our ROUTER, and libzmq's signalling pipe for the socket
FDS_PER_PEER = 3
_FD_RESERVE = 64


class CapacityError(PeermeshError):
    """One more peer would exhaust this process's file descriptors."""


class ZmqMailbox:
    """A ROUTER bound to a random port in %C000-%FFFF, read cooperatively."""

    def __init__(self, context: zmq.Context, address: str, max_message: int) -> None:
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, max_message)
        try:
            self.port = _bind_ephemeral(router, address)
        except zmq.ZMQError:
            router.close()
            raise
        self.socket = router
        self.max_message = max_message

    def serve(self, on_message: Callable[[bytes, list[bytes]], None],
              on_oversized: Callable[[bytes], None], backpressure: Any) -> None:
        """Hand every message to ``on_message(identity, frames)`` until killed.

        Messages are drained on the hub itself, from the descriptor's watcher
        callback, without a greenlet switch per wake-up. ``backpressure`` is
        the event queue: while ``full()`` (the application is behind) reading
        pauses until ``wait_room()`` returns, and each batch is bracketed by
        ``hold()``/``release()`` so the application wakes once per batch. Messages over
        ``max_message`` in all go to ``on_oversized``.
        """
        hub = gevent.get_hub()
        loop = hub.loop
        watcher = loop.io(self.socket.getsockopt(zmq.FD), 1)
        resuming: list[gevent.Greenlet] = []
        full, hold, release = backpressure.full, backpressure.hold, backpressure.release
        serving = True

        def drain() -> None:
            if not serving:  # a callback left over after the end: the socket may be closed
                return
            if full():
                watcher.stop()
                resuming.append(gevent.spawn(resume))
                return
            hold()
            try:
                drain_batch()
            finally:
                release()  # wake the application once per batch

        native = zmqbatch.native
        if native is not None:
            drain_batch = self._native_reader(native.recv_batch, on_message, on_oversized, loop,
                                              drain)
        else:
            drain_batch = self._pyzmq_reader(on_message, on_oversized, loop, drain)

        def resume() -> None:
            backpressure.wait_room()
            resuming.clear()
            watcher.start(drain)
            drain()

        watcher.start(drain)
        loop.run_callback(drain)  # messages may already be queued
        try:
            gevent.event.Event().wait()  # the watcher does the work
        finally:
            serving = False
            watcher.stop()
            watcher.close()
            gevent.killall(resuming)

    def _pyzmq_reader(self, on_message: Callable[[bytes, list[bytes]], None],
                      on_oversized: Callable[[bytes], None], loop: Any,
                      drain: Callable[[], None]) -> Callable[[], None]:
        """One batch read through pyzmq, a frame at a time."""
        router = self.socket
        recv = _zmq.Socket.recv.__get__(router)
        # "Is a message waiting?" as zmq_poll with no wait: like reading EVENTS, it takes
        # pending commands (re-arming the edge), at a lower cost from Python.
        readable = functools.partial(zmq.zmq_poll, [(router, zmq.POLLIN)], 0)
        limit = self.max_message
        noblock = _NOBLOCK

        def drain_batch() -> None:
            for count in range(_BATCH):  # the queue may overshoot its limit by one batch
                try:
                    identity = recv(noblock)  # a ROUTER always has frames after it
                except zmq.Again:
                    if readable():
                        continue
                    return  # empty, and the edge is re-armed
                frame = recv(noblock, False)
                frames = [frame.bytes]
                room = limit - len(frames[0])
                while frame.more:  # Frame.more: far cheaper than getsockopt(RCVMORE)
                    frame = recv(noblock, False)
                    data = frame.bytes
                    room -= len(data)
                    if room >= 0:
                        frames.append(data)
                try:
                    if room >= 0:
                        on_message(identity, frames)
                    else:
                        on_oversized(identity)
                except Exception:  # a bug must not stop the mailbox
                    log.exception("handling a mailbox message failed")
                # A lone message (the request/reply pattern) ends here, without
                # the cost of a failed recv (an exception) to find the socket empty.
                if not count and not readable():
                    return
            loop.run_callback(drain)  # more may wait: let others run first

        return drain_batch

    def _native_reader(self, recv_batch: Callable[[int, int, int], list[Any]],
                       on_message: Callable[[bytes, list[bytes]], None],
                       on_oversized: Callable[[bytes], None], loop: Any,
                       drain: Callable[[], None]) -> Callable[[], None]:
        """One batch read by the C extension in a single call."""
        handle = self.socket.underlying
        limit = self.max_message

        def drain_batch() -> None:
            batch = recv_batch(handle, _BATCH, limit)  # fewer: empty, and the edge is re-armed
            for identity, frames in batch:
                try:
                    if frames is not None:
                        on_message(identity, frames)
                    else:
                        on_oversized(identity)
                except Exception:  # a bug must not stop the mailbox
                    log.exception("handling a mailbox message failed")
            if len(batch) == _BATCH:
                loop.run_callback(drain)  # more may wait: let others run first
        return drain_batch

    def close(self) -> None:
        """Close the ROUTER."""
        self.socket.close(linger=0)


class ZmqLink:
    """A DEALER connected to one peer's mailbox; sends never block."""

    __slots__ = ("socket", "_send", "_target")

    def __init__(self, context: zmq.Context, identity: bytes, endpoint: str,
                 sndhwm: int) -> None:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.setsockopt(zmq.SNDHWM, sndhwm)
        sock.setsockopt(zmq.SNDTIMEO, 0)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        try:
            sock.connect(endpoint)
        except zmq.ZMQError:
            sock.close()
            raise
        self.socket = sock
        if zmqbatch.native is not None:
            self._send: Callable[[Any, Sequence[bytes]], bool] = zmqbatch.native.send
            self._target: Any = sock.underlying  # 0 once closed
        else:
            self._send = _pyzmq_send
            self._target = sock

    def try_send(self, frames: Sequence[bytes]) -> bool:
        """Send one message now; False (nothing sent) when the queue is full."""
        return self._send(self._target, frames)

    def wait_writable(self, timeout: Optional[float] = None) -> bool:
        """Wait until a message may fit; False after ``timeout`` seconds."""
        waiter = SocketWaiter(self.socket)
        try:
            return waiter.wait(zmq.POLLOUT, timeout)
        finally:
            waiter.close()

    def close(self, linger: float = 0) -> None:
        """Close; ZeroMQ may go on sending what it holds for ``linger`` seconds."""
        if self._target is not self.socket:
            self._target = 0  # the C extension then raises ENOTSOCK, as pyzmq would
        self.socket.close(linger=int(linger * 1000))


_pyzmq_socket_send: Callable[..., Any] = _zmq.Socket.send  # skips pyzmq's Python wrapper


def _pyzmq_send(sock: zmq.Socket, frames: Sequence[bytes]) -> bool:
    """Send one message through pyzmq a frame at a time; False when the queue is full."""
    send = _pyzmq_socket_send
    last = len(frames) - 1
    try:
        send(sock, frames[0], _MORE if last else _NOBLOCK)
    except zmq.Again:
        return False
    # Once the first frame is taken, ZeroMQ takes the whole message.
    for i in range(1, last):
        send(sock, frames[i], _MORE)
    if last:
        send(sock, frames[last], _NOBLOCK)
    return True


class ZmqTransport:
    """The real transport: ZeroMQ over TCP for mailboxes, UDP for beacons."""

    def __init__(self, context: Optional[zmq.Context] = None) -> None:
        self.context = context or shared_context()

    now = staticmethod(time.monotonic)
    sleep = staticmethod(gevent.sleep)

    def interface(self, choice: Optional[str]) -> Interface:
        """See ``interfaces.select_interface``."""
        return select_interface(choice)

    def bind_mailbox(self, address: str, max_message: int) -> ZmqMailbox:
        """A ROUTER mailbox on ``address``."""
        return ZmqMailbox(self.context, address, max_message)

    def connect(self, identity: bytes, endpoint: str, sndhwm: int) -> ZmqLink:
        """A DEALER link to ``endpoint``."""
        return ZmqLink(self.context, identity, endpoint, sndhwm)

    def beacon_socket(self, port: int) -> socket.socket:
        """A UDP socket on ``port`` shared with every node of this host."""
        sock = gevent.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sock.bind(("", port))
        except OSError:
            sock.close()
            raise
        return sock

    def check_capacity(self, peers: int) -> None:
        """Raise ``CapacityError`` when the process is near its descriptor limit.

        libzmq does not fail loudly when descriptors run out (accept fails with
        "too many open files" and connections silently stall), so a node
        refuses a new peer while fewer than ``FDS_PER_PEER`` plus a reserve
        remain. A full mesh of N nodes in one process needs about 3 N (N-1).
        """
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return
        # Counting /proc/self/fd costs a directory listing: do it only when an
        # estimate from the last count (shared by every node of the process)
        # says the limit may be near.
        _fds.since += 1
        estimate = _fds.counted + FDS_PER_PEER * _fds.since
        if estimate + _FD_RESERVE < 0.75 * limit and _fds.since < 256:
            return
        used = _fds.counted = _open_descriptors()
        _fds.since = 0
        if used + FDS_PER_PEER + _FD_RESERVE > limit:
            raise CapacityError(
                f"{used} of {limit} file descriptors in use: one more peer (about "
                f"{FDS_PER_PEER}) would exhaust them. Run fewer nodes per process "
                f"(a full mesh of N nodes in one process needs about 3*N*(N-1)), or raise "
                f"`ulimit -n`.")


_context: Optional[zmq.Context] = None


def shared_context() -> zmq.Context:
    """The process's ZeroMQ context for peermesh, allowing as many sockets as descriptors.

    libzmq's default of 1,023 sockets per context would stop a process at
    about 25 nodes in a full mesh, silently.
    """
    global _context
    if _context is None or _context.closed:
        context = zmq.Context()
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        wanted = 65536 if limit == resource.RLIM_INFINITY else max(1024, limit)
        context.set(zmq.MAX_SOCKETS, min(wanted, context.get(zmq.SOCKET_LIMIT)))
        _context = context
    return _context


class _DescriptorCount:
    """The process's last count of open descriptors, and peers added since."""

    counted = 0
    since = 256  # count at the first check


_fds = _DescriptorCount()


def _open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _bind_ephemeral(router: zmq.Socket, address: str) -> int:
    """Bind to a random port in %C000-%FFFF, the range ZRE asks for."""
    for _ in range(1000):
        port = random.randint(0xC000, 0xFFFF)
        try:
            router.bind(f"tcp://{address}:{port}")
            return port
        except zmq.ZMQError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise zmq.ZMQBindError(f"no free mailbox port in 49152-65535 on {address}")
