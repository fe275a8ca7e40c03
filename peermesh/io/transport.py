"""How a node's frames and beacons move: the real transport on ZeroMQ and UDP.

A node talks to its transport through a small typed interface, ``Transport``
(with ``Mailbox``, ``Link`` and ``BeaconSocket``), so the same node, protocol
and driver code also runs on the simulated network (``peermesh.sim``):

* ``interface(choice)`` - the ``Interface`` to use;
* ``bind_mailbox(address, max_message, endpoint=None, **limits)`` - a ``Mailbox``
  with ``port``, ``endpoint``, ``serve(on_message, on_oversized, backpressure)``,
  ``try_send([identity, *frames])`` (back down the link of ``identity``) and ``close()``;
* ``connect(identity, endpoint, sndhwm)`` - an outgoing ``Link`` with
  ``try_send(frames) -> bool`` (False when full), ``wait_writable(timeout)``,
  ``serve(on_message)`` (what the mailbox sends back) and ``close(linger)``;
* ``guard(mailbox, counters, policy)`` - a mailbox bound without limits, under the
  connection policy from when its owner starts serving it;
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
end first. With limits, a ``GuardedListener`` also bounds its connections.
"""

from __future__ import annotations

import logging
import os
import resource
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence, Union

import gevent
import gevent.socket
import zmq

from ..counters import Counters
from ..errors import PeermeshError
from ..net.interfaces import Interface, select_interface
from .connections import ConnectionPolicy, GuardedListener
from .endpoints import bind, bind_ephemeral
from .context import shared_context
from .descriptors import FD_RESERVE, FDS_PER_PEER, peer_capacity
from .socket import HubSocket, make_socket

if TYPE_CHECKING:  # CURVE is loaded only by nodes with keys
    from .curve import Curve

__all__ = ["Transport", "Mailbox", "Link", "BeaconSocket", "ZmqTransport", "CapacityError",
           "GuardedMailbox"]

#: the guarded mailbox is a ``GuardedListener`` (see ``peermesh.io.connections``)
GuardedMailbox = GuardedListener

log = logging.getLogger(__name__)

#: milliseconds between ZMTP heartbeats on a mailbox's connections (at most)
HEARTBEAT_IVL = 2_000
#: seconds between closing a link and connecting a new one under the same identity to the
#: same endpoint (a mailbox ignores a second connection while it still sees the first)
RECONNECT_GAP = 0.2


#: ``on_message(first frame, the rest)``: a mailbox's first frame is the sender's identity
MessageHandler = Callable[[bytes, list[bytes]], None]


class Link(Protocol):
    """An outgoing connection to one mailbox (a DEALER; ``SimLink`` on the simulator)."""

    @property
    def closed(self) -> bool: ...

    def try_send(self, frames: Sequence[bytes]) -> bool:
        """Queue one message; False when the queue is full (nothing sent)."""
        ...

    def wait_writable(self, timeout: Optional[float] = None) -> bool:
        """Wait (cooperatively) for room; False if none came in ``timeout``."""
        ...

    def serve(self, on_message: MessageHandler, on_oversized: Any = None,
              backpressure: Any = None, *,
              after_batch: Optional[Callable[[], None]] = None) -> None:
        """Call ``on_message(first, rest)`` for each message the mailbox sends back, until
        closed (blocks the calling greenlet); ``after_batch()`` after each batch."""
        ...

    def close(self, linger: float = 0.0) -> None: ...


class Mailbox(Protocol):
    """Where a node receives (a ROUTER; ``SimMailbox`` on the simulator)."""

    @property
    def port(self) -> int: ...

    @property
    def endpoint(self) -> str: ...

    def try_send(self, frames: Sequence[bytes]) -> bool:
        """Send ``frames[1:]`` back down the link whose identity is ``frames[0]``."""
        ...

    def serve(self, on_message: MessageHandler, on_oversized: Any = None,
              backpressure: Any = None, *,
              after_batch: Optional[Callable[[], None]] = None) -> None:
        """Call ``on_message(identity, frames)`` for each message, until closed (blocks the
        calling greenlet); a message over the mailbox's limit goes to ``on_oversized``, and
        ``after_batch()`` is called after each batch."""
        ...

    def close(self, linger: float = 0.0) -> None: ...


