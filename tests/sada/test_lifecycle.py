"""Channels and servers as overlays: life cycle, where they bind, what endpoints they take."""

from __future__ import annotations

import inspect
from typing import Any

import gevent
import pytest

from peermesh import Node, PeermeshError, ThreadedNode
from peermesh.errors import NodeStateError
from peermesh.overlay import Lifecycle
from peermesh.sada import (Channel, EndpointError, Server, ThreadedChannel, ThreadedServer,
                           echo_service)
from peermesh.sada.endpoints import mesh_endpoint

from .conftest import PING, WAIT, Loopback, wait_until


def test_channel_and_server_follow_the_overlay_life_cycle(free_udp_port: int) -> None:
    node = Node("both", interface="lo", port=free_udp_port)
    channel = Channel(node, ping_interval=PING)
    server = Server(node, services=[echo_service("both")])
    assert channel.lifecycle is server.lifecycle is Lifecycle.ATTACHED
    assert node.headers == {"X-PM-SADA-CHANNEL": channel.endpoint,
                            "X-PM-SADA-SERVER": "SADA1",
                            "X-PM-ROLES": "sada-channel,sada-server"}
    assert channel.endpoint is not None and channel.endpoint.startswith("tcp://127.0.0.1:")
    node.start()
    try:
        with pytest.raises(NodeStateError, match="before its node starts"):
            Channel(node)
        server.start()
        channel.start()
        assert channel.running and server.running
        with pytest.raises(NodeStateError, match="starts once"):
            channel.start()
        assert channel.wait_for("echo", timeout=WAIT)
        assert channel.request("echo", "echo", 7) == 7
    finally:
        server.stop(0)
        channel.stop()
        node.stop()
    assert channel.lifecycle is server.lifecycle is Lifecycle.STOPPED
    channel.stop()                      # idempotent
    with pytest.raises(NodeStateError):
        server.start()


def test_a_channel_never_started_closes_its_socket_on_stop() -> None:
    channel = Channel(address="127.0.0.1")
    assert channel._sock is not None   # noqa: SLF001
    channel.stop()
    assert channel._sock.closed and channel.lifecycle is Lifecycle.STOPPED   # noqa: SLF001
    # its port is free again at once
    again = Channel(endpoint=channel.endpoint)
    again.stop()


def test_a_server_made_on_a_running_node_finds_channels_without_advertising(
        free_udp_port: int) -> None:
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    front = Node("front", **timing)
    channel = Channel(front, ping_interval=PING)
    back = Node("back", **timing)
    front.start()
    back.start()
    try:
        server = Server(back, services=[echo_service("late")])
        assert "X-PM-ROLES" not in back.headers
        channel.start()
        server.start()
        assert channel.wait_for("echo", timeout=WAIT)
        assert channel.request("echo", "info")["server"] == "late"
        server.stop(0)
    finally:
        channel.stop()
        front.stop()
        back.stop()


@pytest.mark.parametrize("endpoint, words", [
    ("tcp://nosuchhost.invalid:5000", "does not resolve"),
    ("tcp://127.0.0.1:99999", "port 99999 is outside 1-65535"),
    ("tcp://127.0.0.1:0", "port 0 is outside 1-65535"),
    ("tcp://127.0.0.1", "is not tcp://HOST:PORT"),
    ("tcp://127.0.0.1:http", "is not tcp://HOST:PORT"),
    ("udp://127.0.0.1:5000", "is not tcp://HOST:PORT or ipc://PATH"),
    ("ipc://", "names no path"),
    ("tcp://*:5000", "wildcard"),
])
def test_bad_channel_endpoints_are_refused_before_anything_starts(endpoint: str,
                                                                   words: str) -> None:
    for make in (lambda: Server(channels=[endpoint]), lambda: Channel(endpoint=endpoint)):
        with pytest.raises(EndpointError, match=words.replace("*", r"\*")) as info:
            make()
        assert isinstance(info.value, PeermeshError) and isinstance(info.value, ValueError)
        assert endpoint in str(info.value)
    server = Server()
    with pytest.raises(EndpointError, match=words.replace("*", r"\*")):
        server.connect(endpoint)
    assert server.channels() == []


@pytest.mark.parametrize("settings, words", [
    (dict(address="127.0.0.1", port=70000), "outside 0-65535"),
    (dict(address="192.0.2.1"), "cannot bind the channel at 192.0.2.1"),   # not ours
    (dict(endpoint="tcp://192.0.2.1:5000"), "cannot bind the channel at tcp://192.0.2.1:5000"),
])
def test_a_channel_that_cannot_bind_says_where(settings: dict[str, Any], words: str) -> None:
    with pytest.raises(EndpointError, match=words):
        Channel(**settings)


