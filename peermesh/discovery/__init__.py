"""Pluggable sources of "a peer's mailbox appeared / is alive / left".

A source is started with the node it serves and reports through three
calls on it, all made on the node's hub:

* ``node.peer_appeared(uuid, endpoint)`` - a node with this UUID accepts
  connections at ``endpoint`` (``tcp://ip:port``);
* ``node.peer_alive(uuid)`` - a sign of life from a known peer;
* ``node.peer_left(uuid)`` - the peer said it is leaving.

Sources: ``BeaconDiscovery`` (UDP beacons, broadcast and/or unicast to seeds;
the ZRE default) and ``MdnsDiscovery`` (DNS-SD through zeroconf). Several may
run at once; a node built from a ``NodeConfig`` picks them from its
``discovery`` and ``seeds`` settings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["Discovery"]


class Discovery(Protocol):
    """What a discovery source does for a node."""

    def start(self, node: "Node") -> None:
        """Begin announcing ``node`` and reporting peers to it (called on its hub)."""

    def stop(self) -> None:
        """Tell peers this node is leaving where the mechanism can, and release resources."""
