"""Prometheus metrics of a node and its overlays, served over HTTP on the node's hub.

How it works
------------
The node keeps plain integer totals whether or not anything exports them
(an addition or two per message: ``Node.traffic``), and a ``MeshCollector``
reads them, with ``Node.stats``, each peer's liveness and round trips and
each overlay's ``metrics()``, only when Prometheus scrapes, turning them
into metric families with ``prometheus_client``. The HTTP server is gevent's ``pywsgi`` on the node's
hub, so a scrape reads the node's state between two of its greenlets' steps:
no thread, no lock, and serving metrics adds nothing to the hot path.

New counters appear without edits here: every key of ``Node.stats`` that is
not a size is a limit hit (``peermesh_limit_hits_total{component="node",
limit=KEY}``), every ``dropped_REASON`` of ``Node.traffic`` a drop, and
every overlay reports its own samples (``Overlay.metrics``: its ``limits``
counters and ``stats`` totals by default; a ``RoundTrip`` value becomes a
histogram).

``prometheus_client`` and ``gevent.pywsgi`` are imported only when a server
starts, so a node without metrics loads neither.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional

from .config import DEFAULT_METRICS_HOST as DEFAULT_HOST
from .config import parse_listen
from .zre.roundtrip import BUCKETS, RoundTrip

if TYPE_CHECKING:
    from .zre.node import Node

__all__ = ["MeshCollector", "MetricsServer", "parse_listen", "serve_configured", "DEFAULT_HOST"]

log = logging.getLogger(__name__)

#: ``Node.stats`` keys that are sizes (gauges), by metric name; every other key counts
#: limit hits
_SIZES = {
    "peers": ("peermesh_peers", "Peers that said HELLO."),
    "pending": ("peermesh_pending_peers", "Peers found by discovery, waiting for their HELLO."),
    "departed": ("peermesh_departed_peers", "Peers that left, remembered to ignore late reports."),
    "event_queue": ("peermesh_event_queue_events", "Events waiting for the application."),
    "event_queue_bytes": ("peermesh_event_queue_bytes",
                          "Octets of content waiting for the application."),
    "connections": ("peermesh_mailbox_connections", "Connections to the mailbox."),
    "send_backlog": ("peermesh_send_backlog_messages",
                     "Messages waiting in the send backlogs of slow peers."),
    "send_backlog_bytes": ("peermesh_send_backlog_bytes",
                           "Octets waiting in the send backlogs of slow peers."),
}
_STATES = ("alive", "evasive", "silent")


class MeshCollector:
    """A ``prometheus_client`` collector reading ``node`` (and its overlays) when scraped.

    ``collect`` must run on the node's hub (the server does); the families
    are described in the operations page of the docs.
    """

    def __init__(self, node: "Node") -> None:
        self.node = node

    def collect(self) -> Iterator[Any]:
        """Every family, read now."""
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        node = self.node
        info = GaugeMetricFamily("peermesh_node_info", "This node: name, UUID, mailbox.",
                                 labels=["name", "uuid", "endpoint"])
        info.add_metric([node.name, node.uuid.hex, node.endpoint or ""], 1)
        yield info
        stats = node.stats()
        limits = CounterMetricFamily("peermesh_limit_hits", "Refusals, drops and sheds at a "
                                     "bound, by component and limit.",
                                     labels=["component", "limit"])
        for key, value in sorted(stats.items()):
            size = _SIZES.get(key)
            if size is not None:
                yield GaugeMetricFamily(size[0], size[1], value=value)
            else:
                limits.add_metric(["node", key], value)
        infos = node.peer_infos()
        states = GaugeMetricFamily("peermesh_peers_by_state", "Peers by liveness.",
                                   labels=["state"])
        for state in _STATES:
            states.add_metric([state], sum(1 for i in infos if i.state == state))
        yield states
        yield GaugeMetricFamily("peermesh_groups", "Groups this node is in.",
                                value=len(node.groups()))
        yield from self._traffic(CounterMetricFamily)
        heard = GaugeMetricFamily("peermesh_peer_last_heard_seconds",
                                  "Seconds since anything came from the peer.",
                                  labels=["peer", "name"])
        for i in infos:
            heard.add_metric([i.uuid.hex, i.name], i.last_heard)
        yield heard
        yield self._round_trips(HistogramMetricFamily)
        overlay_families: dict[str, Any] = {}
        for overlay in list(getattr(node, "overlays", ())):
            for name, labels, amount in _overlay_samples(overlay):  # a number or a RoundTrip
                if name == "limit_hits_total":
                    limits.add_metric([labels.get("component", _component(overlay)),
                                       labels.get("limit", "")], amount)
                    continue
                family: Any = overlay_families.get(name)
                histogram = isinstance(amount, RoundTrip)
                if family is None:
                    kind = (HistogramMetricFamily if histogram else CounterMetricFamily
                            if name.endswith("_total") else GaugeMetricFamily)
                    family = overlay_families[name] = kind(
                        f"peermesh_{name.removesuffix('_total')}",
                        f"Overlay metric {name} (see the operations page).",
                        labels=sorted(labels))
                values = [labels[k] for k in sorted(labels)]
                if isinstance(amount, RoundTrip):
                    family.add_metric(values, _buckets(amount), amount.total)
                else:
                    family.add_metric(values, amount)
        yield limits
        yield from overlay_families.values()

    def _traffic(self, counter: Any) -> Iterator[Any]:
        traffic = self.node.traffic()
        messages = counter("peermesh_messages", "ZRE messages by kind and direction.",
                           labels=["kind", "direction"])
        for direction, prefix in (("in", "received"), ("out", "sent")):
            for kind, key in (("whisper", "whispers"), ("shout", "shouts"),
                              ("control", "control")):
                messages.add_metric([kind, direction], traffic.get(f"{prefix}_{key}", 0))
        yield messages
        octets = counter("peermesh_bytes", "Octets of WHISPER and SHOUT content.",
                         labels=["direction"])
        octets.add_metric(["in"], traffic.get("received_octets", 0))
        octets.add_metric(["out"], traffic.get("sent_octets", 0))
        yield octets
        dropped = counter("peermesh_dropped", "Input dropped as malformed or out of place.",
                          labels=["reason"])
        for key, value in sorted(traffic.items()):
            if key.startswith("dropped_"):
                dropped.add_metric([key[len("dropped_"):]], value)
        yield dropped

    def _round_trips(self, histogram: Any) -> Any:
        family = histogram("peermesh_peer_rtt_seconds",
                           "Round trips from PING to PING-OK, per peer.",
                           labels=["peer", "name"])
        for uuid, (name, rtt) in self.node.round_trips().items():
            family.add_metric([uuid.hex, name], _buckets(rtt), rtt.total)
        return family


_BOUNDS = [f"{b:g}" for b in BUCKETS] + ["+Inf"]


def _buckets(times: RoundTrip) -> list[tuple[str, float]]:
    """The cumulative (upper bound, count) buckets of ``times``, as a histogram has them."""
    cumulative = 0
    buckets: list[tuple[str, float]] = []
    for bound, count in zip(_BOUNDS, times.counts):
        cumulative += count
        buckets.append((bound, cumulative))
    return buckets


def _component(overlay: Any) -> str:
    roles = getattr(overlay, "roles", ())
    return roles[0] if roles else type(overlay).__name__.lower()


def _overlay_samples(overlay: Any) -> Iterable[tuple[str, dict[str, str], Any]]:
    """``overlay.metrics()``, with a broken overlay logged rather than failing the scrape."""
    metrics = getattr(overlay, "metrics", None)
    if metrics is None:
        return ()
    try:
        return list(metrics())
    except Exception:
        log.debug("metrics of %r failed", overlay, exc_info=True)
        return ()


class MetricsServer:
    """``/metrics`` of ``node`` over HTTP, served by greenlets on the node's hub.

    Create and ``start`` it on the node's hub (the thread that runs the node);
    ``address`` is the bound (host, port) once started.
    """

    def __init__(self, node: "Node") -> None:
        self.node = node
        self.address: Optional[tuple[str, int]] = None
        self._server: Any = None

    def start(self, listen: str, public: bool = False) -> "MetricsServer":
        """Listen on ``listen`` (see ``parse_listen``); ValueError for a bad or non-loopback
        address, OSError when it cannot be bound."""
        host, port = parse_listen(listen, public)
        from gevent.pywsgi import WSGIServer
        from prometheus_client import CollectorRegistry, make_wsgi_app
        from prometheus_client.process_collector import ProcessCollector

        registry = CollectorRegistry(auto_describe=False)
        registry.register(MeshCollector(self.node))  # type: ignore[arg-type]
        ProcessCollector(registry=registry)
        server = WSGIServer((host, port), make_wsgi_app(registry), log=None,
                            error_log=_ErrorLog())
        server.start()
        self._server = server
        self.address = server.address[:2]
        log.info("metrics of %s at http://%s:%d/metrics", self.node.name, *self.address)
        return self

    @property
    def url(self) -> str:
        """``http://HOST:PORT/metrics`` once started."""
        assert self.address is not None, "not started"
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(timeout=1)


class _ErrorLog:
    """pywsgi's error log, at debug: a client's bad request is remote input, not an error
    of ours."""

    def write(self, text: str) -> None:
        if text.strip():
            log.debug("metrics server: %s", text.rstrip())

    def flush(self) -> None:
        pass


def serve_configured(node: "Node") -> Optional[MetricsServer]:
    """A started ``MetricsServer`` when ``node.config.metrics`` asks for one, else None;
    call on the node's hub once the node has started."""
    config = node.config
    if not config.metrics:
        return None
    return MetricsServer(node).start(config.metrics, config.metrics_public)
