"""Flux RFC 3 messaging: topic RPC, events and a k-ary tree overlay on its own sockets.

Start an instance on loopback (in a gevent program)::

    from peermesh.flux import FluxOverlay

    root = FluxOverlay(root=True, address="127.0.0.1").start()
    node = FluxOverlay(parents=[root.endpoint], address="127.0.0.1").start()
    node.wait_online(5)
    root.register("hello.world", lambda request: {"rank": 0})
    print(node.rpc("hello.world").get_json(5))     # {'rank': 0}

Or attach ``FluxOverlay()`` to ZRE nodes (``Node`` or ``ThreadedNode(overlays=[...])``):
the members of one mesh then elect the root and join it by themselves. A program that
only calls and listens is a ``FluxClient`` of one member and takes no rank.
See ``peermesh.flux.core`` (the node and its bounds; it names the modules of routing,
events and membership) and ``peermesh.flux.overlay`` (sockets, bootstrap).

The names below are imported on first use (``peermesh.flux.FluxOverlay`` loads the
overlay, its core and gevent), so that the command line, which imports
``peermesh.flux.commands``, builds its parser without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..wire.flux import NODEID_ANY, NODEID_UPSTREAM, Errno, MsgFlag
    from .client import FluxClient
    from .fluxmode import FluxModeMember
    from .core import FluxCore
    from .errors import FluxError, FluxOverlayError, FluxStateError
    from .handle import FluxHandle, FluxRequest, RpcFuture, Subscription
    from .outputs import Notice
    from .overlay import FLUX_HEADER, FluxOverlay, call_all
    from .settings import FluxSettings, State
    from .topology import Topology, TopologyError

_WHERE = {
    **dict.fromkeys(("NODEID_ANY", "NODEID_UPSTREAM", "Errno", "MsgFlag"), "..wire.flux"),
    "FluxClient": ".client",
    "FluxModeMember": ".fluxmode",
    "FluxCore": ".core",
    **dict.fromkeys(("FluxSettings", "State"), ".settings"),
    "Notice": ".outputs",
    **dict.fromkeys(("FluxError", "FluxOverlayError", "FluxStateError"), ".errors"),
    **dict.fromkeys(("FluxHandle", "FluxRequest", "RpcFuture", "Subscription"), ".handle"),
    **dict.fromkeys(("FluxOverlay", "FLUX_HEADER", "call_all"), ".overlay"),
    **dict.fromkeys(("Topology", "TopologyError"), ".topology"),
}
__all__ = ["FluxOverlay", "FluxClient", "FluxModeMember", "FluxHandle", "FluxRequest", "RpcFuture",
           "Subscription", "FluxError", "FluxOverlayError", "FluxStateError", "FluxSettings",
           "FluxCore", "Notice", "State", "Topology", "TopologyError", "NODEID_ANY",
           "NODEID_UPSTREAM", "MsgFlag", "Errno", "FLUX_HEADER", "call_all"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'peermesh.flux' has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
