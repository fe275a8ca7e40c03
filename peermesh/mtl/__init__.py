"""11/MTL: a gateway for clients off the LAN (credentials, durable content store)."""

from .credentials import (Authenticator, CredentialsError, CredentialsFile, SaslExchange,
                          SaslStep, Throttle, User, make_user)
from .store import ContentStore, Delivery, StoreFull
from .control import ControlFlow
from .dataflow import DataFlow
from .gateway import GATEWAY_HEADER, Gateway

__all__ = ["Authenticator", "CredentialsError", "CredentialsFile", "SaslExchange", "SaslStep",
           "Throttle", "User", "make_user", "ContentStore", "Delivery", "StoreFull",
           "ControlFlow", "DataFlow", "Gateway", "GATEWAY_HEADER"]
