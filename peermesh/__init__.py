"""peermesh: brokerless peer meshes on the LAN, speaking ZRE v2 on gevent and pyzmq."""

from .config import NodeConfig
from .errors import (AmbiguousPeerError, InterfaceError, NodeStateError, PeermeshError, PeerNotResponding,
                     ProtocolError, UnknownPeerError)
from .events import Event, EventType
from .node import Node, PeerInfo

__all__ = [
    "Node", "ThreadedNode", "NodeConfig", "Event", "EventType", "PeerInfo",
    "PeermeshError", "ProtocolError", "InterfaceError", "UnknownPeerError", "AmbiguousPeerError",
    "PeerNotResponding", "NodeStateError",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # ThreadedNode pulls in threading machinery most gevent programs never need.
    if name == "ThreadedNode":
        from .threaded import ThreadedNode
        return ThreadedNode
    raise AttributeError(f"module 'peermesh' has no attribute {name!r}")