class BeaconSocket(Protocol):
    """A UDP socket for beacons."""

    def sendto(self, data: bytes, address: tuple[str, int]) -> int: ...

    def recvfrom(self, size: int) -> tuple[bytes, Any]: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """What a node and a driver need of the network (``ZmqTransport``, ``SimTransport``)."""

    def now(self) -> float:
        """The clock every timer of the node runs on (seconds)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling greenlet for ``seconds`` of that clock."""
        ...

    def interface(self, choice: Optional[str]) -> Interface: ...

    def bind_mailbox(self, address: str, max_message: int,
                     endpoint: Optional[str] = None, *, heartbeat: bool = True) -> Mailbox:
        """A mailbox (a transport may take limits as further keywords); without
        ``heartbeat`` the transport need not look for dead connections itself."""
        ...

    def connect(self, identity: bytes, endpoint: str, sndhwm: int,
                server_key: Optional[bytes] = None, handover: bool = False,
                max_message: Optional[int] = None) -> Link:
        """A link to ``endpoint`` (a CURVE client of ``server_key`` where keys are used);
        with ``max_message``, a message back over it cuts the connection (ZeroMQ) or is
        dropped."""
        ...

    def beacon_socket(self, port: int) -> BeaconSocket: ...

    def guard(self, mailbox: Any, counters: Optional[Counters] = None,
              policy: Optional[ConnectionPolicy] = None, *,
              on_revoked: Optional[Callable[[frozenset[str]], None]] = None,
              keep: Optional[Callable[[bytes], bool]] = None) -> Any:
        """A mailbox bound without limits, under the connection policy from now on."""
        ...

    def peer_capacity(self) -> int: ...

    def check_capacity(self, peers: int) -> None: ...


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
                     policy: Optional[ConnectionPolicy] = None,
                     on_revoked: Optional[Callable[[frozenset[str]], None]] = None,
                     keepalive: bool = False, keep: Optional[Callable[[bytes], bool]] = None,
                     max_unknown: Optional[int] = None, inproc: Optional[str] = None,
                     heartbeat: bool = True, security: Optional[Curve] = None,
                     hwm: Optional[int] = None, max_frames: Optional[int] = None) -> Any:
        """A ROUTER mailbox at ``endpoint`` if given (``BindError`` if it cannot
        listen there), else on a random port of ``address``; messages over
        ``max_message`` bytes in all are oversized (one frame over it: cut off).

        A connection must finish the ZeroMQ handshake within
        ``handshake_timeout`` seconds, and is closed once its far end has not
        answered heartbeats for ``dead_after`` seconds. With ``max_connections``
        the mailbox is a ``GuardedMailbox`` that counts what it sheds in
        ``counters`` (and keeps at most ``max_per_address`` connections from any one
        other host, never sheds the connections of routing ids ``keep`` accepts and keeps
        at most ``max_unknown`` others); with ``policy`` instead, a ``GuardedListener``
        under it, which
        with ``on_revoked`` and the transport's allowlist also closes the connections of
        keys removed from it (see ``peermesh.io.connections``). Without ``handover``
        (the ZRE mailbox), a second connection
        under a routing identity in use is ignored while the first lasts, so no one
        can take a live peer's identity; ``handover`` lets the newer connection
        take it (the Flux tree, whose members re-attach under their identity).
        A dead connection is found by ZMTP heartbeats, or with ``keepalive`` by TCP
        keepalive probes (in whole seconds, at least 4 s): those are answered by the
        far end's kernel, so a mailbox that stops reading to push back on its
        senders (the ZRE node's full event queue) keeps their connections, where
        heartbeats it does not read would close them. With ``inproc`` (an ``inproc://``
        address) the mailbox is bound there too, for parts of this process (plain: no
        CURVE handshake inside the process). Without ``heartbeat``, neither heartbeats
        nor keepalive probes: for a protocol that finds its dead peers itself (NFP's
        keepalive), whose connections then cost libzmq no heartbeat timer per message.
        ``security``: the mailbox's own CURVE server keys instead of the transport's (the
        MTL gateway admits any client key); ``hwm``: the ROUTER's send and receive queues
        (messages); ``max_frames``: a message of more frames is oversized.
        """
        options: dict[int, Union[int, bytes]] = {
            zmq.ROUTER_HANDOVER: int(handover), zmq.MAXMSGSIZE: max_message,
            zmq.HANDSHAKE_IVL: max(1, int(handshake_timeout * 1000))}
        if heartbeat and keepalive:
            options.update({zmq.TCP_KEEPALIVE: 1,
                            zmq.TCP_KEEPALIVE_IDLE: max(1, round(dead_after / 3)),
                            zmq.TCP_KEEPALIVE_INTVL: max(1, round(dead_after / 6)),
                            zmq.TCP_KEEPALIVE_CNT: 3})
        elif heartbeat:
            options.update({zmq.HEARTBEAT_IVL: min(HEARTBEAT_IVL, max(1, int(dead_after * 500))),
                            zmq.HEARTBEAT_TIMEOUT: max(1, int(dead_after * 1000))})
        if hwm is not None:
            options.update({zmq.SNDHWM: hwm, zmq.RCVHWM: hwm})
        router = make_socket(zmq.ROUTER, options, self.context,
                             curve=security if security is not None else self.curve)
        try:
            endpoint = bind(router, endpoint) if endpoint else bind_ephemeral(router, address)
            if inproc is not None:
                router.bind(inproc)
        except BaseException:
            router.close(linger=0)
            raise
        mailbox = HubSocket(router, endpoint=endpoint, limit=max_message, max_frames=max_frames)
        if max_connections is not None:
            policy = ConnectionPolicy(max_connections, max_per_address, max_unknown=max_unknown)
        if policy is None:
            return mailbox
        return self.guard(mailbox, counters, policy, on_revoked=on_revoked, keep=keep)

    def guard(self, mailbox: HubSocket, counters: Optional[Counters] = None,
              policy: Optional[ConnectionPolicy] = None, *,
              on_revoked: Optional[Callable[[frozenset[str]], None]] = None,
              keep: Optional[Callable[[bytes], bool]] = None) -> GuardedListener:
        """``mailbox`` (bound without limits) under ``policy`` (default: the process's
        connection policy) from now on, as ``bind_mailbox`` with limits makes it: for an
        owner that binds before it serves (its endpoint advertised first) and guards the
        mailbox when it starts serving on its hub."""
        allowlist = self.curve.allowlist if self.curve is not None and on_revoked else None
        return GuardedListener(mailbox, counters or Counters(log, f"listener {mailbox.endpoint}"),
                               policy, allowlist=allowlist, on_revoked=on_revoked, keep=keep)

    def connect(self, identity: bytes, endpoint: str, sndhwm: int,
                server_key: Optional[bytes] = None, handover: bool = False,
                max_message: Optional[int] = None) -> HubSocket:
        """A DEALER link to ``endpoint`` (a CURVE client of ``server_key`` when the
        transport has keys; ``inproc://`` never leaves the process and speaks plain);
        sends never block. With ``handover`` (the far end hands an identity to its newest
        connection) it connects at once, without ``RECONNECT_GAP``. With ``max_message``
        (a link of ``peermesh.io.driver``) a peer sending more is cut off (``MAXMSGSIZE``)
        and reconnects keep libzmq's timing."""
        options: dict[int, Union[int, bytes]] = {zmq.IDENTITY: identity, zmq.SNDHWM: sndhwm}
        if max_message is None:   # a ZRE peer link: it reconnects fast, sends never wait
            options.update({zmq.SNDTIMEO: 0, zmq.RECONNECT_IVL: 100,
                            zmq.RECONNECT_IVL_MAX: 1000})
        else:   # a driver's link: the bound, libzmq's own timing (measured: cheaper per job)
            options[zmq.MAXMSGSIZE] = max_message
        plain = endpoint.startswith("inproc://")
        sock = make_socket(zmq.DEALER, options, self.context,
                           curve=None if plain else self.curve, server_key=server_key)
        key = (identity, endpoint)
        closed = self._closed.pop(key, None)
        wait = 0.0 if closed is None or handover else closed + RECONNECT_GAP - time.monotonic()
        try:
            if wait <= 0:
                sock.connect(endpoint)
        except BaseException:
            sock.close(linger=0)
            raise
        link = _Link(sock, key, self._link_closed, max_message)
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

    @staticmethod
    def peer_capacity() -> int:
        """Peers the process's descriptors allow (``descriptors.peer_capacity``): the
        default ``max_peers``."""
        return peer_capacity()

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
        if estimate + FD_RESERVE < 0.75 * limit and _fds.since < 256:
            return
        used = _fds.counted = _open_descriptors()
        _fds.since = 0
        if used + FDS_PER_PEER + FD_RESERVE > limit:
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


class _Link(HubSocket):
    """A DEALER link that tells its transport when it closes (see ``RECONNECT_GAP``)."""

    __slots__ = ("key", "on_close")

    def __init__(self, sock: zmq.Socket, key: tuple[bytes, str],
                 on_close: Callable[[tuple[bytes, str]], None],
                 limit: Optional[int] = None) -> None:
        super().__init__(sock, limit=limit)
        self.key, self.on_close = key, on_close

    def connect_after(self, seconds: float, endpoint: str) -> None:
        """Connect to ``endpoint`` in ``seconds``, unless closed meanwhile."""
        timer = gevent.get_hub().loop.timer(seconds)
        timer.start(self._connect, timer, endpoint, update=True)

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


if TYPE_CHECKING:  # the real transport implements the interface it defines
    def _conforms(transport: ZmqTransport) -> Transport:
        return transport
