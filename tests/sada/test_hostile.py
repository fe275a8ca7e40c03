"""Hostile servers and channels, as bounded versions of the floods that once hurt.

A hostile server is a bare ROUTER (``RawPeer``) speaking SADA1 frames by
hand; channels and servers are real, on 127.0.0.1. Each flood keeps the
shape of the attack with fewer inputs: the limits are lowered where the
test needs to pass them.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Optional

import gevent
import gevent.event
import pytest
import zmq

from peermesh import Node
from peermesh.sada import CatalogFull, Channel, Server, Service, echo_service
from peermesh.sada.endpoints import as_networks, mesh_endpoint
from peermesh.sada.server import MAX_CONCURRENT

from .conftest import PING, WAIT, Loopback, wait_until
from .test_inprocess import RawPeer
from .test_routing import intr, make, sent

GOOD = "good"


@pytest.fixture
def raw() -> Iterator[Callable[..., RawPeer]]:
    """``raw(identity=None)``: a bare ROUTER speaking SADA1 by hand, closed at the end."""
    peers: list[RawPeer] = []

    def make(identity: Optional[bytes] = None) -> RawPeer:
        peers.append(RawPeer(identity))
        return peers[-1]

    yield make
    for peer in peers:
        peer.close()


def _good_answers(channel: Channel, count: int, **kw: Any) -> list[str]:
    """Who answered ``count`` echo requests (the server's label from ``echo info``)."""
    results = [channel.request_async("echo", "info", None, **kw) for _ in range(count)]
    return [result.get(WAIT)["server"] for result in results]


# --------------------------------------------------------------------------
# A server speaks only for itself


@pytest.mark.usefixtures("native_path")
def test_a_server_cannot_take_over_another_servers_routing_id(loop: Loopback, raw: Any) -> None:
    channel = loop.channel()
    loop.server(channel, label=GOOD)
    assert channel.wait_for("echo", timeout=WAIT)
    (good,) = channel.servers()
    hostile = raw(bytes.fromhex(good.id)).connect(channel.endpoint)
    alias = channel.endpoint.encode()
    hostile.send(alias, *intr("echo 1.9"))
    for counter in range(1, 40):   # REPs for the ids the channel will use next
        hostile.send(alias, b"", b"SADA1", b"REP", channel.id.encode() + b"-%x" % counter,
                     b"200", b"\x81\xa6server\xa6forged")
    assert _good_answers(channel, 30) == [GOOD] * 30
    assert [s.id for s in channel.servers()] == [good.id]
    assert [(s.name, s.version) for s in channel.servers()[0].services] == [("echo", "1.0")]


@pytest.mark.usefixtures("native_path")
def test_a_server_cannot_answer_requests_another_server_holds(loop: Loopback, raw: Any) -> None:
    channel = loop.channel()
    loop.server(channel, label=GOOD)
    hostile = raw().connect(channel.endpoint)
    alias = channel.endpoint.encode()
    hostile.send(alias, *intr("trap 1"))
    assert channel.wait_for("echo", timeout=WAIT) and channel.wait_for("trap", timeout=WAIT)
    channel.request_async("trap", "x", None, timeout=WAIT)   # tells the hostile our ids
    req = hostile.expect(b"REQ")
    prefix, _, counter = req[4].rpartition(b"-")
    forged = gevent.spawn(lambda: [hostile.send(alias, b"", b"SADA1", b"REP",
                                                prefix + b"-%x" % (int(counter, 16) + n),
                                                b"200", b"\x81\xa6server\xa6forged")
                                   for n in range(1, 200)])
    assert _good_answers(channel, 100) == [GOOD] * 100
    forged.join(WAIT)
    assert channel.stats["replies"] >= 100


def test_requests_for_a_version_stay_with_the_server_that_has_it(loop: Loopback,
                                                                  raw: Any) -> None:
    """A newcomer offering a higher version takes unversioned requests (the spec's
    best version), never those that name the version the good server has."""
    channel = loop.channel()
    loop.server(channel, label=GOOD)
    hostile = raw().connect(channel.endpoint)
    hostile.send(channel.endpoint.encode(), *intr("echo 1.9"))
    wait_until(lambda: "1.9" in channel.services().get("echo", {}), WAIT, "the hostile INTR")
    assert _good_answers(channel, 50, version="1.0") == [GOOD] * 50


# --------------------------------------------------------------------------
# Catalog bounds at the channel


def test_intrs_over_max_services_are_dropped_unread_and_counted_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    router = make(max_services=64)
    with caplog.at_level(logging.WARNING, logger="peermesh.sada.routing"):
        for n in range(20):
            router.on_message(b"h%d" % n, intr(*[f"s{i} 1" for i in range(65)]), 0.001 * n)
    assert router.servers(0.0) == [] and router.services() == {}
    assert router.stats["max_services"] == 20
    assert len([r for r in caplog.records if "max_services" in r.getMessage()]) == 1


def test_the_catalog_is_bounded_and_a_full_one_costs_only_what_changes(
        caplog: pytest.LogCaptureFixture) -> None:
    router = make(max_services=64, max_catalog=256)
    with caplog.at_level(logging.WARNING, logger="peermesh.sada.routing"):
        for n in range(20):
            router.on_message(b"h%d" % n, intr(*[f"s{n}-{i} 1" for i in range(64)]), 0.0)
        router.on_message(b"good", intr("echo 1"), 0.5)          # full: refused as well
    assert len(router.servers(0.0)) == 4
    assert sum(len(v) for versions in router.services().values() for v in versions.values()) \
        == 256
    assert router.stats["max_catalog"] == 17 and router.offers("echo") == 0
    assert len([r for r in caplog.records if "max_catalog" in r.getMessage()]) == 1
    for tick in range(1, 20):                                 # the four go silent: dropped
        router.handle_timer(tick * 0.25)
    sent(router)
    router.on_message(b"good", intr("echo 1"), 5.0)
    assert router.offers("echo") == 1 and router.stats["servers_dropped"] == 4


def test_a_channel_flooded_with_long_intrs_keeps_serving(loop: Loopback, raw: Any) -> None:
    channel = loop.channel(max_services=64, max_catalog=256)
    loop.server(channel, label=GOOD)
    hostiles = [raw().connect(channel.endpoint) for _ in range(20)]
    for n, hostile in enumerate(hostiles):
        hostile.send(channel.endpoint.encode(), *intr(*[f"s{n}-{i} 1" for i in range(65)]))
    wait_until(lambda: channel.stats["max_services"] == 20, WAIT, "20 INTRs dropped")
    assert _good_answers(channel, 20) == [GOOD] * 20
    assert [s for s in channel.services() if s.startswith("s")] == []


def test_router_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        make(max_services=0)
    with pytest.raises(ValueError):
        make(max_catalog=0)


# --------------------------------------------------------------------------
# Servers: what they advertise, how much they run, where they connect


def test_a_server_refuses_more_services_than_one_intr_may_list() -> None:
    server = Server(max_services=3)
    for i in range(3):
        server.add_service(Service(f"s{i}", "1"))
    server.add_service(Service("s0", "1"))      # replacing one is not adding
    with pytest.raises(CatalogFull, match="max_services"):
        server.add_service(Service("s3", "1"))
    server.remove_service("s1", "1")
    server.add_service(Service("s3", "1"))
    assert len(server.catalog()) == 3


def test_servers_have_a_default_concurrency_limit(loop: Loopback, raw: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A flood of REQs whose handler never returns: past the default limit each gets 503."""
    release = gevent.event.Event()
    hold = Service("hold", "1")

    @hold.action("wait")
    def wait(_: Any) -> None:
        release.wait()

    fake = raw(b"fake").bind("tcp://127.0.0.1:*")
    endpoint = fake.sock.getsockopt_string(zmq.LAST_ENDPOINT)
    server = Server(channels=[endpoint], services=[hold]).start()
    loop.servers.append(server)
    assert server.max_concurrent == MAX_CONCURRENT
    (alias, *_) = fake.expect(b"INTR")
    over = 50
    with caplog.at_level(logging.WARNING, logger="peermesh.sada.server"):
        for n in range(MAX_CONCURRENT + over):
            fake.send(alias, b"", b"SADA1", b"REQ", b"r%d" % n, b"hold", b"1", b"", b"wait", b"")
        busy = [fake.expect(b"REP") for _ in range(over)]
    assert {frames[5] for frames in busy} == {b"503"}
    assert server.stats["busy"] == over and server.limits.get("max_concurrent") == over
    assert len([r for r in caplog.records if "max_concurrent" in r.getMessage()]) == 1
    release.set()


def test_server_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        Server(max_concurrent=0)
    with pytest.raises(ValueError):
        Server(max_services=0)
    with pytest.raises(Exception, match="not a network"):
        Server(channel_networks=["10.0.0.0/33"])


@pytest.mark.parametrize("endpoint, networks, taken", [
    ("tcp://127.0.0.1:5000", ["127.0.0.0/8"], True),
    ("tcp://10.1.2.3:5000", ["127.0.0.0/8"], False),
    ("tcp://10.1.2.3:5000", ["127.0.0.0/8", "10.1.2.0/24"], True),
    ("tcp://[::1]:5000", ["127.0.0.0/8"], False),
    ("ipc:///run/peermesh/agent.sock", ["0.0.0.0/0"], False),
    ("tcp://127.0.0.1:5000", [], False),
])
def test_channel_endpoints_from_the_mesh_must_be_in_the_networks(
        endpoint: str, networks: list[str], taken: bool) -> None:
    assert (mesh_endpoint(endpoint, as_networks(networks)) == endpoint) is taken


def test_a_server_ignores_channels_outside_its_nodes_network(free_udp_port: int) -> None:
    """A peer naming a channel off the node's network (lo: 127.0.0.0/8) is not connected to;
    ``channel_networks`` can narrow what is accepted."""
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    liar = Node("liar", headers={"X-PM-SADA-CHANNEL": "tcp://192.0.2.7:5000"}, **timing)
    front = Node("front", **timing)
    channel = Channel(front, ping_interval=PING)
    back = Node("back", **timing)
    server = Server(back, services=[echo_service("back")])
    narrow = Node("narrow", **timing)
    picky = Server(narrow, services=[echo_service("narrow")], channel_networks=["10.0.0.0/8"])
    nodes = [liar, front, back, narrow]
    try:
        for node in nodes:
            node.start()
        channel.start()
        server.start()
        picky.start()
        assert channel.wait_for("echo", timeout=WAIT)
        wait_until(lambda: len(back.peers()) == 3 and len(narrow.peers()) == 3, WAIT,
                   "every node meets the others")
        assert server.channels() == [channel.endpoint]
        assert picky.channels() == []
        assert server.limits.get("channel_networks") == 1
        assert picky.limits.get("channel_networks") == 2
    finally:
        picky.stop(0)
        server.stop(0)
        channel.stop()
        for node in nodes:
            node.stop()
