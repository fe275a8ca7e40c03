"""The overlay contract: what every role riding on a node advertises and how it lives.

An overlay (a Safir-Darbaan channel or server, an NFP worker, client or
broker, the Spark log service, later Flux and MTL) is an ``Overlay``: it names
its ``roles``, gives the HELLO ``headers`` it advertises, is ``attach``-ed to a
node before the node starts, then ``start``-ed and ``stop``-ped on that node's
hub. ``attach`` merges every overlay's roles into one ``X-PM-ROLES`` header.
The one thread-safe facade (``ThreadedNode(overlays=...)``) and the asyncio
face drive any overlay through this contract, so no overlay writes a thread
bridge of its own.

Broker election is neutral and lives here too: ``election`` (the pure
decision, ``X-PM-BROKER``) and ``broker`` (``BrokerTracker``, the overlay
that follows one node's view), so any overlay can ride on the elected node.
"""

from .contract import (ROLES_HEADER, Lifecycle, Overlay, PeerNetworks, advertise,
                       header_endpoint, header_json, roles_of)

__all__ = ["ROLES_HEADER", "Lifecycle", "Overlay", "PeerNetworks", "advertise", "header_endpoint",
           "header_json", "roles_of"]
