"""Flux on ZRE nodes (loopback): members find the root through the mesh and the election.

Every node advertises ``X-PM-FLUX-TREE``; after ``settle`` the highest-priority
member becomes rank 0 and the others join it. When rank 0's node leaves the
mesh the next member becomes rank 0 and the orphans re-attach to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, Callable

import pytest

from peermesh import Node, ThreadedNode
from peermesh.flux import FLUX_HEADER, FluxError, FluxOverlay, FluxSettings, State
from peermesh.metrics import MetricsServer
from peermesh.overlay.contract import Lifecycle, roles_of

from scraping import scrape, value

from .conftest import wait_until

#: each test with the common hops routed in C and in Python (conftest ``both_paths``)
pytestmark = pytest.mark.usefixtures("both_paths")

TIMING = dict(interval=0.05, evasive=0.3, silent=0.4, expired=0.6)
FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)


@pytest.fixture
def mesh(free_udp_port: int) -> Iterator[Callable[..., tuple[Node, FluxOverlay]]]:
    made: list[tuple[Node, FluxOverlay]] = []

    def add(name: str, **kw: Any) -> tuple[Node, FluxOverlay]:
        node = Node(name, interface="lo", port=free_udp_port, **TIMING)
        flux = FluxOverlay("test", topology="kary:2", settings=FAST, settle=0.3, **kw)
        flux.attach(node)
        node.start()
        flux.start()
        made.append((node, flux))
        return node, flux

    try:
        yield add
    finally:
        for node, flux in reversed(made):
            flux.stop()
            node.stop(0.1)


def test_members_elect_the_root_and_join_it(mesh: Callable[..., tuple[Node, FluxOverlay]]) -> None:
    members = [mesh(f"m{i}", priority=p)[1] for i, p in enumerate((1, 5, 2, 0))]
    for flux in members:
        assert flux.wait_online(10), flux.info()
    root = members[1]
    assert root.rank == 0 and sorted(f.rank or 0 for f in members) == [0, 1, 2, 3]
    assert "flux" in roles_of(root.node.headers) and FLUX_HEADER in root.node.headers
    assert FLUX_HEADER == "X-PM-FLUX-TREE"      # X-PM-<OVERLAY>-<WHAT>, as docs/overlays.md says
    answers = {members[0].rpc("peermesh.info", None, r).get_json(5)["rank"] for r in range(4)}
    assert answers == {0, 1, 2, 3}


def test_rank_0_lost_the_next_member_takes_over(
        mesh: Callable[..., tuple[Node, FluxOverlay]]) -> None:
    nodes = [mesh(f"r{i}", priority=p) for i, p in enumerate((9, 5, 1))]
    for _, flux in nodes:
        assert flux.wait_online(10)
    old_root_node, old_root = nodes[0]
    survivor_rank = nodes[2][1].rank
    seen = nodes[2][1].subscribe("t.")
    nodes[1][1].publish("t.before").get(5)
    assert seen.get(5).topic == "t.before"  # type: ignore[union-attr]
    old_root.stop()
    old_root_node.stop(0.1)
    successor = nodes[1][1]
    wait_until(lambda: successor.state is State.ONLINE and successor.rank == 0, 10,
               "the next member as rank 0")
    other = nodes[2][1]
    wait_until(lambda: other.state is State.ONLINE and other.info()["parent"] == 0, 10,
               "the orphan re-attached")
    assert other.rank == survivor_rank                   # kept its rank
    assert other.rpc("broker.ping", b"x", 0).get(5) == b"x"
    successor.publish("t.after").get(5)                 # numbered on from the old root's
    after = seen.get(5)
    assert after is not None and after.topic == "t.after" and after.seq >= 2


def test_metrics_count_rpcs_and_events_per_rank(
        mesh: Callable[..., tuple[Node, FluxOverlay]]) -> None:
    """Scraped from the two members' nodes: what each rank sent, served, answered,
    published and got, as prometheus_client parses it."""
    (root_node, root), (member_node, member) = mesh("root", priority=9), mesh("member")
    assert root.wait_online(10) and member.wait_online(10) and root.rank == 0

    def refuse(request: Any) -> None:
        raise FluxError(22, "no")
    member.register("m.echo", lambda request: request.payload)
    member.register("m.refuse", refuse)
    seen = member.subscribe("t.")
    servers = [MetricsServer(n).start("127.0.0.1:0") for n in (root_node, member_node)]
    try:
        def rpcs(at: int, kind: str) -> float:
            return value(scrape(servers[at].url), "peermesh_flux_rpcs", instance="test",
                         kind=kind)

        def events(at: int, kind: str) -> float:
            return value(scrape(servers[at].url), "peermesh_flux_events", instance="test",
                         kind=kind)
        before = {(at, kind): rpcs(at, kind) for at in (0, 1)
                  for kind in ("sent", "received", "answered", "errors", "responses")}
        for i in range(3):
            assert root.rpc("m.echo", b"%d" % i, member.rank).get(5) == b"%d" % i
        with pytest.raises(FluxError):
            root.rpc("m.refuse", None, member.rank).get(5)
        with pytest.raises(FluxError):  # no such method there: the member's routing says so
            root.rpc("m.missing", None, member.rank).get(5)
        root.publish("t.one").get(5)
        assert seen.get(5).topic == "t.one"  # type: ignore[union-attr]
        families = scrape(servers[0].url)
        assert families["peermesh_flux_rpcs"].type == "counter"
        assert families["peermesh_flux_events"].type == "counter"
        assert rpcs(0, "sent") - before[0, "sent"] == 6   # 5 RPCs and the publish
        assert rpcs(0, "responses") - before[0, "responses"] == 6
        assert rpcs(1, "received") - before[1, "received"] == 4
        assert rpcs(1, "answered") - before[1, "answered"] == 3
        assert rpcs(1, "errors") - before[1, "errors"] == 2   # refused, and no such method
        assert events(0, "published") == 1 and events(0, "sequenced") == 1
        assert events(0, "forwarded") == 1                   # to its one child
        assert events(1, "delivered") == 1 and events(1, "sequenced") == 0
        assert events(1, "published") == 0
    finally:
        for server in servers:
            server.close()


def test_threaded_node_runs_the_overlay(free_udp_port: int) -> None:
    flux = FluxOverlay(root=True, settings=FAST)
    with ThreadedNode("t", overlays=[flux], interface="lo", port=free_udp_port, **TIMING) as tn:
        assert flux.running and flux.endpoint.startswith("tcp://127.0.0.1:")
        assert tn.call(lambda node: flux.info())["rank"] == 0
        tn.call(lambda node: flux.register("t.echo", lambda request: request.payload))
        answer: Future[Any] = Future()   # an RPC from this thread, answered on the hub
        tn.call(lambda node: flux.rpc("t.echo", b"hi", 0).on_response(answer.set_result))
        assert answer.result(5).payload == b"hi"
    assert flux.lifecycle is Lifecycle.STOPPED and flux.state is State.STOPPED


def test_a_member_advertising_an_endpoint_off_the_network_is_never_joined(
        mesh: Callable[..., tuple[Node, FluxOverlay]], free_udp_port: int) -> None:
    """A peer of the instance naming an endpoint outside the node's network (lo: 127.0.0.0/8)
    is refused and counted, even with the highest priority: the others elect among
    themselves and never dial it."""
    liar = Node("liar", interface="lo", port=free_udp_port, headers={FLUX_HEADER: json.dumps(
        {"instance": "test", "endpoint": "tcp://10.1.2.3:5", "priority": 100})}, **TIMING)
    liar.start()
    try:
        members = [mesh(f"m{i}", priority=p)[1] for i, p in enumerate((1, 0))]
        for flux in members:
            wait_until(lambda: flux.limits.get("peer_networks") == 1, 10, "the liar refused")
            assert flux.wait_online(10), flux.info()
        assert members[0].rank == 0 and members[1].rank == 1
    finally:
        liar.stop(0.1)


def test_peer_networks_can_narrow(mesh: Callable[..., tuple[Node, FluxOverlay]]) -> None:
    with pytest.raises(ValueError, match="not a network"):
        FluxOverlay("test", peer_networks=["10.0.0.0/33"])
    first = mesh("m0", priority=1)[1]
    second = mesh("m1", priority=0, peer_networks=["10.0.0.0/8"])[1]
    wait_until(lambda: second.limits.get("peer_networks") == 1, 10, "the other member refused")
    assert first.wait_online(10)
    assert first.rank == 0 and first.size == 1
