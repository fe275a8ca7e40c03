"""resolve_peer: which peer a name, UUID or UUID prefix means, on simulated nodes in virtual time.

The agent's ``whisper`` op and ``peermesh whisper`` without an agent use it;
here it runs on ``peermesh.sim`` with the simulation's clock, so how long it
waits is exact virtual time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Callable

import pytest

from peermesh.agent.resolve import is_full_uuid, resolve_peer, settle_time
from peermesh.errors import AmbiguousPeerError, UnknownPeerError
from peermesh.sim import Simulation


@pytest.fixture
def make_sim() -> Iterator[Callable[..., Simulation]]:
    sims: list[Simulation] = []

    def make(nodes: int, latency: float = 0.0) -> Simulation:
        sim = Simulation(nodes, latency=latency, seed=11).start()
        sims.append(sim)
        return sim

    yield make
    for sim in sims:
        sim.stop()


def _advance(sim: Simulation) -> Callable[[float], None]:
    """``wait_change`` on virtual time: a step of the simulation, never past ``until``."""
    def wait_change(until: float) -> None:
        assert until > sim.clock.now()
        sim.run(min(0.05, until - sim.clock.now()))
    return wait_change


def test_a_full_uuid_is_used_at_once_a_name_after_the_mesh_settled(make_sim) -> None:
    sim = make_sim(3)
    assert sim.run_until(sim.is_full_mesh, limit=10.0)
    me, other = sim.nodes[0], sim.nodes[1]
    now = sim.clock.now()
    later = now + 2.0
    found = resolve_peer(me, str(other.uuid), 5.0, later, _advance(sim), sim.clock.now)
    assert found == other.uuid and sim.clock.now() == now  # no wait for a whole UUID
    found = resolve_peer(me, other.name, 5.0, later, _advance(sim), sim.clock.now)
    assert found == other.uuid and later <= sim.clock.now() < later + 0.1
    # settled already: a name is used at once too
    now = sim.clock.now()
    assert resolve_peer(me, other.name, 5.0, now - 1, _advance(sim), sim.clock.now) == other.uuid
    assert sim.clock.now() == now


def test_a_peer_not_known_yet_is_waited_for(make_sim) -> None:
    sim = make_sim(2, latency=0.3)  # at virtual time 0 neither node knows the other
    me, other = sim.nodes
    with pytest.raises(UnknownPeerError):
        me.find_peer(other.name)
    settled = sim.clock.now() + settle_time(sim.config)
    assert resolve_peer(me, other.name, 10.0, settled, _advance(sim), sim.clock.now) == other.uuid
    assert sim.clock.now() >= settled


def test_none_appearing_is_refused_after_the_wait(make_sim) -> None:
    sim = make_sim(2)
    assert sim.run_until(sim.is_full_mesh, limit=10.0)
    start = sim.clock.now()
    with pytest.raises(UnknownPeerError) as caught:
        resolve_peer(sim.nodes[0], "nobody", 1.5, start, _advance(sim), sim.clock.now)
    assert not isinstance(caught.value, AmbiguousPeerError)
    assert str(caught.value) == "no peer matching 'nobody' appeared within 1.5 s"
    assert start + 1.5 <= sim.clock.now() < start + 1.6


def test_an_ambiguous_prefix_is_refused_at_once(make_sim) -> None:
    sim = make_sim(18)  # 17 peers, 16 hex digits: two of them share a first digit
    assert sim.run_until(sim.is_full_mesh, limit=20.0)
    me = sim.nodes[0]
    digits = Counter(node.uuid.hex[0] for node in sim.nodes[1:])
    shared = next(digit for digit, count in digits.items() if count > 1)
    now = sim.clock.now()
    with pytest.raises(AmbiguousPeerError) as caught:
        resolve_peer(me, shared, 5.0, now + 5.0, _advance(sim), sim.clock.now)
    assert str(caught.value).endswith("; give more of the UUID")
    assert f"{shared!r} matches several peers" in str(caught.value)
    assert sim.clock.now() == now


def test_settle_time_and_whole_uuids(make_sim) -> None:
    sim = make_sim(1)
    assert settle_time(sim.config) == sim.config.interval * 1.25 + 0.05
    uuid = sim.nodes[0].uuid
    assert is_full_uuid(str(uuid)) and is_full_uuid(uuid.hex)
    assert not is_full_uuid(uuid.hex[:8]) and not is_full_uuid("alice")
