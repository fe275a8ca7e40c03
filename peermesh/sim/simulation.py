"""Many real nodes on one simulated network, with a report.

``Simulation(nodes=N, ...)`` starts N ``peermesh.Node`` objects, unchanged,
on a ``SimNetwork``; ``run(seconds)`` moves virtual time; ``partition`` and
``heal`` split and join the LAN; ``report()`` says how long the mesh took to
become whole and what it cost. Nodes' events go to listeners (counted, and
kept if ``keep_events``) rather than to queues nobody reads. ``watch`` reports
progress in wall time, also from inside one long virtual instant (with
thousands of nodes, the first round of HELLOs is a single instant).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Optional, Sequence

from ..config import NodeConfig
from ..events import Event, EventType
from ..zre.node import Node
from .network import SimNetwork

__all__ = ["Simulation"]

ENTER, EXIT = EventType.ENTER, EventType.EXIT


class _Sink:
    """An event queue that never fills: the simulation listens instead."""

    dropped = 0

    def bound_bytes(self, limit: int) -> None:
        pass

    def octets(self) -> int:
        return 0

    def put(self, event: Event) -> None:
        pass

    def put_each(self, events: list[Event], octets: list[int]) -> None:
        pass

    def full(self) -> bool:
        return False

    def blocked(self) -> bool:
        return False

    def spill(self) -> None:
        pass

    def get(self, timeout: Optional[float] = None) -> None:
        return None

    def __len__(self) -> int:
        return 0


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Simulation:
    """N nodes on one simulated LAN, driven by virtual time."""

    def __init__(self, nodes: int, *, latency: float = 0.0, jitter: float = 0.0,
                 loss: float = 0.0, seed: Optional[int] = None, keep_events: bool = False,
                 config: Optional[NodeConfig] = None, **settings: Any) -> None:
        if nodes < 1:
            raise ValueError("a simulation needs at least one node")
        self.network = SimNetwork(latency, jitter, loss, seed)
        self.clock = self.network.clock
        # no round-trip probes unless asked for as a setting: a full mesh of N nodes would
        # PING N*(N-1) pairs every rtt_probe, and the runs measure the mesh itself; max_peers
        # left to None: no cap, as simulated hosts have no descriptors
        base = (config or NodeConfig()).replace(**{"rtt_probe": 0, **settings})
        self.config = base.replace(interface="sim0")
        self.size = nodes
        self.nodes: list[Node] = []
        self.events: list[tuple[float, Node, Event]] = []
        self.counts: Counter[str] = Counter()
        self._keep = keep_events
        self._known: dict[Node, int] = {}
        self._complete = 0  # nodes whose count in ``_known`` is size - 1
        #: ENTER events so far, from every node
        self.entered = 0
        self._seen = 0
        self._watcher: Optional[Callable[["Simulation"], None]] = None
        self._watch_every = 0.0
        self._watch_next = 0.0
        self.converged_at: Optional[float] = None
        self._rss_before = 0
        self.started = False

    def address(self, node: Node) -> str:
        """The simulated IPv4 address of ``node``'s host."""
        return node.transport.address

    def start(self) -> "Simulation":
        """Create and start every node at virtual time 0."""
        before = _rss_bytes()
        for index in range(self.size):
            node = Node(f"sim{index}", config=self.config, transport=self.network.transport(),
                        _events=_Sink())
            node.add_listener(self._listener(node))
            self._known[node] = 0
            if self.size == 1:
                self._complete = 1
            self.nodes.append(node)
            node.start()
        self.started = True
        self.clock.advance(0)
        self._rss_before = before
        self._check_converged()
        return self

    def _listener(self, node: Node) -> Callable[[Event], None]:
        known, counts, want = self._known, self.counts, self.size - 1

        def listen(event: Event) -> None:
            kind = event.type
            counts[kind._value_] += 1  # (``value`` is a property: this runs for every event)
            if kind is ENTER:
                had = known[node]
                known[node] = had + 1
                self.entered += 1
                if had + 1 == want:
                    self._complete += 1
                elif had == want:
                    self._complete -= 1
            elif kind is EXIT:
                had = known[node]
                known[node] = had - 1
                if had == want:
                    self._complete -= 1
                elif had - 1 == want:
                    self._complete += 1
            if self._keep:
                self.events.append((self.clock.now(), node, event))
            self._seen += 1
            if not self._seen & 4095 and self._watcher is not None:
                self._report_progress()
        return listen

    def watch(self, callback: Optional[Callable[["Simulation"], None]],
              every: float = 5.0) -> None:
        """Call ``callback(self)`` about every ``every`` seconds of wall time (None: stop).

        It is checked after each step and every 4,096 events, so it also runs in
        the middle of a burst that happens at one virtual instant.
        """
        self._watcher = callback
        self._watch_every = every
        self._watch_next = time.monotonic() + every

    def _report_progress(self) -> None:
        now = time.monotonic()
        if self._watcher is not None and now >= self._watch_next:
            self._watch_next = now + self._watch_every
            self._watcher(self)

    def complete(self) -> int:
        """How many nodes have every other node as a ready peer."""
        return self._complete

    def _check_converged(self) -> None:
        if self.converged_at is None and self.is_full_mesh():
            self.converged_at = self.clock.now()

    def is_full_mesh(self) -> bool:
        """True when every node has every other as a ready peer."""
        return self._complete == len(self._known)

    def run(self, seconds: float, step: float = 0.05,
            progress: Optional[Callable[["Simulation"], None]] = None,
            progress_every: float = 1.0) -> None:
        """Advance virtual time by ``seconds`` in steps, noting when the mesh became whole."""
        end = self.clock.now() + seconds
        next_progress = self.clock.now() + progress_every
        while self.clock.now() < end - 1e-9:
            self.clock.advance(min(step, end - self.clock.now()))
            self._check_converged()
            self._report_progress()
            if progress is not None and self.clock.now() >= next_progress - 1e-9:
                progress(self)
                next_progress += progress_every

    def run_until(self, condition: Callable[[], bool], limit: float, step: float = 0.05) -> bool:
        """Advance until ``condition()`` holds, at most ``limit`` virtual seconds; its result."""
        end = self.clock.now() + limit
        while not condition():
            if self.clock.now() >= end - 1e-9:
                return False
            self.clock.advance(min(step, end - self.clock.now()))
            self._check_converged()
            self._report_progress()
        return True

    def partition(self, islands: int | Sequence[Sequence[Node]] = 2) -> list[list[Node]]:
        """Split the LAN into ``islands`` equal parts (or the given groups of nodes)."""
        if isinstance(islands, int):
            if islands < 2:
                raise ValueError("a partition needs at least 2 islands")
            groups = [self.nodes[i::islands] for i in range(islands)]
        else:
            groups = [list(group) for group in islands]
        self.network.partition([[self.address(n) for n in group] for group in groups])
        return groups

    def heal(self) -> None:
        """Join the islands again."""
        self.network.heal()

    def stop(self) -> None:
        """Stop every node (no flushing: virtual time does not pass)."""
        for node in self.nodes:
            node.stop(0)
        self.clock.advance(0)

    def memory_per_node(self) -> int:
        """Resident memory the nodes added to this process, per node (bytes)."""
        return int(max(0, _rss_bytes() - self._rss_before) / self.size)

    def report(self) -> dict[str, Any]:
        """What happened: convergence time, traffic (sent = delivered + lost + still in
        flight at the end), churn, memory."""
        net = self.network
        return {
            "nodes": self.size,
            "virtual_seconds": round(self.clock.now(), 3),
            "full_mesh": self.is_full_mesh(),
            "converged_after": None if self.converged_at is None else round(self.converged_at, 3),
            "messages": {"sent": net.sent, "delivered": net.delivered, "lost": net.lost,
                         "in_flight": net.in_flight},
            "beacons": {"sent": net.beacons_sent, "delivered": net.beacons_delivered,
                        "lost": net.beacons_lost, "in_flight": net.beacons_in_flight},
            "events": dict(self.counts),
            "memory_per_node_bytes": self.memory_per_node(),
        }

