"""Broker election on the simulated network: kill, partition and heal, in virtual time.

Eight real ``Node`` objects on a ``peermesh.sim`` network, each with the
neutral ``BrokerTracker`` overlay that ``NfpNode`` (and any overlay riding on
the elected node) uses: candidates from the ``X-PM-BROKER`` HELLO header it
sets when attached, ENTER/EXIT through the node's listener, the settle delay
on the node's clock, ``BrokerChanged`` to listeners. It opens no socket, so
everything the election decides comes from the mesh view, exactly as on a
real network.

The story: four candidates (sim0 > sim1 > sim2 > sim3 by priority) and four
other nodes agree on sim0; sim0 crashes (no goodbye) and the rest agree on
sim1 within 2 x expired; the LAN splits into {sim0, sim2, sim4, sim6} (sim0
gone) and {sim1, sim3, sim5, sim7}: the even island elects sim2 after the
expiry while the odd one keeps sim1; the LAN heals and exactly one broker
(sim2) steps down; finally sim1 leaves cleanly and sim2 takes over at once.
"""

from __future__ import annotations

from typing import Any, Optional

import gevent
import pytest

import peermesh.sim.simulation as simulation_module
from peermesh import Node
from peermesh.overlay.broker import BrokerChanged, BrokerTracker
from peermesh.sim import Simulation

INTERVAL, EXPIRED = 1.0, 30.0   # ZRE's defaults (evasive 5 s, silent 10 s)
#: node index -> broker priority (the rest are not candidates)
CANDIDATES = {0: 9, 1: 7, 2: 5, 3: 3}


