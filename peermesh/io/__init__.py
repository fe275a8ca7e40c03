"""The one place that drives ZeroMQ sockets on the gevent hub.

``make_socket`` makes every socket (from ``shared_context()``), ``bind`` and
``bind_ephemeral`` say where it listens (``BindError`` when it cannot),
``HubSocket`` reads, writes and waits on it cooperatively, and a
``GuardedListener`` keeps a listening ROUTER under the process's
``ConnectionPolicy`` (caps, shedding, EMFILE, revoked keys).
"""

from .connections import ConnectionPolicy, GuardedListener
from .endpoints import BindError, bind, bind_ephemeral
from .context import shared_context
from .socket import HubSocket, make_socket

__all__ = ["BindError", "ConnectionPolicy", "GuardedListener", "HubSocket", "bind",
           "bind_ephemeral", "make_socket", "shared_context"]
