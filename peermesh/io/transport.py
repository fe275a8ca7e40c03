"""How a node's frames and beacons move: the real transport on ZeroMQ and UDP.

A node talks to its transport through a small interface, so the same node
and protocol code also runs on the simulated network (``peermesh.sim``):

* ``interface(choice)`` - the ``Interface`` to use;
* ``bind_mailbox(address, max_message, endpoint=None, **limits)`` - a mailbox with ``port``,
  ``serve(on_message, on_oversized, backpressure)`` and ``close()``;
* ``connect(identity, endpoint, sndhwm)`` - an outgoing link with
  ``try_send(frames) -> bool`` (False when full), ``wait_writable(timeout)``
  and ``close(linger)``;
* ``beacon_socket(port)`` - UDP with ``sendto``, ``recvfrom``, ``close``;
* ``now()`` and ``sleep(seconds)`` - the clock the node's timers use;
* ``check_capacity(peers)`` - raise before a new peer would exhaust resources.

Here mailboxes are ROUTER sockets and links DEALER sockets, both
``HubSocket``s (see ``peermesh.io.socket``).

A mailbox never hands a live peer's routing identity to another connection
(no ``ROUTER_HANDOVER``: a second connection under an identity in use is
ignored), and ZMTP heartbeats close connections whose far end is gone, so a
peer that really reconnects is not locked out by a dead one. The same holds
for this node's links at its peers' mailboxes: a new link under the same
identity to an endpoint whose previous link closed moments ago connects only
``RECONNECT_GAP`` after that close, so the peer has seen the old connection
end first. With limits, a ``GuardedMailbox`` also bounds its connections.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import struct
import time
from collections import Counter
from typing import Any, Callable, Optional, Union

import gevent
import gevent.socket
import zmq

from ..counters import Counters, take_one
from ..errors import PeermeshError
from ..net.interfaces import Interface, select_interface
from .endpoints import bind, bind_ephemeral
from .context import shared_context
from .curve import Curve
from .socket import HubSocket, make_socket

__all__ = ["ZmqTransport", "CapacityError", "GuardedMailbox"]

log = logging.getLogger(__name__)

#: file descriptors one peer costs in one process: its DEALER's connection, the
#: peer's connection to our ROUTER, and libzmq's signalling pipe for the socket
FDS_PER_PEER = 3
_FD_RESERVE = 64
#: milliseconds between ZMTP heartbeats on a mailbox's connections (at most)
HEARTBEAT_IVL = 2_000
#: seconds between closing a link and connecting a new one under the same identity to the
#: same endpoint (a mailbox ignores a second connection while it still sees the first)
RECONNECT_GAP = 0.2


class CapacityError(PeermeshError):
    """One more peer would exhaust this process's file descriptors."""


