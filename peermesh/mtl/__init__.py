"""11/MTL: a gateway for clients off the LAN (credentials, durable content store, control
and data flows, the gateway, the client).

The names below are imported on first use (``peermesh.mtl.Client`` loads the client
and pyzmq, ``peermesh.mtl.Gateway`` the gateway and gevent, ``peermesh.mtl.CredentialsFile``
the credentials and scramp), so that the command line, which imports
``peermesh.mtl.commands``, stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import (AsyncClient, AuthenticationFailed, Client, ClientError,
                         GatewayUnavailable, Received, RequestRefused)
    from .control import ControlFlow
    from .credentials import (Authenticator, CredentialsError, CredentialsFile, SaslExchange,
                              SaslStep, Throttle, User, make_user)
    from .dataflow import DataFlow
    from .errors import MtlError
    from .gateway import GATEWAY_HEADER, Gateway
    from .store import ContentStore, Delivery, StoreFull

_WHERE = {
    **dict.fromkeys(("Authenticator", "CredentialsError", "CredentialsFile", "SaslExchange",
                     "SaslStep", "Throttle", "User", "make_user"), "credentials"),
    **dict.fromkeys(("ContentStore", "Delivery", "StoreFull"), "store"),
    "ControlFlow": "control",
    "DataFlow": "dataflow",
    "MtlError": "errors",
    **dict.fromkeys(("Gateway", "GATEWAY_HEADER"), "gateway"),
    **dict.fromkeys(("Client", "AsyncClient", "Received", "ClientError", "GatewayUnavailable",
                     "AuthenticationFailed", "RequestRefused"), "client"),
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'peermesh.mtl' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
