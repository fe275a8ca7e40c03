"""``Overlay``: the base every overlay implements, and the one roles header.

Life cycle (one table, the same for every overlay)::

    NEW --attach(node)--> ATTACHED --start()--> RUNNING --stop()--> STOPPED
    NEW/ATTACHED --stop()--> STOPPED          (nothing was running)

``attach`` runs before the node starts (HELLO headers are sent once per
connection, so they must be set first); ``start`` runs on the node's hub
once the node has started, ``stop`` on the hub before the node stops. A
second ``attach``, an ``attach`` to a running node, a ``start`` before
``attach`` or before the node started, a second ``start`` and a ``start``
after ``stop`` raise ``NodeStateError``; ``stop`` is idempotent.
"""

from __future__ import annotations

import enum
import logging
from typing import TYPE_CHECKING, Any, ClassVar, Iterable, Mapping, Optional

from ..counters import Counters
from ..errors import NodeStateError
from ..io.endpoints import Network, as_networks, peer_endpoint
from ..wire import jsonsafe

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["ROLES_HEADER", "Lifecycle", "Overlay", "advertise", "roles_of", "header_endpoint",
           "header_json", "PeerNetworks", "MALFORMED_HEADERS"]

log = logging.getLogger(__name__)

#: HELLO header listing every role a node plays, comma-separated (``sada-channel,nfp-worker``)
ROLES_HEADER = "X-PM-ROLES"


class Lifecycle(enum.Enum):
    """Where an overlay is in its life."""

    NEW = "new"
    ATTACHED = "attached"
    RUNNING = "running"
    STOPPED = "stopped"


def roles_of(headers: Mapping[str, str]) -> list[str]:
    """The roles a peer's (or our own) HELLO headers advertise, in order."""
    return [role for role in headers.get(ROLES_HEADER, "").split(",") if role]


#: malformed overlay HELLO headers seen in this process, per header; logged at DEBUG at
#: most once every ``REPORT_PERIOD`` seconds with the last one's reason
MALFORMED_HEADERS = Counters(log, "malformed HELLO headers dropped", level=logging.DEBUG)

#: octets of one overlay header's JSON value (a HELLO holds at most ``max_hello`` in all)
MAX_HEADER_JSON = 16 * 1024


def header_json(raw: Optional[str], header: str) -> Any:
    """The JSON value of the HELLO header ``header`` (``raw``, a remote sender's text);
    None if absent, or if malformed, too long or too deep (counted in
    ``MALFORMED_HEADERS``, logged at debug, rate limited): never an exception."""
    if not raw:
        return None
    try:
        return jsonsafe.loads(raw, MAX_HEADER_JSON, jsonsafe.HEADER_DEPTH)
    except ValueError as exc:
        MALFORMED_HEADERS.over(header, str(exc))
        return None


def header_endpoint(raw: Optional[str], key: str, header: str = "") -> Optional[str]:
    """The ``tcp://`` endpoint under ``key`` in a JSON object header (an overlay's
    advertised socket); None if the header is absent or malformed."""
    data = header_json(raw, header or key)
    endpoint = data.get(key) if isinstance(data, dict) else None
    if isinstance(endpoint, str) and endpoint.startswith("tcp://") and endpoint.isprintable() \
            and len(endpoint) < 256:
        return endpoint
    return None


class PeerNetworks:
    """Where endpoints named in peers' HELLO headers may be, for an overlay to connect to.

    ``networks`` (CIDR strings) or, if None, the network of the node's
    interface; see ``peermesh.io.endpoints.peer_endpoint`` for the rule.
    ``admit`` counts each refusal as ``peer_networks`` in ``limits`` (logged
    once per interval).
    """

    __slots__ = ("_networks", "limits")

    def __init__(self, networks: Optional[Iterable[str]], limits: Counters) -> None:
        self._networks: Optional[list[Network]] = (
            None if networks is None else as_networks(networks))
        self.limits = limits

    def of(self, node: Any) -> list[Network]:
        """The networks endpoints on ``node``'s mesh may be in."""
        if self._networks is not None:
            return self._networks
        interface = getattr(node, "interface", None)
        return [interface.network] if interface is not None else []

    def admit(self, endpoint: str, node: Any, what: str) -> bool:
        """Whether this node may connect to ``endpoint``, a ``what`` a peer named."""
        networks = self.of(node)
        if peer_endpoint(endpoint, networks) is not None:
            return True
        self.limits.over("peer_networks", f"ignored {what} {endpoint[:80]!r} from the mesh: "
                         f"not tcp://IP:PORT in {', '.join(map(str, networks)) or 'no network'}")
        return False