class ZmqTransport:
    """The real transport: ZeroMQ over TCP for mailboxes, UDP for beacons."""

    def __init__(self, context: Optional[zmq.Context] = None,
                 curve: Optional[Curve] = None) -> None:
        self.context = context or shared_context()
        #: when a link closed, by (identity, endpoint), oldest first; kept RECONNECT_GAP
        self._closed: dict[tuple[bytes, str], float] = {}
        #: the node's keys: every socket speaks CURVE (see ``make_socket``)
        self.curve = curve

    now = staticmethod(time.monotonic)
    sleep = staticmethod(gevent.sleep)

    def interface(self, choice: Optional[str]) -> Interface:
        """See ``interfaces.select_interface``."""
        return select_interface(choice)

    def bind_mailbox(self, address: str, max_message: int, endpoint: Optional[str] = None, *,
                     max_connections: Optional[int] = None, handshake_timeout: float = 30.0,
                     dead_after: float = 30.0, counters: Optional[Counters] = None,
                     handover: bool = False, max_per_address: Optional[int] = None,
                     keepalive: bool = False) -> Any:
        """A ROUTER mailbox at ``endpoint`` if given (``BindError`` if it cannot
        listen there), else on a random port of ``address``; messages over
        ``max_message`` bytes in all are oversized (one frame over it: cut off).

        A connection must finish the ZeroMQ handshake within
        ``handshake_timeout`` seconds, and is closed once its far end has not
        answered heartbeats for ``dead_after`` seconds. With ``max_connections``
        the mailbox is a ``GuardedMailbox`` that counts what it sheds in
        ``counters`` (and keeps at most ``max_per_address`` connections from any one
        other host). Without ``handover`` (the ZRE mailbox), a second connection
        under a routing identity in use is ignored while the first lasts, so no one
        can take a live peer's identity; ``handover`` lets the newer connection
        take it (the Flux tree, whose members re-attach under their identity).
        A dead connection is found by ZMTP heartbeats, or with ``keepalive`` by TCP
        keepalive probes (in whole seconds, at least 4 s): those are answered by the
        far end's kernel, so a mailbox that stops reading to push back on its
        senders (the ZRE node's full event queue) keeps their connections, where
        heartbeats it does not read would close them.
        """
        options: dict[int, Union[int, bytes]] = {
            zmq.ROUTER_HANDOVER: int(handover), zmq.MAXMSGSIZE: max_message,
                   zmq.HANDSHAKE_IVL: max(1, int(handshake_timeout * 1000))}
        if keepalive:
            options.update({zmq.TCP_KEEPALIVE: 1,
                            zmq.TCP_KEEPALIVE_IDLE: max(1, round(dead_after / 3)),
                            zmq.TCP_KEEPALIVE_INTVL: max(1, round(dead_after / 6)),
                            zmq.TCP_KEEPALIVE_CNT: 3})
        else:
            options.update({zmq.HEARTBEAT_IVL: min(HEARTBEAT_IVL, max(1, int(dead_after * 500))),
                            zmq.HEARTBEAT_TIMEOUT: max(1, int(dead_after * 1000))})
        router = make_socket(zmq.ROUTER, options, self.context, curve=self.curve)
        try:
            endpoint = bind(router, endpoint) if endpoint else bind_ephemeral(router, address)
        except BaseException:
            router.close(linger=0)
            raise
        mailbox = HubSocket(router, endpoint=endpoint, limit=max_message)
        if max_connections is None:
            return mailbox
        return GuardedMailbox(mailbox, max_connections,
                              counters or Counters(log, f"mailbox {endpoint}"), max_per_address)

    def connect(self, identity: bytes, endpoint: str, sndhwm: int,
                server_key: Optional[bytes] = None, handover: bool = False) -> HubSocket:
        """A DEALER link to ``endpoint`` (a CURVE client of ``server_key`` when the
        transport has keys); sends never block. With ``handover`` (the far end hands an
        identity to its newest connection) it connects at once, without ``RECONNECT_GAP``."""
        sock = make_socket(zmq.DEALER, {zmq.IDENTITY: identity, zmq.SNDHWM: sndhwm,
                                        zmq.SNDTIMEO: 0, zmq.RECONNECT_IVL: 100,
                                        zmq.RECONNECT_IVL_MAX: 1000}, self.context,
                           curve=self.curve, server_key=server_key)
        key = (identity, endpoint)
        closed = self._closed.pop(key, None)
        wait = 0.0 if closed is None or handover else closed + RECONNECT_GAP - time.monotonic()
        try:
            if wait <= 0:
                sock.connect(endpoint)
        except BaseException:
            sock.close(linger=0)
            raise
        link = _Link(sock, key, self._link_closed)
        if wait > 0:  # (until then try_send refuses: a ZRE peer link holds its backlog)
            link.connect_after(wait, endpoint)
        return link

    def _link_closed(self, key: tuple[bytes, str]) -> None:
        now = time.monotonic()
        closed = self._closed
        closed.pop(key, None)
        closed[key] = now
        for old, when in list(closed.items()):  # oldest first: stops at the first recent one
            if now - when < RECONNECT_GAP:
                break
            del closed[old]

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


