"""Which node is the broker, as one node sees it: the election fed by the node's events.

How it works
------------
``BrokerTracker(mode, priority)`` is an ``Overlay`` that opens no socket: it
needs nothing but the ``Node`` API (``add_listener``, ``peers``,
``peer_headers``, ``peer_name``) and the node's own clock
(``node.transport.sleep``), so the same code runs on real nodes and on
``peermesh.sim`` nodes in virtual time.

* ``attach(node)`` (before ``node.start()``) sets the ``X-PM-BROKER`` HELLO
  header of a candidate (mode ``auto`` or ``always``; ``never`` only
  follows the election).
* ``start()`` (after ``node.start()``) takes in the peers already there and
  attaches a listener: ENTER and EXIT go through an in-order queue to a
  greenlet of the tracker (listeners may run in a hub callback, where
  nothing may block) and feed the ``Election``.
* The first decision is applied ``settle`` seconds after start (default one
  beacon interval and a half, so it sees the peers already on the mesh), and
  then every change: ``on_change(Change)`` (the owner's reaction: start or
  stop what it runs on the elected node) runs first, then every listener
  gets a ``BrokerChanged``.

Per peer, ``on_peer_entered(uuid, headers, name)`` / ``on_peer_left(uuid)``
run before the election sees the peer, so an overlay can track its own
headers (the endpoint its broker role serves at) in the same order.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Generic, Mapping, Optional, TypeVar
from uuid import UUID

import gevent
import gevent.event

from ..events import Event, EventType, tell
from .contract import Overlay
from .election import BROKER_HEADER, MODES, Candidate, Change, Election, candidate_header

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["BrokerTracker", "BrokerChanged"]

log = logging.getLogger(__name__)


C = TypeVar("C", bound=Candidate)


@dataclass(frozen=True, slots=True)
class BrokerChanged(Generic[C]):
    """The broker this node sees changed (``new`` None: no broker in view).

    An overlay that rides on the elected node may hand its listeners the
    candidates with what it adds (NFP: ``NfpCandidate`` with its endpoint).
    """

    old: Optional[C]
    new: Optional[C]
    took_over: bool
    stepped_down: bool


class BrokerTracker(Overlay):
    """One node's view of the broker candidates and the broker it implies."""

    def __init__(self, mode: str = "never", priority: int = 0, *,
                 settle: Optional[float] = None,
                 on_change: Optional[Callable[[Change], None]] = None,
                 on_peer_entered: Optional[Callable[[UUID, Mapping[str, str], str], None]] = None,
                 on_peer_left: Optional[Callable[[UUID], None]] = None) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"broker mode must be one of {', '.join(MODES)}, not {mode!r}")
        if mode != "never":
            candidate_header(mode, priority)    # refuses a priority that is no integer
        self.mode = mode
        self.priority = priority
        self.candidate: Optional[Candidate] = None
        self.election = Election()
        self.settle = settle
        self.on_change = on_change
        self.on_peer_entered = on_peer_entered
        self.on_peer_left = on_peer_left
        #: set once the first decision has been applied
        self.settled = gevent.event.Event()
        self._settled = False
        self._listeners: list[Callable[[BrokerChanged[Candidate]], None]] = []
        self._inbox: deque[Event] = deque()
        self._inbox_ready = gevent.event.Event()
        self._greenlets: list[gevent.Greenlet] = []

    # --- listeners ------------------------------------------------------

    def add_listener(self, callback: Callable[[BrokerChanged[Candidate]], None]) -> None:
        """Call ``callback(BrokerChanged)`` when the broker changes (on the hub)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[BrokerChanged[Candidate]], None]) -> None:
        """Stop calling ``callback``."""
        self._listeners.remove(callback)

    # --- the overlay contract -------------------------------------------

    def headers(self) -> dict[str, str]:
        """``X-PM-BROKER`` for a candidate; nothing otherwise."""
        if self.mode == "never":
            return {}
        return {BROKER_HEADER: candidate_header(self.mode, self.priority)}

    def on_attach(self, node: "Node") -> None:
        if self.mode != "never":
            self.candidate = Candidate(node.uuid, self.priority, self.mode, node.name)
        self.election = Election(self.candidate, node.uuid)
        if self.settle is None:
            self.settle = node.config.interval * 1.5

    def on_start(self) -> None:
        node = self._node()
        node.add_listener(self._on_node_event, messages=False)
        for uuid in node.peers():
            try:
                self._entered(uuid, node.peer_headers(uuid), node.peer_name(uuid))
            except Exception:  # the peer left in between
                log.debug("peer %s vanished during start", uuid)
        self._greenlets = [gevent.spawn(self._settle_later), gevent.spawn(self._process_events)]

    def on_stop(self, timeout: float) -> None:
        try:
            self._node().remove_listener(self._on_node_event)
        except ValueError:
            pass
        greenlets, self._greenlets = self._greenlets, []
        gevent.killall(greenlets, block=False)

    def _node(self) -> "Node":
        assert self.node is not None
        return self.node

    def _settle_later(self) -> None:
        self._node().transport.sleep(self.settle or 0.0)
        self._settled = True
        broker = self.election.broker
        if broker is not None:
            self._apply(Change(None, broker, self._node().uuid))
        self.settled.set()

    # --- the mesh -------------------------------------------------------

    def _on_node_event(self, event: Event) -> None:
        # Listeners may be called from a hub callback, where nothing may block:
        # queue the event for the tracker's greenlet, in order.
        if event.type in (EventType.ENTER, EventType.EXIT) and event.peer is not None:
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
                log.exception("broker election: handling %s of %s failed", event.type,
                              event.peer)

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
        tell(self._listeners, BrokerChanged(change.old, new, change.took_over,
                                            change.stepped_down), "broker listener")

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
