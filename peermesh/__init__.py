"""peermesh: brokerless peer meshes on the LAN, speaking ZRE v2 on gevent and pyzmq.

The public names below are imported on first use, so that a command which
only talks to a running agent does not pay for gevent and the node.
"""

from __future__ import annotations

from importlib import import_module

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the CLI's agent path)
if TYPE_CHECKING:
    from .config import NodeConfig
    from .errors import (AmbiguousPeerError, InterfaceError, LocalProtocolError,
                         NodeStateError, PeermeshError, PeerNotResponding, ProtocolError,
                         RemoteProtocolError, UnknownPeerError)
    from .events import Event, EventType
    from .zre.node import Node, PeerInfo
    from .zre.threaded import ThreadedNode
    from .aio import AsyncNode

__all__ = [
    "Node", "ThreadedNode", "AsyncNode", "NodeConfig", "Event", "EventType", "PeerInfo",
    "PeermeshError", "ProtocolError", "InterfaceError", "UnknownPeerError", "AmbiguousPeerError",
    "PeerNotResponding", "NodeStateError", "LocalProtocolError", "RemoteProtocolError",
]

__version__ = "0.1.0"

_HOMES = {
    "Node": "zre.node", "PeerInfo": "zre.node", "ThreadedNode": "zre.threaded", "AsyncNode": "aio",
    "NodeConfig": "config",
    "Event": "events", "EventType": "events",
    **{name: "errors" for name in ("PeermeshError", "ProtocolError", "InterfaceError",
                                   "UnknownPeerError", "AmbiguousPeerError",
                                   "PeerNotResponding", "NodeStateError",
                                   "LocalProtocolError", "RemoteProtocolError")},
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'peermesh' has no attribute {name!r}")
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
