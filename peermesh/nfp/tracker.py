"""Which node is the broker, as one node sees it: the election fed by the node's events.

How it works
------------
``BrokerTracker(node, candidate)`` is the transport-free half of the broker
election of an ``NfpNode``: it opens no socket and needs nothing but the
``Node`` API (``add_listener``, ``peers``, ``peer_headers``, ``peer_name``)
and the node's own clock (``node.transport.sleep``), so the same code runs on
real nodes and on ``peermesh.sim`` nodes in virtual time.

* ``advertise_candidate(node, mode, priority, endpoint)`` sets the
  ``X-PM-NFP-BROKER`` HELLO header of a candidate (before ``node.start()``)
  and returns its ``Candidate``.
* ``start()`` (after ``node.start()``) takes in the peers already there and
  attaches a listener: ENTER and EXIT go through an in-order queue to a
  greenlet of the tracker (listeners may run in a hub callback, where
  nothing may block) and feed the ``Election``.
* The first decision is applied ``settle`` seconds after start (default one
  beacon interval and a half, so it sees the peers already on the mesh), and
  then every change: ``on_change(Change)`` (the overlay's reaction: start or
  stop its broker, move its workers and client) runs first, then every
  listener gets a ``BrokerChanged``.

Per peer, ``on_peer_entered(uuid, headers, name)`` / ``on_peer_left(uuid)``
run before the election sees the peer, so an overlay can track other headers
(the workers a peer advertises) in the same order.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional
from uuid import UUID

import gevent
import gevent.event

from ..events import Event, EventType
from .election import BROKER_HEADER, Candidate, Change, Election, candidate_header

__all__ = ["BrokerTracker", "BrokerChanged", "advertise_candidate"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BrokerChanged:
    """The broker this node sees changed (``new`` None: no broker, clients go direct)."""

    old: Optional[Candidate]
    new: Optional[Candidate]
    took_over: bool
    stepped_down: bool


def advertise_candidate(node: Any, mode: str, priority: int, endpoint: str) -> Candidate:
    """Make ``node`` a broker candidate: set its ``X-PM-NFP-BROKER`` header (before start)."""
    node.set_header(BROKER_HEADER, candidate_header(mode, int(priority), endpoint))
    return Candidate(node.uuid, int(priority), endpoint, mode, node.name)


class BrokerTracker:
    """One node's view of the broker candidates and the broker it implies."""

    def __init__(self, node: Any, candidate: Optional[Candidate] = None, *,
                 settle: Optional[float] = None,
                 on_change: Optional[Callable[[Change], None]] = None,
                 on_peer_entered: Optional[Callable[[UUID, Mapping[str, str], str], None]] = None,
                 on_peer_left: Optional[Callable[[UUID], None]] = None) -> None:
        self.node = node
        self.candidate = candidate
        self.election = Election(candidate, node.uuid)
        self.settle = float(settle) if settle is not None else node.config.interval * 1.5
        self.on_change = on_change
        self.on_peer_entered = on_peer_entered
        self.on_peer_left = on_peer_left
        #: set once the first decision has been applied
        self.settled = gevent.event.Event()
        self._settled = False
        self._listeners: list[Callable[[BrokerChanged], None]] = []
        self._inbox: deque[Event] = deque()
        self._inbox_ready = gevent.event.Event()
        self._greenlets: list[gevent.Greenlet] = []
        self.running = False

    # --- listeners ------------------------------------------------------

    def add_listener(self, callback: Callable[[BrokerChanged], None]) -> None:
        """Call ``callback(BrokerChanged)`` when the broker changes (on the hub)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[BrokerChanged], None]) -> None:
        """Stop calling ``callback``."""
        self._listeners.remove(callback)

    # --- life cycle -----------------------------------------------------

    def start(self) -> "BrokerTracker":
        """Take in the peers already there and follow the node's events (after its start)."""
        if self.running:
            return self
        self.running = True
        node = self.node
        node.add_listener(self._on_node_event)
        for uuid in node.peers():
            try:
                self._entered(uuid, node.peer_headers(uuid), node.peer_name(uuid))
            except Exception:  # the peer left in between
                log.debug("peer %s vanished during start", uuid)
        self._greenlets = [gevent.spawn(self._settle_later), gevent.spawn(self._process_events)]
        return self

    def stop(self) -> None:
        """Stop following the node (the last decision stays readable)."""
        if not self.running:
            return
        self.running = False
        try:
            self.node.remove_listener(self._on_node_event)
        except ValueError:
            pass
        greenlets, self._greenlets = self._greenlets, []
        gevent.killall(greenlets, block=False)

    def _settle_later(self) -> None:
        self.node.transport.sleep(self.settle)
        self._settle()

    def _settle(self) -> None:
        self._settled = True
        broker = self.election.broker
        if broker is not None:
            self._apply(Change(None, broker, self.node.uuid))
        self.settled.set()

    # --- the mesh -------------------------------------------------------

    def _on_node_event(self, event: Event) -> None:
        # Listeners may be called from a hub callback, where nothing may block:
        # queue the event for the tracker's greenlet, in order.
        if self.running and event.type in (EventType.ENTER, EventType.EXIT) \
                and event.peer is not None:
            self._inbox.append(event)
            self._inbox_ready.set()

    def _process_events(self) -> None:
        inbox = self._inbox
        while True:
            while not inbox:
                self._inbox_ready.clear()
                self._inbox_ready.wait()
            event = inbox.popleft()
            assert event.peer is not None
            try:
                if event.type is EventType.ENTER:
                    self._entered(event.peer, event.headers or {}, event.name or "")
                else:
                    self._left(event.peer)
            except Exception:
                log.exception("NFP: handling %s of %s failed", event.type, event.peer)

    def _entered(self, uuid: UUID, headers: Mapping[str, str], name: str) -> None:
        if self.on_peer_entered is not None:
            self.on_peer_entered(uuid, headers, name)
        self._apply(self.election.peer_entered(uuid, headers, name))

    def _left(self, uuid: UUID) -> None:
        if self.on_peer_left is not None:
            self.on_peer_left(uuid)
        self._apply(self.election.peer_left(uuid))

    def _apply(self, change: Optional[Change]) -> None:
        if change is None or not self._settled:
            return
        if self.on_change is not None:
            self.on_change(change)
        new = change.new
        log.info("broker: %s -> %s", change.old.name if change.old else None,
                 new.name if new else None)
        event = BrokerChanged(change.old, new, change.took_over, change.stepped_down)
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("broker listener %r failed", callback)

    # --- introspection --------------------------------------------------

    @property
    def is_settled(self) -> bool:
        """True once the first decision has been applied."""
        return self._settled

    @property
    def current_broker(self) -> Optional[Candidate]:
        """The broker in use (None before the first decision or with no candidate)."""
        return self.election.broker if self._settled else None

    @property
    def elected(self) -> bool:
        """True while this node is the broker it (and, once settled, the mesh) elected."""
        return self._settled and self.election.is_broker

    def candidates(self) -> list[Candidate]:
        """Every candidate in view, best first."""
        return self.election.candidates()
