"""Flux on ZRE nodes on the simulated network: a partition splits the tree, healing joins it.

Six real ``Node`` objects, each with a ``FluxOverlay`` attached in mesh mode
(priorities 10, 9, ... so sim0 is elected root). The LAN splits into
{sim0, sim2, sim4} and {sim1, sim3, sim5}: once ZRE expires the peers across
the split, the odd island elects sim1, which becomes rank 0 of a tree of its
own, and its members join it. When the LAN heals, sim1 loses the election,
steps down and joins sim0's tree with its island: one tree again.
"""

from __future__ import annotations

from typing import Any

import pytest

import peermesh.sim.simulation as simulation_module
from peermesh import Node
from peermesh.flux import FluxOverlay, FluxSettings, State
from peermesh.sim import Simulation

SETTINGS = FluxSettings(heartbeat=0.5, torpid=1.5, lost=3.0, hello_timeout=1.0)


@pytest.fixture
def island_sim(monkeypatch: pytest.MonkeyPatch) -> Any:
    sim = Simulation(6, seed=3, interval=0.5, evasive=2.0, silent=3.0, expired=5.0)
    overlays: dict[Node, FluxOverlay] = {}

    class FluxNode(Node):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            index = int(self.name.removeprefix("sim"))
            flux = FluxOverlay("island", topology="kary:2", settings=SETTINGS, settle=1.0,
                               priority=10 - index)
            flux.attach(self)
            overlays[self] = flux

    monkeypatch.setattr(simulation_module, "Node", FluxNode)
    sim.start()
    monkeypatch.undo()
    for node in sim.nodes:
        overlays[node].start()
    yield sim, [overlays[n] for n in sim.nodes]
    for node in sim.nodes:
        overlays[node].stop()
        node.stop(0)
    sim.clock.advance(0)


def roots(fluxes: list[FluxOverlay]) -> list[int]:
    return [i for i, f in enumerate(fluxes) if f.core.root and f.state is State.ONLINE]


def one_tree(fluxes: list[FluxOverlay]) -> bool:
    return roots(fluxes) == [0] and all(f.state is State.ONLINE for f in fluxes) and \
        len({f.rank for f in fluxes}) == len(fluxes)


def test_partition_splits_and_heals_to_one_tree(island_sim: Any) -> None:
    sim, fluxes = island_sim
    assert sim.run_until(lambda: one_tree(fluxes), limit=10.0)
    assert sorted(f.rank for f in fluxes) == list(range(6))

    even, odd = [0, 2, 4], [1, 3, 5]
    sim.network.partition([[sim.address(sim.nodes[i]) for i in odd]])
    assert sim.run_until(lambda: roots(fluxes) == [0, 1] and
                         all(f.state is State.ONLINE for f in fluxes), limit=40.0)
    for side in (even, odd):                      # each island is one tree of its own
        top = fluxes[side[0]]
        answers = [top.rpc("peermesh.info", None, fluxes[i].rank) for i in side]
        sim.run(1.0)
        assert sorted(a.get_json(0)["rank"] for a in answers) == sorted(
            fluxes[i].rank for i in side)  # type: ignore[type-var]

    sim.network.heal()
    assert sim.run_until(lambda: one_tree(fluxes), limit=40.0)
    root = fluxes[0]
    pings = [root.rpc("broker.ping", b"x", f.rank) for f in fluxes]  # type: ignore[arg-type]
    sim.run(1.0)
    assert [p.get(0) for p in pings] == [b"x"] * 6