class Harness:
    """A Simulation whose nodes each run a broker tracker; changes recorded per node."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.trackers: dict[Node, BrokerTracker] = {}
        self.changes: list[tuple[float, Node, BrokerChanged]] = []
        self.dead: set[Node] = set()

    def setup(self, node: Node) -> None:
        """Attach the tracker (a candidate's sets its header), before the node starts."""
        index = int(node.name.removeprefix("sim"))
        tracker = BrokerTracker("auto", CANDIDATES[index]) if index in CANDIDATES \
            else BrokerTracker()
        tracker.attach(node)
        tracker.add_listener(lambda change: self.changes.append(
            (self.sim.clock.now(), node, change)))
        self.trackers[node] = tracker

    def start(self) -> None:
        for node in self.sim.nodes:
            self.trackers[node].start()   # after node.start()

    def node(self, index: int) -> Node:
        return self.sim.nodes[index]

    def alive(self) -> list[Node]:
        return [n for n in self.sim.nodes if n not in self.dead]

    def broker_of(self, node: Node) -> Optional[str]:
        broker = self.trackers[node].current_broker
        return broker.name if broker is not None else None

    def agree(self, nodes: list[Node], name: str) -> bool:
        return all(self.broker_of(n) == name for n in nodes)

    def brokers(self, nodes: list[Node]) -> set[Optional[str]]:
        return {self.broker_of(n) for n in nodes}

    def elected(self, nodes: list[Node]) -> list[str]:
        """Nodes that consider themselves the broker (would run an active Broker)."""
        return sorted(n.name for n in nodes if self.trackers[n].elected)

    def changes_since(self, since: float) -> list[tuple[float, str, BrokerChanged]]:
        return [(at, node.name, change) for at, node, change in self.changes if at >= since]

    def crash(self, node: Node) -> None:
        """Kill a node without a goodbye: its greenlets stop and its mailbox vanishes."""
        self.trackers[node].stop()
        gevent.killall(node._greenlets + [g for d in node._discovery
                                          for g in d._greenlets])  # type: ignore[attr-defined]
        node._mailbox.close()
        self.dead.add(node)


@pytest.fixture
def harness(monkeypatch: pytest.MonkeyPatch) -> Any:
    made: list[Harness] = []

    def make() -> Harness:
        sim = Simulation(8, keep_events=True, seed=5, interval=INTERVAL, evasive=5.0,
                         silent=10.0, expired=EXPIRED)
        h = Harness(sim)

        class SetupNode(Node):
            # Simulation creates and starts its nodes in one go; the election headers
            # must be set in between, as attach does before node.start().
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                h.setup(self)

        monkeypatch.setattr(simulation_module, "Node", SetupNode)
        sim.start()
        monkeypatch.undo()
        h.start()
        made.append(h)
        return h

    yield make
    for h in made:
        for node in h.alive():
            h.trackers[node].stop()
            node.stop(0)
        h.sim.clock.advance(0)


def name(change: Optional[Any]) -> Optional[str]:
    return change.name if change is not None else None


def test_kill_partition_heal_leave(harness: Any) -> None:
    h: Harness = harness()
    sim = h.sim
    nodes = list(sim.nodes)
    sim0, sim1, sim2 = h.node(0), h.node(1), h.node(2)

    # --- everyone agrees on the best candidate --------------------------
    assert sim.run_until(lambda: h.agree(nodes, "sim0"), limit=3 * INTERVAL)
    assert sim.is_full_mesh()
    assert h.elected(nodes) == ["sim0"]
    first = h.changes_since(0.0)
    # one BrokerChanged per node, at the first decision (1.5 beacon intervals after start)
    assert sorted(n for _, n, _ in first) == sorted(n.name for n in nodes)
    for at, who, change in first:
        assert change.old is None and name(change.new) == "sim0"
        assert change.took_over == (who == "sim0") and not change.stepped_down
        assert at == pytest.approx(1.5 * INTERVAL, abs=0.06)
    # every node sees the four candidates, best first
    for node in nodes:
        assert [c.name for c in h.trackers[node].candidates()] == ["sim0", "sim1", "sim2",
                                                                   "sim3"]

    # --- the broker crashes: re-election within 2 x expired --------------
    sim.run(5.0)
    h.crash(sim0)
    crashed_at = sim.clock.now()
    survivors = h.alive()
    sim.run(EXPIRED - 2.0)
    assert h.agree(survivors, "sim0")              # nothing moves before ZRE expires the peer
    assert h.changes_since(crashed_at) == []
    assert sim.run_until(lambda: h.agree(survivors, "sim1"), limit=2 * EXPIRED)
    took = sim.clock.now() - crashed_at
    assert EXPIRED - 2.0 <= took <= 2 * EXPIRED, took
    assert h.elected(survivors) == ["sim1"]
    moved = h.changes_since(crashed_at)
    assert sorted(n for _, n, _ in moved) == sorted(n.name for n in survivors)
    for _, who, change in moved:
        assert name(change.old) == "sim0" and name(change.new) == "sim1"
        assert change.took_over == (who == "sim1") and not change.stepped_down

    # --- partition: each island elects its own broker after expiry --------
    even, odd = sim.partition(2)                 # sim0 (dead), 2, 4, 6 | sim1, 3, 5, 7
    even_alive = [n for n in even if n not in h.dead]
    split_at = sim.clock.now()
    sim.run(EXPIRED - 2.0)
    assert h.agree(survivors, "sim1")            # both islands still follow sim1
    assert sim.run_until(lambda: h.agree(even_alive, "sim2"), limit=2 * EXPIRED)
    assert sim.clock.now() - split_at <= 2 * EXPIRED
    sim.run(3.0)                                 # every expiry across the split is done
    assert h.agree(odd, "sim1")                  # the odd island kept its broker
    assert h.elected(survivors) == ["sim1", "sim2"]   # split brain, one broker per island
    split = h.changes_since(split_at)
    assert sorted(n for _, n, _ in split) == sorted(n.name for n in even_alive)
    for _, who, change in split:
        assert name(change.old) == "sim1" and name(change.new) == "sim2"
        assert change.took_over == (who == "sim2") and not change.stepped_down
    for node in odd:                             # the odd island sees only its own candidates
        assert [c.name for c in h.trackers[node].candidates()] == ["sim1", "sim3"]

    # --- heal: exactly one broker steps down, all agree again -------------
    sim.heal()
    healed_at = sim.clock.now()
    assert sim.run_until(lambda: h.agree(survivors, "sim1"), limit=3 * INTERVAL)
    sim.run(3 * INTERVAL)                         # nothing else follows
    assert sim.is_full_mesh() is False           # (sim0 is dead; the sim counts it)
    assert h.agree(survivors, "sim1") and h.elected(survivors) == ["sim1"]
    healed = h.changes_since(healed_at)
    assert [who for _, who, c in healed if c.stepped_down] == ["sim2"]   # exactly one
    assert not any(c.took_over for _, _, c in healed)
    assert sorted(n for _, n, _ in healed) == sorted(n.name for n in even_alive)
    for _, who, change in healed:                 # only the island that had sim2 moves
        assert name(change.old) == "sim2" and name(change.new) == "sim1"
    for node in survivors:
        assert [c.name for c in h.trackers[node].candidates()] == ["sim1", "sim2", "sim3"]

    # --- a clean leave: re-election at once ------------------------------
    sim1.stop(0)
    h.trackers[sim1].stop()
    h.dead.add(sim1)
    left_at = sim.clock.now()
    rest = h.alive()
    assert sim.run_until(lambda: h.agree(rest, "sim2"), limit=2 * INTERVAL)
    assert sim.clock.now() - left_at < INTERVAL    # the port-0 beacon: EXIT at once
    assert h.elected(rest) == ["sim2"]
    last = h.changes_since(left_at)
    assert sorted(n for _, n, _ in last) == sorted(n.name for n in rest)
    assert [who for _, who, c in last if c.took_over] == ["sim2"]
    assert sim2 in rest


def test_followers_without_candidates_have_no_broker(harness: Any) -> None:
    """Once every candidate has left, the others agree there is no broker (clients go direct)."""
    h: Harness = harness()
    sim = h.sim
    nodes = list(sim.nodes)
    assert sim.run_until(lambda: h.agree(nodes, "sim0"), limit=3 * INTERVAL)
    # every candidate leaves cleanly: the followers end with no broker at all
    for index in CANDIDATES:
        node = h.node(index)
        node.stop(0)
        h.trackers[node].stop()
        h.dead.add(node)
    since = sim.clock.now()
    followers = h.alive()
    assert sim.run_until(lambda: h.brokers(followers) == {None}, limit=2 * INTERVAL)
    assert h.elected(followers) == []
    changes = h.changes_since(since)
    assert not any(c.took_over or c.stepped_down for _, _, c in changes)
    for node in followers:       # the candidates left one after another; the last word: none
        last = [c for _, who, c in changes if who == node.name][-1]
        assert last.new is None and last.old is not None
