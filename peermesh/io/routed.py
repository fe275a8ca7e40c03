"""One ROUTER that connects out to many endpoints, each connection a link of the driver.

A Safir-Darbaan server has one transient ROUTER and connects it to every
channel it serves, each connection under a routing id of the server's choice
(``ZMQ_CONNECT_ROUTING_ID``). ``connecting_router`` makes that socket (the
transport's context and keys: a CURVE client, its server key set per
connection) as a ``ConnectingRouter``, which a ``Driver`` serves as its
mailbox: what a connection brings is named by its routing id. ``RoutedTransport``
is the transport that driver is given: its ``connect`` opens a connection of the
router, a ``RoutedLink`` (``Dial`` with the routing id as the link's name and
identity), and closing that link disconnects it; its clock is the real one's.
The router closes with the linger it was made with (the last replies go out
whatever its driver says).

Its driver's ``look_once`` option looks at the router once after a batch's sends,
not after each (a ``RoutedLink`` passes ``look`` on and is ``readable`` as the
router).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import zmq

from .curve import Curve
from .socket import HubSocket, make_socket
from .transport import MessageHandler, ZmqTransport

__all__ = ["ConnectingRouter", "RoutedLink", "RoutedTransport", "connecting_router"]

log = logging.getLogger(__name__)


def connecting_router(transport: ZmqTransport, options: Mapping[int, Union[int, bytes]], *,
                      max_message: int, max_frames: int, linger: float) -> "ConnectingRouter":
    """A ROUTER of ``transport``'s context with ``options`` (a CURVE client of each
    endpoint's key when the transport has keys) that connects out; messages over
    ``max_message`` octets or ``max_frames`` frames after the routing id are dropped."""
    curve = transport.curve
    sock = make_socket(zmq.ROUTER, {zmq.ROUTER_MANDATORY: 1, zmq.MAXMSGSIZE: max_message,
                                    **options},
                       transport.context, curve=curve,
                       server_key=b"" if curve is not None else None)
    return ConnectingRouter(HubSocket(sock, limit=max_message, max_frames=max_frames),
                            secure=curve is not None, linger=linger)


class ConnectingRouter:
    """The mailbox side of a connecting ROUTER (``serve``, ``try_send``, ``close``)."""

    #: ``serve`` takes ``take`` (``HubSocket.serve``)
    takes_batches = True

    def __init__(self, hub: HubSocket, *, secure: bool, linger: float) -> None:
        self.hub = hub
        self.serve, self.try_send, self.readable = hub.serve, hub.try_send, hub.readable
        self.try_send_each = hub.try_send_each
        self.secure = secure
        self.linger = linger
        self.endpoint = ""
        self.port = 0
        self._monitor: Optional[zmq.Socket] = None

    @property
    def closed(self) -> bool:
        return self.hub.closed

    def connect(self, identity: bytes, endpoint: str,
                server_key: Optional[bytes] = None) -> None:
        """Connect to ``endpoint`` under routing id ``identity`` (a CURVE client of
        ``server_key`` when the router speaks CURVE); ``zmq.ZMQError`` if it cannot."""
        sock = self.hub.socket
        sock.setsockopt(zmq.CONNECT_ROUTING_ID, identity)
        if self.secure and server_key is not None:
            Curve.connect(sock, endpoint, server_key)
        else:
            sock.connect(endpoint)

    def disconnect(self, endpoint: str) -> None:
        """Drop the connection to ``endpoint`` (nothing if there is none, or closed)."""
        if not self.hub.closed:
            try:
                self.hub.socket.disconnect(endpoint)
            except zmq.ZMQError:
                pass

    def monitor(self, events: int) -> zmq.Socket:
        """A socket reporting the router's monitor ``events`` (read it until closed)."""
        self._monitor = self.hub.socket.get_monitor_socket(events)
        return self._monitor

    def stop_monitor(self) -> None:
        """Stop the monitor while its reader is still open (libzmq sends monitor events
        blocking, holding the socket's monitor lock: one sent after the reader closed
        would wait forever, and so would every later call that needs the lock)."""
        if self._monitor is not None and not self.hub.closed:
            try:
                self.hub.socket.disable_monitor()
            except zmq.ZMQError:
                pass  # already closed

    def close(self, linger: float = 0.0) -> None:
        """Stop the monitor, then close, letting what is queued go out for the router's
        ``linger``."""
        if self.hub.closed:
            return
        self.stop_monitor()
        if self._monitor is not None:
            self._monitor.close(linger=0)
        self.hub.close(max(linger, self.linger))


class RoutedLink:
    """One connection of a ``ConnectingRouter``: the ``Link`` a driver sends on.

    ``try_send(frames, look=True)`` sends ``frames`` down this connection (``look``: as
    ``HubSocket.try_send``'s); ``addressed``: they start with its routing id already (the
    router's own ``try_send``, no copy; and ``try_send_each`` sends several in one call)."""

    __slots__ = ("router", "identity", "endpoint", "closed", "try_send", "try_send_each")

    def __init__(self, router: ConnectingRouter, identity: bytes, endpoint: str,
                 addressed: bool = False) -> None:
        self.router, self.identity, self.endpoint = router, identity, endpoint
        self.closed = False
        self.try_send: Callable[..., bool] = router.try_send if addressed else self._prefixed
        self.try_send_each: Optional[Callable[..., int]] = (router.try_send_each if addressed
                                                             else None)

    def _prefixed(self, frames: Sequence[bytes], look: bool = True) -> bool:
        return self.router.try_send([self.identity, *frames], look)

    def readable(self) -> bool:
        return self.router.readable()

    def wait_writable(self, timeout: Optional[float] = None) -> bool:
        return self.router.hub.wait_writable(timeout)

    def serve(self, on_message: MessageHandler, on_oversized: Any = None,
              backpressure: Any = None, *,
              after_batch: Optional[Callable[[], None]] = None) -> None:
        """Nothing to read: what the far end sends comes through the router."""

    def close(self, linger: float = 0.0) -> None:
        if not self.closed:
            self.closed = True
            self.router.disconnect(self.endpoint)


class RoutedTransport:
    """The transport of a driver whose mailbox is a ``ConnectingRouter``; ``addressed``:
    what is sent on its links starts with the link's routing id already."""

    def __init__(self, base: ZmqTransport, router: ConnectingRouter, *,
                 addressed: bool = False) -> None:
        self.base, self.router = base, router
        self.addressed = addressed
        self.now, self.sleep = base.now, base.sleep

    def connect(self, identity: bytes, endpoint: str, sndhwm: int,
                server_key: Optional[bytes] = None, handover: bool = False,
                max_message: Optional[int] = None) -> RoutedLink:
        """A connection of the router to ``endpoint`` under routing id ``identity`` (one
        that cannot be made is logged, and its link sends nowhere)."""
        link = RoutedLink(self.router, identity, endpoint, self.addressed)
        try:
            self.router.connect(identity, endpoint, server_key)
        except zmq.ZMQError as exc:
            log.warning("cannot connect to %r: %s", endpoint, exc)
        return link

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)
