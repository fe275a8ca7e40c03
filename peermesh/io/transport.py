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

Here mailboxes are ROUTER sockets and links DEALER sockets, both
``HubSocket``s (see ``peermesh.io.socket``).
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import time
from typing import Optional

import gevent
import gevent.socket
import zmq

from ..errors import PeermeshError
from ..net.interfaces import Interface, select_interface
from .endpoints import bind_ephemeral
from .context import shared_context
from .curve import Curve
from .socket import HubSocket, make_socket

__all__ = ["ZmqTransport", "CapacityError"]

log = logging.getLogger(__name__)

#: file descriptors one peer costs in one process: its DEALER's connection, the
#: peer's connection to our ROUTER, and libzmq's signalling pipe for the socket
FDS_PER_PEER = 3
_FD_RESERVE = 64


class CapacityError(PeermeshError):
    """One more peer would exhaust this process's file descriptors."""


class ZmqTransport:
    """The real transport: ZeroMQ over TCP for mailboxes, UDP for beacons."""

    def __init__(self, context: Optional[zmq.Context] = None,
                 curve: Optional[Curve] = None) -> None:
        self.context = context or shared_context()
        #: the node's keys: every socket speaks CURVE (see ``make_socket``)
        self.curve = curve

    now = staticmethod(time.monotonic)
    sleep = staticmethod(gevent.sleep)

    def interface(self, choice: Optional[str]) -> Interface:
        """See ``interfaces.select_interface``."""
        return select_interface(choice)

    def bind_mailbox(self, address: str, max_message: int) -> HubSocket:
        """A ROUTER mailbox on a random port of ``address``; messages over
        ``max_message`` bytes in all are oversized (one frame over it: cut off)."""
        router = make_socket(zmq.ROUTER, {zmq.ROUTER_HANDOVER: 1, zmq.MAXMSGSIZE: max_message},
                             self.context, curve=self.curve)
        try:
            endpoint = bind_ephemeral(router, address)
        except BaseException:
            router.close(linger=0)
            raise
        return HubSocket(router, endpoint=endpoint, limit=max_message)

    def connect(self, identity: bytes, endpoint: str, sndhwm: int,
                server_key: Optional[bytes] = None) -> HubSocket:
        """A DEALER link to ``endpoint`` (a CURVE client of ``server_key`` when the
        transport has keys); sends never block."""
        sock = make_socket(zmq.DEALER, {zmq.IDENTITY: identity, zmq.SNDHWM: sndhwm,
                                        zmq.SNDTIMEO: 0, zmq.RECONNECT_IVL: 100,
                                        zmq.RECONNECT_IVL_MAX: 1000}, self.context,
                           curve=self.curve, server_key=server_key)
        try:
            sock.connect(endpoint)
        except BaseException:
            sock.close(linger=0)
            raise
        return HubSocket(sock)

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
