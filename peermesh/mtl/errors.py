"""Errors of the 11/MTL overlay: every one is an ``MtlError`` (a ``PeermeshError``)."""

from __future__ import annotations

from ..errors import PeermeshError

__all__ = ["MtlError", "ClientError", "GatewayUnavailable", "AuthenticationFailed",
           "RequestRefused"]


class MtlError(PeermeshError):
    """Base class of the 11/MTL errors (client, gateway, credentials, content store)."""


class ClientError(MtlError):
    """An MTL client call failed."""


class GatewayUnavailable(ClientError):
    """No gateway answered in time."""


class AuthenticationFailed(ClientError):
    """The gateway refused the credentials (or could not prove it holds them)."""


class RequestRefused(ClientError):
    """The gateway answered a request with an error status (``status``, ``reason``)."""

    def __init__(self, what: str, status: int, reason: str = "") -> None:
        super().__init__(f"{what}: {status}{' ' + reason if reason else ''}")
        self.status = status
        self.reason = reason
