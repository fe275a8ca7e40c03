"""Rankless clients of a member: peers on its ROUTER that are not part of the tree.

Pure bookkeeping (no messages, no clock), used by ``FluxCore``. A client
(``peermesh.flux.client.FluxClient``, or anything that speaks the same)
connects a DEALER to a member's ROUTER, as flux-core's local connector
clients connect to their broker without being brokers, and says
``peermesh.client`` first. Once accepted it sends requests (to any rank or a
given rank: routed as from that member, and answered down its routing
identity), subscribes to events by prefix (``event.subscribe`` /
``event.unsubscribe``, answered by the member itself) and gets the events
that match, in order. It takes no rank: the instance's size and rank 0's
directory do not count it.

Bounds: ``max_clients`` links per member (``peermesh.client`` answered
ENOSPC past it), ``client_prefixes`` subscriptions per client (EAGAIN past
it; each prefix at most 1024 characters). A client is forgotten when it
sends DISCONNECT, when a send finds its connection gone, or when it is
silent for ``lost`` seconds (it sends heartbeats when idle, and hears
them from the member).

Disconnects (flux-core's convention, its ``librouter/disconnect.c``): for
each request a client sends that expects a response, to a service that is
not built in, the member remembers the target once: the service, the
nodeid and the UPSTREAM flag (at most ``client_services`` targets per
client; requests past it go on, unremembered, and are counted). When the
client is forgotten, for whatever reason, the member sends each target a
``<service>.disconnect`` request (NORESPONSE, no payload) routed as from the
client, so it takes the same path as the client's requests and arrives with
the same route stack; the service drops what it holds from that sender
(``FluxHandle`` ends the streams whose routes match, as if cancelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional

__all__ = ["ClientLink", "ClientTable"]


@dataclass(slots=True)
class ClientLink:
    """One client link on a member's ROUTER."""

    identity: bytes
    heard: float
    sent: float
    prefixes: set[str] = field(default_factory=set)
    #: (service, nodeid, UPSTREAM flag) of the requests it sent: told of its going
    targets: set[tuple[str, int, int]] = field(default_factory=set)


class ClientTable:
    """The clients of one member, by routing identity."""

    def __init__(self, limit: int, max_prefixes: int, max_targets: int = 64) -> None:
        self.limit = limit
        self.max_prefixes = max_prefixes
        self.max_targets = max_targets
        #: targets past ``max_targets`` that will not be told of their client's going
        self.untracked = 0
        self.clients: dict[bytes, ClientLink] = {}
        #: clients with at least one prefix (0: events need not look at clients)
        self.subscribed = 0

    def __len__(self) -> int:
        return len(self.clients)

    def get(self, identity: bytes) -> Optional[ClientLink]:
        return self.clients.get(identity)

    def accept(self, identity: bytes, now: float) -> bool:
        """Take ``identity`` as a client (again); False when ``limit`` clients are connected."""
        if identity not in self.clients and len(self.clients) >= self.limit:
            return False
        self.clients.setdefault(identity, ClientLink(identity, now, now)).heard = now
        return True

    def forget(self, identity: bytes) -> Optional[ClientLink]:
        """Forget the client at ``identity``; what it was (None for a stranger)."""
        client = self.clients.pop(identity, None)
        if client is not None and client.prefixes:
            self.subscribed -= 1
        return client

    def arm(self, client: ClientLink, service: str, nodeid: int, upstream: int) -> None:
        """Remember that ``client`` sent ``service`` a request (see the module's docstring)."""
        target = (service, nodeid, upstream)
        if target not in client.targets:
            if len(client.targets) >= self.max_targets:
                self.untracked += 1
            else:
                client.targets.add(target)

    def subscribe(self, client: ClientLink, prefix: str) -> bool:
        """Add ``prefix``; False when the client has ``max_prefixes`` already."""
        if prefix not in client.prefixes and len(client.prefixes) >= self.max_prefixes:
            return False
        if not client.prefixes:
            self.subscribed += 1
        client.prefixes.add(prefix)
        return True

    def unsubscribe(self, client: ClientLink, prefix: str) -> None:
        if prefix in client.prefixes:
            client.prefixes.discard(prefix)
            if not client.prefixes:
                self.subscribed -= 1

    def subscribers(self, topic: str) -> Iterator[ClientLink]:
        """The clients with a prefix of ``topic``."""
        for client in self.clients.values():
            if any(topic.startswith(prefix) for prefix in client.prefixes):
                yield client

    def silent_since(self, when: float) -> list[ClientLink]:
        """The clients not heard from since ``when``."""
        return [c for c in self.clients.values() if c.heard < when]