class GuardedMailbox:
    """A mailbox that keeps its connections under a cap, so descriptors never run out.

    libzmq accepts every connection it can; once the process is out of
    descriptors, ``accept`` fails and libzmq retries it at once, for ever: the
    I/O thread spins and no peer gets in. So the mailbox's socket monitor
    counts the accepted connections (``connections``), and once they exceed
    ``cap`` (``max_connections``, and at most half the descriptors beyond a
    reserve, so that the node can still connect back to its peers) some are
    shut down, down to 7/8 of the cap: oldest first those that sent under 1 KiB
    (no handshake, or nothing since it but a HELLO), then those that sent the
    fewest octets; a peer that talks is shed last. With ``max_per_address``, the
    connections from one address other than the connection's own local one
    (another host) are kept under it the same way, so one host cannot take every
    connection. Each is counted as ``connections_shed``.
    """

    def __init__(self, mailbox: HubSocket, max_connections: int, counters: Counters,
                 max_per_address: Optional[int] = None) -> None:
        self.mailbox = mailbox
        self.port = mailbox.port
        self.counters = counters
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.cap = max_connections if limit == resource.RLIM_INFINITY else \
            max(1, min(max_connections, (limit - _FD_RESERVE) // 2))
        #: accepted connections still open: descriptor -> when accepted (oldest first)
        self.accepted: dict[int, float] = {}
        self.max_per_address = max_per_address
        #: accepted connections from other hosts: descriptor -> the address
        self.sources: dict[int, str] = {}
        self.per_address: Counter[str] = Counter()
        router = mailbox.socket
        address = f"inproc://peermesh-monitor-{id(self):x}"
        router.monitor(address, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        # libzmq sends monitor events blocking (its I/O thread, every connection of the
        # context with it, would wait for this reader): no high-water mark on them
        monitor = make_socket(zmq.PAIR, {zmq.RCVHWM: 0}, router.context)
        monitor.connect(address)
        self._monitor = HubSocket(monitor)
        self._reader = gevent.spawn(self._monitor.read, self._on_events)

    @property
    def connections(self) -> int:
        """Connections to the mailbox now open."""
        return len(self.accepted)

    def serve(self, on_message: Callable[..., None], on_oversized: Any = None,
              backpressure: Any = None, *, metadata: Optional[str] = None,
              after_batch: Optional[Callable[[], None]] = None) -> None:
        """``HubSocket.serve`` of the mailbox."""
        self.mailbox.serve(on_message, on_oversized, backpressure, metadata=metadata,
                           after_batch=after_batch)

    def _on_events(self, batch: list) -> None:
        accepted, per_address, limit = self.accepted, self.per_address, self.max_per_address or 0
        crowded = set()
        for first, rest in batch:
            if len(first) < 6:
                continue
            event, fd = _MONITOR_EVENT.unpack_from(first)
            if event == zmq.EVENT_ACCEPTED:
                accepted[fd] = time.monotonic()
                address = _remote_address(fd, self.port) if limit else ""
                if address:
                    self.sources[fd] = address
                    per_address[address] += 1
                    if per_address[address] > limit:
                        crowded.add(address)
            else:
                accepted.pop(fd, None)
                self._forget_source(fd)
        for address in crowded:
            self._shed(per_address[address] - limit, address)
        if len(accepted) > self.cap:  # down to 7/8 of it: one scan sheds many
            self._shed(len(accepted) - self.cap + self.cap // 8)

    def _forget_source(self, fd: int) -> None:
        address = self.sources.pop(fd, "")
        if address:
            take_one(self.per_address, address)

    def _shed(self, count: int, address: Optional[str] = None) -> None:
        """Shut down ``count`` connections (from ``address`` if given): oldest first those
        that sent under ``_SMALL`` octets (no more than a handshake and a HELLO), then the
        fewest.

        Asking the kernel costs a few system calls per connection, so the scan
        stops once it has found enough small ones, and lets other greenlets
        run every ``_SHED_BATCH`` connections.
        """
        accepted, larger = self.accepted, []
        for i, (fd, when) in enumerate(list(accepted.items())):  # oldest first
            if not count:
                return
            if address is not None and self.sources.get(fd) != address:
                continue
            if i and not i % _SHED_BATCH:
                gevent.sleep(0)
            if accepted.get(fd) != when:  # closed (and maybe reused) meanwhile
                continue
            octets = _octets_received(fd, self.port)
            if octets is None:  # not a connection of ours any more: its event is late
                del accepted[fd]
                self._forget_source(fd)
            elif octets < _SMALL:
                self._shut_down(fd)
                count -= 1
            else:
                larger.append((octets, when, fd))
        for _, when, fd in sorted(larger)[:count]:
            if accepted.get(fd) == when:
                self._shut_down(fd)

    def _shut_down(self, fd: int) -> None:
        del self.accepted[fd]  # (its DISCONNECTED follows)
        self._forget_source(fd)
        _shut_down(fd)
        self.counters.add("connections_shed")

    def close(self, linger: float = 0.0) -> None:
        """Stop the monitor (before its reader: libzmq sends its events blocking), close."""
        router = self.mailbox.socket
        try:
            router.disable_monitor()
        except zmq.ZMQError:
            pass
        self._reader.kill(block=False)
        self._monitor.close()
        self.mailbox.close(linger)


_SHED_BATCH = 64  # connections asked about between two yields of the monitor's reader
_SMALL = 1024  # octets: a connection that sent fewer did no more than a handshake and a HELLO
_MONITOR_EVENT = struct.Struct("=HI")  # event number, value (a descriptor for ours)
_TCP_INFO_SIZE = 232
_BYTES_RECEIVED = struct.Struct("=Q")  # struct tcp_info's tcpi_bytes_received ...
_BYTES_RECEIVED_AT = 128  # ... at this offset (Linux 4.1 and later)


def _borrow(fd: int, port: int) -> Optional[socket.socket]:
    """A socket object on descriptor ``fd`` (not a copy: ``detach`` it after) if ``fd`` is
    still a TCP connection accepted on local ``port``; otherwise None."""
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)  # (no probing)
    except OSError:  # closed already (its event is on the way)
        return None
    try:
        if sock.getsockname()[1] == port:
            return sock
    except (OSError, IndexError, TypeError):
        pass
    sock.detach()
    return None


def _remote_address(fd: int, port: int) -> str:
    """The address connection ``fd`` comes from; "" when it is the connection's own local
    address (this host) or ``fd`` is no longer one of ``port``'s connections."""
    sock = _borrow(fd, port)
    if sock is None:
        return ""
    try:
        remote, local = sock.getpeername()[0], sock.getsockname()[0]
    except (OSError, IndexError):
        return ""
    finally:
        sock.detach()
    return "" if remote == local else remote


def _octets_received(fd: int, port: int) -> Optional[int]:
    """Octets connection ``fd`` has received so far (0 if the kernel cannot tell), or None
    when ``fd`` is no longer one of ``port``'s connections."""
    sock = _borrow(fd, port)
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    except OSError:
        return 0
    finally:
        sock.detach()
    if len(info) < _BYTES_RECEIVED_AT + 8:
        return 0
    return int(_BYTES_RECEIVED.unpack_from(info, _BYTES_RECEIVED_AT)[0])


def _shut_down(fd: int) -> None:
    """Shut connection ``fd`` down both ways; libzmq sees it end and closes it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0, fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


class _Link(HubSocket):
    """A DEALER link that tells its transport when it closes (see ``RECONNECT_GAP``)."""

    __slots__ = ("key", "on_close")

    def __init__(self, sock: zmq.Socket, key: tuple[bytes, str],
                 on_close: Callable[[tuple[bytes, str]], None]) -> None:
        super().__init__(sock)
        self.key, self.on_close = key, on_close

    def connect_after(self, seconds: float, endpoint: str) -> None:
        """Connect to ``endpoint`` in ``seconds``, unless closed meanwhile."""
        timer = gevent.get_hub().loop.timer(seconds)
        timer.start(self._connect, timer, endpoint)

    def _connect(self, timer: Any, endpoint: str) -> None:
        timer.close()
        if not self.closed:
            try:
                self.socket.connect(endpoint)
            except zmq.ZMQError as exc:
                log.debug("cannot connect to %s: %s", endpoint, exc)

    def close(self, linger: float = 0.0) -> None:
        if not self.closed:
            self.on_close(self.key)
        super().close(linger)