def test_a_channel_without_an_address_binds_on_its_nodes_interface(free_udp_port: int) -> None:
    """ThreadedChannel() given to a node on "lo" binds 127.0.0.1, not the LAN address."""
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    channel = ThreadedChannel(ping_interval=PING)
    with pytest.raises(NodeStateError, match="not bound yet"):
        channel.headers
    server = ThreadedServer(services=[echo_service("t")])
    # what ThreadedNode(overlays=[...]) does: attach on the hub before the node starts
    with ThreadedNode("driver", setup=channel.attach, **timing) as driver, \
            ThreadedNode("worker", setup=server.attach, **timing) as worker:
        assert channel.endpoint is not None and channel.endpoint.startswith("tcp://127.0.0.1:")
        assert driver.call(lambda n: n.headers) == {"X-PM-SADA-CHANNEL": channel.endpoint,
                                                    "X-PM-ROLES": "sada-channel"}
        assert worker.call(lambda n: n.headers)["X-PM-ROLES"] == "sada-server"
        # ... and start it on the hub once the node runs; start(node) then makes calls
        driver.call(lambda _: channel.start())
        worker.call(lambda _: server.start())
        channel.start(driver)
        server.start(worker)
        try:
            assert channel.wait_for("echo", timeout=WAIT)
            assert channel.request("echo", "echo", [1, 2]) == [1, 2]
            assert [s.name for s in server.catalog()] == ["echo"]
        finally:
            # what ThreadedNode does before its node stops: stop on the hub
            driver.call(lambda _: channel.stop())
            worker.call(lambda _: server.stop(0))
    assert channel.lifecycle is Lifecycle.STOPPED and not server.running


def test_stop_after_a_handler_that_yields_prints_nothing(loop: Loopback,
                                                          capsys: pytest.CaptureFixture) -> None:
    """A worker greenlet parked after a yielding handler ends quietly when the server stops."""
    channel = loop.channel()
    server = loop.server(channel)

    @server.handler("nap", "nap")
    def nap(seconds: float) -> str:
        gevent.sleep(seconds)
        return "rested"

    assert channel.wait_for("nap", timeout=WAIT)
    assert [channel.request_async("nap", "nap", 0.01) for _ in range(3)][-1].get(WAIT) == \
        "rested"
    assert channel.request("nap", "nap", 0) == "rested"
    server.stop(0.5)
    gevent.idle()                 # the killed workers run their exits on the hub
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "ValueError" not in captured.err, captured.err


@pytest.mark.parametrize("endpoint, taken", [
    ("tcp://127.0.0.1:5000", True),
    ("tcp://[::1]:5000", True),
    ("ipc:///run/peermesh/agent.sock", False),    # never a local socket named by a peer
    ("tcp://localhost:5000", False),              # no name resolved on the hub
    ("tcp://127.0.0.1:0", False),
    ("tcp://127.0.0.1:70000", False),
    ("tcp://0.0.0.0:5000", False),
    ("tcp://224.0.0.1:5000", False),
    ("tcp://127.0.0.1:" + "9" * 300, False),
])
def test_which_channel_endpoints_a_peer_may_name(endpoint: str, taken: bool) -> None:
    assert (mesh_endpoint(endpoint) == endpoint) is taken


def test_a_server_ignores_an_ipc_channel_named_on_the_mesh(free_udp_port: int,
                                                         tmp_path: Any) -> None:
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    liar = Node("liar", headers={"X-PM-SADA-CHANNEL": f"ipc://{tmp_path}/agent.sock"}, **timing)
    front = Node("front", **timing)
    channel = Channel(front, ping_interval=PING)
    back = Node("back", **timing)
    server = Server(back, services=[echo_service("back")])
    nodes = [liar, front, back]
    try:
        for node in nodes:
            node.start()
        channel.start()
        server.start()
        assert channel.wait_for("echo", timeout=WAIT)
        wait_until(lambda: len(back.peers()) == 2, WAIT, "back meets both peers")
        assert server.channels() == [channel.endpoint]
    finally:
        server.stop(0)
        channel.stop()
        for node in nodes:
            node.stop()


@pytest.mark.skipif("overlays" not in inspect.signature(ThreadedNode).parameters,
                    reason="this ThreadedNode takes no overlays=[...]")
def test_threaded_handles_as_overlays_of_threaded_nodes(free_udp_port: int) -> None:
    """``ThreadedNode(overlays=[...])`` attaches, starts and stops them on its hub."""
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    channel = ThreadedChannel(ping_interval=PING)
    server = ThreadedServer(services=[echo_service("t")])
    with ThreadedNode("driver", overlays=[channel], **timing) as driver, \
            ThreadedNode("worker", overlays=[server], **timing) as worker:
        assert channel.endpoint is not None and channel.endpoint.startswith("tcp://127.0.0.1:")
        assert channel.running and server.running
        channel.start(driver)        # the handles' calls go through these nodes
        server.start(worker)
        assert channel.wait_for("echo", timeout=WAIT)
        assert channel.request("echo", "echo", [1, 2]) == [1, 2]
        assert channel.request_async("echo", "echo", 3).result(WAIT) == 3
    assert channel.lifecycle is Lifecycle.STOPPED and not server.running
