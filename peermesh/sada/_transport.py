"""What is Safir-Darbaan's own in its sockets: a channel's identity, a server's monitor.

A channel's routing id is its endpoint, set before each bind attempt
(``bind_router``, ``bind_endpoint``); a server reads its ROUTER's monitor
events (a connection to a channel established) with ``read_monitor``. Both read
the frames every message has (the protocol's name, a command, a status) as the same
bytes objects each time (``read_known``).
"""

from __future__ import annotations

import logging
import struct
from typing import Any, Callable, Optional

import zmq

from ..io import zmqbatch
from ..io.endpoints import BindError
from ..io.endpoints import bind as _bind
from ..io.endpoints import bind_ephemeral
from ..io.socket import HubSocket

log = logging.getLogger(__name__)

_MONITOR_EVENT = struct.Struct("=HI")  # (zmq.utils.monitor would import asyncio)


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


def read_known(sock: HubSocket, known: Callable[[], tuple[bytes, ...]]) -> None:
    """Have ``sock`` (before anyone reads it) read a frame equal to one of ``known()``
    (asked per batch) as that very bytes object (one made once, its hash kept: quicker
    to compare and look up); nothing without the C extension's ``known``."""
    if not zmqbatch.knows_frames:
        return

    def wrap(read: Callable[..., list]) -> Callable[..., list]:
        def reader(count: int, limit: int, max_frames: int, name: Optional[str],
                   routes: Any = None) -> list:
            return read(count, limit, max_frames, name, routes, known())
        return reader
    sock.wrap_reader(wrap)