def advertise(node: "Node", headers: Mapping[str, str], roles: tuple[str, ...] = ()) -> None:
    """Set ``headers`` on ``node`` (not yet started) and add ``roles`` to its roles header."""
    for key, value in headers.items():
        node.set_header(key, value)
    merged = list(dict.fromkeys(roles_of(node.headers) + list(roles)))
    if merged:
        node.set_header(ROLES_HEADER, ",".join(merged))


class Overlay:
    """A role riding on one node: subclasses set ``roles`` and override the ``on_*`` hooks.

    The public methods keep the life cycle; the hooks do the overlay's work:
    ``headers()`` (what it advertises), ``on_attach(node)`` (listeners, state
    that needs the node), ``on_start()`` and ``on_stop(timeout)``.
    """

    #: the roles this overlay adds to ``X-PM-ROLES``
    roles: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.lifecycle = Lifecycle.NEW
        self.node: Optional["Node"] = None

    # --- what subclasses provide ------------------------------------------------

    def headers(self) -> dict[str, str]:
        """HELLO headers this overlay advertises (besides its roles)."""
        return {}

    def on_attach(self, node: "Node") -> None:
        """Hook: the overlay is bound to ``node`` (not started yet)."""

    def on_start(self) -> None:
        """Hook: start serving, on the node's hub."""

    def on_stop(self, timeout: float) -> None:
        """Hook: stop serving within about ``timeout`` seconds, on the node's hub."""

    def metrics(self) -> Iterable[tuple[str, dict[str, str], float]]:
        """Samples for the node's metrics endpoint (``peermesh.metrics``), read on the hub
        when scraped: ``(name, labels, value)``; a name ending in ``_total`` is a counter
        (``peermesh_`` + name without ``_total``), any other a gauge (a histogram when the
        value is a ``peermesh.zre.roundtrip.RoundTrip``), and every sample of a name has the
        same label names.

        By default: each counter of ``self.limits`` as ``limit_hits_total`` and each
        number in ``self.stats`` as ``overlay_events_total{overlay, event}``. Overlays
        that keep more (queues, states, lags) extend it.
        """
        component = self.roles[0] if self.roles else type(self).__name__.lower()
        limits = getattr(self, "limits", None)
        if isinstance(limits, Counters):
            for name, count in limits.snapshot().items():
                yield "limit_hits_total", {"component": component, "limit": name}, count
        stats = getattr(self, "stats", None)
        if isinstance(stats, Mapping):
            for name, value in stats.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    yield ("overlay_events_total", {"overlay": component, "event": str(name)},
                           value)

    # --- the contract -----------------------------------------------------------

    def attach(self, node: "Node") -> None:
        """Bind to ``node`` before it starts: advertise headers and roles."""
        if self.lifecycle is not Lifecycle.NEW:
            raise NodeStateError(f"{self._kind()} is {self.lifecycle.value}: it attaches once")
        if node.running:
            raise NodeStateError(f"attach {self._kind()} before its node starts: "
                                 "HELLO headers are sent once per connection")
        advertise(node, self.headers(), self.roles)
        self.node = node
        overlays = getattr(node, "overlays", None)
        if overlays is not None:
            overlays.append(self)
        self.on_attach(node)
        self.lifecycle = Lifecycle.ATTACHED

    def start(self) -> Any:
        """Start serving on the attached node's hub; returns ``self``."""
        if self.lifecycle is not Lifecycle.ATTACHED:
            why = "attach it to a node first" if self.lifecycle is Lifecycle.NEW \
                else "it starts once"
            raise NodeStateError(f"{self._kind()} is {self.lifecycle.value}: {why}")
        if self.node is not None and not self.node.running:  # (an overlay may serve alone)
            raise NodeStateError(f"start the node first: {self._kind()}.start() follows "
                                 "node.start()")
        self.on_start()
        self.lifecycle = Lifecycle.RUNNING
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop serving (idempotent); an overlay never started just becomes STOPPED."""
        running = self.lifecycle is Lifecycle.RUNNING
        self.lifecycle = Lifecycle.STOPPED
        if running:
            self.on_stop(timeout)

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self.lifecycle is Lifecycle.RUNNING

    def _kind(self) -> str:
        return type(self).__name__
