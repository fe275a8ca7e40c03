"""Flux RFC 3 messaging: topic RPC, events and a k-ary tree overlay on its own sockets.

Start an instance on loopback (in a gevent program)::

    from peermesh.flux import FluxOverlay

    root = FluxOverlay(root=True, address="127.0.0.1").start()
    node = FluxOverlay(parents=[root.endpoint], address="127.0.0.1").start()
    node.wait_online(5)
    root.register("hello.world", lambda request: {"rank": 0})
    print(node.rpc("hello.world").get_json(5))     # {'rank': 0}

Or attach ``FluxOverlay()`` to ZRE nodes (``Node`` or ``ThreadedNode(overlays=[...])``):
the members of one mesh then elect the root and join it by themselves.
See ``peermesh.flux.core`` (routing, events, membership, bounds) and
``peermesh.flux.overlay`` (sockets, bootstrap).
"""

from ..wire.flux import NODEID_ANY, NODEID_UPSTREAM, Errno, MsgFlag
from .core import FluxCore, FluxSettings, Notice, State
from .errors import FluxError, FluxStateError
from .handle import FluxHandle, FluxRequest, RpcFuture, Subscription
from .overlay import FLUX_HEADER, FluxOverlay, call_all
from .topology import Topology, TopologyError

__all__ = ["FluxOverlay", "FluxHandle", "FluxRequest", "RpcFuture", "Subscription", "FluxError",
           "FluxStateError", "FluxSettings", "FluxCore", "Notice", "State", "Topology",
           "TopologyError", "NODEID_ANY", "NODEID_UPSTREAM", "MsgFlag", "Errno", "FLUX_HEADER",
           "call_all"]
