"""peermesh: brokerless peer meshes on the LAN, speaking ZRE v2 on gevent and pyzmq."""

from .config import NodeConfig
from .errors import (AmbiguousPeerError, InterfaceError, NodeStateError, PeermeshError, PeerNotResponding,
                     ProtocolError, UnknownPeerError)
from .events import Event, EventType
from .node import Node, PeerInfo
from .threaded import ThreadedNode

__all__ = [
    "Node", "ThreadedNode", "NodeConfig", "Event", "EventType", "PeerInfo",
    "PeermeshError", "ProtocolError", "InterfaceError", "UnknownPeerError", "AmbiguousPeerError",
    "PeerNotResponding", "NodeStateError",
]

__version__ = "0.1.0"
