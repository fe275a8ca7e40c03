"""Exceptions of the Safir-Darbaan overlay (all ``peermesh.PeermeshError``)."""

from __future__ import annotations

from typing import Optional

from ..errors import PeermeshError
from ..io.endpoints import BindError

__all__ = ["SadaError", "ServiceError", "NoServerError", "RequestTimeout", "ServerLost",
           "ChannelClosed", "EndpointError", "CatalogFull"]


class SadaError(PeermeshError):
    """Base class of the Safir-Darbaan errors."""


class ServiceError(SadaError):
    """A request ended with a status of 400 or more; ``status`` and ``message`` say why.

    Raised by ``Channel.request`` for an error REP, and by handlers that want to
    answer with a particular status (``raise ServiceError(409, "already there")``).
    ``server`` is the id of the server that answered (None when raised locally).
    """

    def __init__(self, status: int, message: str, *, request_id: Optional[bytes] = None,
                 server: Optional[str] = None) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.request_id = request_id
        self.server = server


class NoServerError(ServiceError):
    """No server offered the service (status 404) or a compatible version (406) in time.

    Raised by the channel itself: nothing was sent.
    """


class RequestTimeout(SadaError):
    """No reply came within the request's timeout.

    ``server`` is the id of the last server the request was sent to,
    ``attempts`` how many servers it was sent to.
    """

    def __init__(self, message: str, *, request_id: Optional[bytes] = None,
                 server: Optional[str] = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.server = server
        self.attempts = attempts


class ServerLost(RequestTimeout):
    """The server died (no REP and no PONG within the dead multiple, or disconnected)
    while it held the request, and the request had no retries left.

    The handler may or may not have run: only idempotent requests should be
    retried (``retries=``).
    """


class ChannelClosed(SadaError):
    """The channel was stopped (or never started) while the request waited."""


class EndpointError(SadaError, BindError):
    """An endpoint that cannot be used: not ``tcp://HOST:PORT`` or ``ipc://PATH``, a port
    outside 1-65535, a host that does not resolve, or an address that cannot be bound."""


class CatalogFull(SadaError):
    """A server would offer more services than one INTR may list (``max_services``):
    channels would drop the whole INTR unread, so the service is not added."""
