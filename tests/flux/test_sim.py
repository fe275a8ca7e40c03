"""The Flux overlay, unchanged, on the simulated network (virtual time, no sockets).

One thousand ranks join a root at once, the tree converges to the formula
(kary:32), rank 0 pings every rank, and one event reaches every rank. A
crashed interior rank's subtree re-attaches in virtual time.
"""

from __future__ import annotations

from typing import Any

from peermesh.flux import Errno, FluxError, FluxOverlay, FluxSettings, State, Topology
from peermesh.sim import SimNetwork

SETTINGS = dict(heartbeat=1.0, torpid=3.0, lost=5.0, hello_timeout=2.0)


def build(network: SimNetwork, size: int, topology: str) -> list[FluxOverlay]:
    settings = FluxSettings(**SETTINGS)  # type: ignore[arg-type]
    transport = network.transport()
    root = FluxOverlay(root=True, topology=topology, settings=settings, transport=transport,
                       address=transport.address).start()
    nodes = [root]
    for _ in range(size - 1):
        transport = network.transport()
        nodes.append(FluxOverlay(parents=[root.endpoint], topology=topology, settings=settings,
                                 transport=transport, address=transport.address).start())
    return nodes


def crash(network: SimNetwork, flux: FluxOverlay) -> None:
    """The host dies: its sockets vanish without a word."""
    flux._greenlets, greenlets = [], flux._greenlets
    if flux._driver is not None:   # its sockets closed, nothing said
        flux._driver.close()
    import gevent
    gevent.killall(greenlets)


def test_thousand_ranks_converge_answer_ping_all_and_get_an_event() -> None:
    network = SimNetwork(latency=0.001, seed=1)
    nodes = build(network, 1000, "kary:32")
    network.clock.advance(5.0)
    assert all(n.state is State.ONLINE for n in nodes)
    assert sorted(n.rank for n in nodes) == list(range(1000))  # type: ignore[type-var]
    k32 = Topology(32)
    assert all(n.info()["parent"] == k32.parent(n.rank)  # type: ignore[arg-type]
               for n in nodes[1:])
    root = nodes[0]
    assert root.size == 1000 and max(len(n.core.children) for n in nodes) == 32

    pings = [root.rpc("broker.ping", b"p", rank) for rank in range(1000)]
    network.clock.advance(1.0)
    assert all(f.done for f in pings) and [f.get(0) for f in pings] == [b"p"] * 1000

    got: list[Any] = []
    for n in nodes:
        n.subscribe("sim.", lambda event, n=n: got.append((n.rank, event.seq)))
    nodes[777].publish("sim.hello", {"x": 1})
    network.clock.advance(1.0)
    assert sorted(got) == [(rank, 1) for rank in range(1000)]


def test_crashed_interior_rank_subtree_reattaches_in_virtual_time() -> None:
    network = SimNetwork(latency=0.001, seed=2)
    nodes = build(network, 200, "kary:4")
    network.clock.advance(5.0)
    crash(network, nodes[1])                      # ranks 5..8 and below hang from rank 1
    lost = nodes[0].rpc("broker.ping", b"", 1)
    network.clock.advance(12.0)
    try:
        lost.get(0)
        raise AssertionError("rank 1 answered after its crash")
    except FluxError as exc:
        assert exc.errnum == Errno.EHOSTUNREACH
    assert all(nodes[r].state is State.ONLINE and nodes[r].info()["parent"] == 0
               for r in (5, 6, 7, 8))
    pings = [nodes[0].rpc("broker.ping", b"", r) for r in range(2, 200)]
    network.clock.advance(1.0)
    assert all(f.get(0) == b"" for f in pings)


def test_partition_from_rank_0_heals_to_one_tree() -> None:
    network = SimNetwork(latency=0.001, seed=3)
    nodes = build(network, 50, "kary:4")
    network.clock.advance(5.0)
    k4 = Topology(4)
    cut = [n for n in nodes if n.rank == 1 or k4.is_descendant(n.rank, 1)]  # type: ignore
    network.partition([[n.transport.address for n in cut]])
    network.clock.advance(12.0)
    assert nodes[1].state is State.JOINING            # cut off from rank 0, trying again
    assert all(n.info()["parent"] == k4.parent(n.rank) for n in cut[1:])  # type: ignore
    lost = nodes[0].rpc("broker.ping", b"", cut[-1].rank)  # type: ignore[arg-type]
    network.clock.advance(1.0)
    try:
        lost.get(0)
        raise AssertionError("a rank across the partition answered")
    except FluxError as exc:
        assert exc.errnum == Errno.EHOSTUNREACH
    network.heal()
    network.clock.advance(5.0)
    assert all(n.state is State.ONLINE for n in nodes)
    assert sorted(n.rank for n in nodes) == list(range(50))  # type: ignore[type-var]
    pings = [nodes[0].rpc("broker.ping", b"", r) for r in range(50)]
    network.clock.advance(1.0)
    assert all(f.get(0) == b"" for f in pings)


def test_a_refused_join_is_tried_again_at_once_and_the_instance_topology_taken() -> None:
    network = SimNetwork(latency=0.001, seed=2)
    settings = FluxSettings(**SETTINGS)  # type: ignore[arg-type]

    def start(**options: Any) -> FluxOverlay:
        transport = network.transport()
        return FluxOverlay(settings=settings, transport=transport, address=transport.address,
                           **options).start()

    root = start(root=True, topology="kary:2")
    stray = start(parents=["tcp://10.0.0.1:1"])      # never joins: it refuses joins through it
    late = start(parents=[stray.endpoint, root.endpoint])     # started with kary:32
    network.clock.advance(0.3)                       # well before the 1 s tick
    assert late.state is State.ONLINE and late.rank == 1, late.info()
    assert late.info()["topology"] == "kary:2"
    for flux in (late, stray, root):
        flux.stop()
