"""11/MTL: a gateway for clients off the LAN (credentials, durable content store, client)."""

from .client import (AsyncClient, AuthenticationFailed, Client, ClientError,
                     GatewayUnavailable, Received, RequestRefused)
from .credentials import (Authenticator, CredentialsError, CredentialsFile, SaslExchange,
                          SaslStep, Throttle, User, make_user)
from .store import ContentStore, Delivery, StoreFull

__all__ = ["Authenticator", "CredentialsError", "CredentialsFile", "SaslExchange", "SaslStep",
           "Throttle", "User", "make_user", "ContentStore", "Delivery", "StoreFull",
           "Client", "AsyncClient", "Received", "ClientError", "GatewayUnavailable",
           "AuthenticationFailed", "RequestRefused"]
