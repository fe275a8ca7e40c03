"""What is Safir-Darbaan's own in its sockets: frame layouts, limits, identities, monitors.

Channels and servers each read and write one ROUTER, a ``RouterSocket``: the
I/O layer's ``HubSocket`` (drained on the hub, whole-message sends, the edge
re-armed after a send) with the two sends every request crosses, REQ and REP,
laid out here, ROUTER_MANDATORY failures raised, every message's
``Peer-Address`` handed on (a channel records where a server introduced
itself from), and messages of more than ``max_frames`` frames dropped. A
channel's routing id is its endpoint, set before each bind attempt.
"""

from __future__ import annotations

import logging
import struct
from typing import Callable, Optional, Sequence

import zmq

from ..io.endpoints import BindError
from ..io.endpoints import bind as _bind
from ..io.endpoints import bind_ephemeral
from ..io.socket import HubSocket, is_closed
from ..wire.sada import DELIMITER, PROTOCOL, Command

log = logging.getLogger(__name__)

_REQ, _REP = Command.REQ.frame, Command.REP.frame
_MONITOR_EVENT = struct.Struct("=HI")  # (zmq.utils.monitor would import asyncio)

#: (routing id, frames after it, the sender's Peer-Address or None)
MessageHandler = Callable[[bytes, list, Optional[str]], None]


class RouterSocket(HubSocket):
    """A channel's or server's ROUTER, read on the hub and written by any greenlet of it."""

    __slots__ = ()

    def send(self, identity: bytes, frames: Sequence[bytes]) -> None:
        """Send ``identity`` + ``frames`` as one message without blocking.

        With ROUTER_MANDATORY, an unknown identity raises ``zmq.ZMQError``
        (EHOSTUNREACH) and a full pipe ``zmq.Again``; nothing is half-sent.
        """
        if is_closed(self.socket):
            raise zmq.ZMQError(zmq.ENOTSOCK)
        if not self.try_send([identity, *frames]):
            raise zmq.Again()

    def send_req(self, identity: bytes, request_id: bytes, service: bytes, version: bytes,
                 category: bytes, action: bytes, payload: bytes) -> None:
        """Send a REQ (frames 1-9 after ``identity``); raises as ``send`` does."""
        if is_closed(self.socket):
            raise zmq.ZMQError(zmq.ENOTSOCK)
        if not self.try_send((identity, DELIMITER, PROTOCOL, _REQ, request_id, service, version,
                              category, action, payload)):
            raise zmq.Again()

    def send_rep(self, identity: bytes, request_id: bytes, status: bytes, payload: bytes) -> None:
        """Send a REP (frames 1-6 after ``identity``); raises as ``send`` does."""
        if is_closed(self.socket):
            raise zmq.ZMQError(zmq.ENOTSOCK)
        if not self.try_send((identity, DELIMITER, PROTOCOL, _REP, request_id, status, payload)):
            raise zmq.Again()

    def poll(self) -> bool:
        """True when a message waits; then a drain is scheduled (use instead of EVENTS)."""
        return self.readable()

    def drain_pending(self, batches: int = 16) -> None:
        """Handle what is readable now, here and at once (see ``HubSocket.drain``)."""
        self.drain(batches)

    def serve(self, on_message: MessageHandler, max_frames: int,  # type: ignore[override]
              on_oversized: Optional[Callable[[bytes], None]] = None) -> None:
        """Call ``on_message(identity, frames, peer_address)`` on the hub until killed.

        A message with more than ``max_frames`` frames after the identity is
        read to its end and dropped (``on_oversized``).
        """
        self.max_frames = max_frames
        super().serve(on_message, on_oversized or _dropped, metadata="Peer-Address")


def _dropped(identity: bytes) -> None:
    log.debug("dropped an oversized message from %r", identity)


def read_monitor(monitor: zmq.Socket, on_event: Callable[[int, str], None]) -> None:
    """Read a monitor socket until killed, calling ``on_event(event, endpoint)``."""

    def on_message(first: bytes, rest: list[bytes]) -> None:
        # frame 0: event (16 bits) and value (32 bits), native order; frame 1: endpoint
        event, _ = _MONITOR_EVENT.unpack(first)
        on_event(event, rest[0].decode("utf-8", "replace"))

    reader = HubSocket(monitor)
    try:
        reader.serve(on_message)
    finally:
        reader.close()


def stop_monitor(sock: zmq.Socket) -> None:
    """Stop ``sock``'s monitor while the reading end is still open.

    libzmq sends monitor events blocking, holding the socket's monitor lock:
    an event sent after the reading end closed would wait forever, and so
    would every later call that needs the lock. So the monitor stops first,
    then its reader closes.
    """
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass  # already closed or never monitored


def close_monitored(sock: zmq.Socket, monitor: Optional[zmq.Socket], linger: int) -> None:
    """Close ``sock`` and its monitor socket (``linger`` ms for what ``sock`` still holds)."""
    stop_monitor(sock)
    if monitor is not None:
        monitor.close(linger=0)
    sock.close(linger=linger)


def _set_identity(sock: zmq.Socket) -> Callable[[str], None]:
    """Before each bind attempt: the channel's routing id is the endpoint it binds."""
    return lambda endpoint: sock.setsockopt(zmq.ROUTING_ID, endpoint.encode("utf-8"))


def bind_router(sock: zmq.Socket, address: str, port: int) -> str:
    """Bind ``sock`` at ``tcp://address:port`` (``port`` 0: a random free one), its
    routing id set to that endpoint; the endpoint, or ``BindError``."""
    if port:
        return _bind(sock, f"tcp://{address}:{port}", _set_identity(sock))
    return bind_ephemeral(sock, address, _set_identity(sock))


def bind_endpoint(sock: zmq.Socket, endpoint: str) -> str:
    """Bind ``sock`` at an explicit endpoint (``tcp://ip:port`` or ``ipc://...``),
    its routing id set to that endpoint; the endpoint, or ``BindError``."""
    if endpoint.startswith("tcp://"):
        host = endpoint[6:].rpartition(":")[0]
        if host in ("*", "0.0.0.0", ""):
            raise BindError(f"cannot bind {endpoint}: a channel's identity is its public "
                            "endpoint, so bind a concrete address, not a wildcard")
    return _bind(sock, endpoint, _set_identity(sock))
