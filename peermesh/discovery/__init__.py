"""Pluggable sources of "a peer's mailbox appeared / is alive / left".

A source is started with the ``PeerSink`` it serves (a node) and reports
through three calls on it, all made on the sink's hub:

* ``sink.peer_appeared(uuid, endpoint)`` - a node with this UUID accepts
  connections at ``endpoint`` (``tcp://ip:port``);
* ``sink.peer_alive(uuid)`` - a sign of life from a known peer;
* ``sink.peer_left(uuid, address)`` - the peer said it is leaving; ``address``
  is where that came from (None when the source cannot tell), and the sink
  heeds it only from the peer's own address.

Sources: ``BeaconDiscovery`` (UDP beacons, broadcast and/or unicast to seeds;
the ZRE default) and ``MdnsDiscovery`` (DNS-SD through zeroconf). Several may
run at once; a node built from a ``NodeConfig`` picks them from its
``discovery`` and ``seeds`` settings.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol
from uuid import UUID

from ..config import NodeConfig
from ..events import Event
from ..net.interfaces import Interface

__all__ = ["Discovery", "PeerSink"]


class PeerSink(Protocol):
    """What a discovery source announces and reports to: a started node."""

    @property
    def uuid(self) -> UUID:
        """The UUID to announce."""

    @property
    def name(self) -> str:
        """The public name (mDNS uses it in its instance name)."""

    @property
    def config(self) -> NodeConfig:
        """Beacon port and interval."""

    @property
    def transport(self) -> Any:
        """Where beacon sockets and sleeps come from (``beacon_socket``, ``sleep``)."""

    @property
    def interface(self) -> Optional[Interface]:
        """The interface the mailbox is on."""

    @property
    def endpoint(self) -> Optional[str]:
        """The mailbox, ``tcp://ip:port``."""

    @property
    def mailbox_port(self) -> int:
        """The mailbox's port."""

    @property
    def public_key(self) -> Optional[bytes]:
        """The node's CURVE public key (32 octets) for version-3 beacons, or None."""

    def peer_appeared(self, uuid: UUID, endpoint: str, key: Optional[bytes] = None) -> None:
        """``uuid`` accepts connections at ``endpoint`` (``key``: its beacon's CURVE key)."""

    def peer_alive(self, uuid: UUID) -> None:
        """A sign of life from ``uuid``."""

    def peer_left(self, uuid: UUID, address: Optional[str] = None,
                  key: Optional[bytes] = None) -> None:
        """``uuid`` said it is leaving, in a message from ``address`` (with ``key``) if known."""

    def add_listener(self, callback: Callable[[Event], None], messages: bool = True) -> None:
        """Call ``callback`` with every event of the node (``messages=False``: but its
        WHISPERs and SHOUTs)."""

    def remove_listener(self, callback: Callable[[Event], None]) -> None:
        """Stop calling ``callback``."""


class Discovery(Protocol):
    """What a discovery source does for a node."""

    def start(self, node: PeerSink) -> None:
        """Begin announcing ``node`` and reporting peers to it (called on its hub)."""

    def stop(self) -> None:
        """Tell peers this node is leaving where the mechanism can, and release resources."""
