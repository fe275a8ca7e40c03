"""The one place that drives ZeroMQ sockets on the gevent hub.

``make_socket`` makes every socket (from ``shared_context()``), ``bind`` and
``bind_ephemeral`` say where it listens (``BindError`` when it cannot), and
``HubSocket`` reads, writes and waits on it cooperatively.
"""

from .endpoints import BindError, bind, bind_ephemeral
from .context import shared_context
from .socket import HubSocket, make_socket

__all__ = ["BindError", "HubSocket", "bind", "bind_ephemeral", "make_socket", "shared_context"]
