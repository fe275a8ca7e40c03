"""``peermesh.mtl.Client`` against the gateway overlay (``peermesh.mtl.gateway``) on real
nodes on loopback: mesh groups with ZRE peers, the elected gateway moving (a confirmed
reader resuming on the standby that holds a copy), a gateway killed with SIGKILL and
started again on its store."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gatewayhelp import TIMING, default_users
from peermesh import ThreadedNode
from peermesh.events import EventType
from peermesh.mtl.client import Client, Received
from peermesh.mtl.gateway import Gateway
from waiting import poll_until

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WAIT = 10.0
PASSWORD = "wonderland"      # alice's, in gatewayhelp.default_users


@pytest.fixture
def nodes() -> Iterator[list[ThreadedNode]]:
    started: list[ThreadedNode] = []
    yield started
    for node in reversed(started):
        node.stop()


def start(nodes: list[ThreadedNode], name: str, port: int, *overlays: Gateway) -> ThreadedNode:
    node = ThreadedNode(name, interface="lo", port=port, overlays=list(overlays),
                        **TIMING)  # type: ignore[arg-type]
    node.start()
    nodes.append(node)
    return node


def receive(reader: Any, count: int) -> list[Received]:
    got: list[Received] = []
    while len(got) < count:
        received = reader.receive(timeout=WAIT)
        assert received is not None, f"received {len(got)} of {count}"
        got.append(received)
    return got


def test_a_client_reads_and_writes_a_group_with_zre_peers(
        tmp_path: Path, free_udp_port: int, nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    gateway = Gateway(tmp_path / "creds.json", run="always", data_dir=tmp_path)
    gw_node = start(nodes, "gw", free_udp_port, gateway)
    peer = start(nodes, "peer", free_udp_port)
    peer.join("chat")
    with Client(gateway.control_endpoint, "alice", PASSWORD) as alice:
        reader = alice.reader(["chat"])
        reader.summon("chat")
        poll_until(lambda: gw_node.uuid in peer.peers_by_group("chat"), 5.0,
                   "the peer to see the gateway in chat")
        peer.shout("chat", b"from the mesh")
        got = receive(reader, 1)[0]
        assert (got.resource, got.body, got.properties) == \
            ("chat", b"from the mesh", {"peer": peer.uuid.hex})
        poll_until(lambda: peer.uuid in gw_node.peers_by_group("chat"), 5.0,
                   "the gateway to see the peer in chat")
        writer = alice.writer(["chat"], confirm="full")
        writer.send(b"from off the LAN")
        assert writer.wait(WAIT)
        event = poll_until(lambda: next((e for e in iter(lambda: peer.recv(0.05), None)
                                         if e.type is EventType.SHOUT), None), 5.0,
                           "the peer to hear the client")
        assert event.frames == (b"from off the LAN",)


def test_the_client_follows_the_elected_gateway(tmp_path: Path, free_udp_port: int,
                                                nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    first = Gateway(tmp_path / "creds.json", broker="auto", priority=2, settle=0.1,
                    data_dir=tmp_path / "first")
    second = Gateway(tmp_path / "creds.json", broker="auto", priority=1, settle=0.1,
                     data_dir=tmp_path / "second")
    first_node = start(nodes, "first", free_udp_port, first)
    start(nodes, "second", free_udp_port, second)
    poll_until(lambda: first.active and second.elected_endpoint() == first.control_endpoint,
               5.0, "the first gateway to be elected, as both see it")
    # told only of the standby: its 503 names the elected gateway
    with Client([second.control_endpoint], "alice", PASSWORD, timeout=1.0,
                heartbeat=0.3) as alice:
        assert alice.gateway == first.control_endpoint
        reader = alice.reader(["chat"])
        reader.summon("chat")
        writer = alice.writer(["chat"])
        writer.send(b"one")
        assert receive(reader, 1)[0].body == b"one"
        first_node.stop()                  # the broker leaves: the second takes over
        nodes.remove(first_node)
        poll_until(lambda: second.active, 5.0, "the second gateway to be elected")
        poll_until(lambda: reader.receive(timeout=0.1) is None
                   and alice.gateway == second.control_endpoint, WAIT,
                   "the reader to move to the second gateway")
        assert reader.summoned == ["chat"]
        writer.send(b"two")                # the writer moves when it next sends
        assert receive(reader, 1)[0].body == b"two"


def test_a_confirmed_reader_resumes_on_the_standby_with_what_it_did_not_confirm(
        tmp_path: Path, free_udp_port: int, nodes: list[ThreadedNode]) -> None:
    default_users(tmp_path / "creds.json")
    first = Gateway(tmp_path / "creds.json", priority=2, settle=0.1, data_dir=tmp_path / "1")
    second = Gateway(tmp_path / "creds.json", priority=1, settle=0.1, data_dir=tmp_path / "2")
    first_node = start(nodes, "first", free_udp_port, first)
    second_node = start(nodes, "second", free_udp_port, second)
    poll_until(lambda: second_node.uuid in first.replicas, WAIT,
               "the second gateway to hold a copy of the first one's store")
    with Client([first.control_endpoint, second.control_endpoint], "alice", PASSWORD,
                timeout=1.0, heartbeat=0.3) as alice:
        writer = alice.writer(["jobs"], confirm="full")
        for i in range(50):
            writer.send(b"job %d" % i)
        assert writer.wait(WAIT)             # stored on both gateways
        reader = alice.reader(["jobs"], confirm="full")
        reader.summon("jobs")
        got = receive(reader, 50)
        for received in got[:20]:
            reader.confirm(received)
        assert reader.ping(WAIT)             # answered: the standby forgot them too
        first_node.stop()                    # gone for good: the standby takes over
        nodes.remove(first_node)
        again = receive(reader, 30)          # the reader resumed its lease there
        assert alice.gateway == second.control_endpoint
        assert [r.body for r in again] == [b"job %d" % i for i in range(20, 50)]
        for received in again:
            reader.confirm(received)
        assert reader.ping(WAIT)
        assert reader.receive(timeout=0.3) is None
        assert second.store is not None and second.store.count == 0


def _free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class GatewayProcess:
    """``gatewaychild.py``: a gateway in a process of its own (for SIGKILL)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, str(HERE / "gatewaychild.py"), json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        assert line, "the gateway process ended before it served"
        self.control = json.loads(line)["control"]

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(WAIT)


def test_confirm_full_through_a_gateway_killed_and_started_again(
        tmp_path: Path, free_udp_port: int) -> None:
    default_users(tmp_path / "creds.json")
    config = {"name": "gw", "port": free_udp_port, "credentials": str(tmp_path / "creds.json"),
              "control_port": _free_tcp_port(), "data_port": _free_tcp_port(),
              "data_dir": str(tmp_path), "heartbeat": 0.2}
    gateway = GatewayProcess(config)
    try:
        with Client(gateway.control, "alice", PASSWORD, heartbeat=0.2, timeout=2.0) as alice:
            writer = alice.writer(["jobs"], confirm="full")
            for i in range(50):
                writer.send(b"job %d" % i)
            assert writer.wait(WAIT)
            reader = alice.reader(["jobs"], confirm="full")
            reader.summon("jobs")
            first = receive(reader, 50)
            assert [r.body for r in first] == [b"job %d" % i for i in range(50)]
            assert reader.confirm(first[9], multiple=True)       # jobs 0-9 are safe
            assert reader.ping()                                 # ... and committed
            gateway.kill()
            gateway = GatewayProcess(config)                     # the same ports and store
            # the reader notices, leases again, summons again: what it did not confirm
            # comes again, what it confirmed never does
            again = receive(reader, 40)
            assert [r.body for r in again] == [b"job %d" % i for i in range(10, 50)]
            assert not reader.confirm(first[20])                 # an earlier connection's
            assert reader.confirm(again[-1], multiple=True) and reader.ping()
            assert reader.receive(timeout=0.5) is None
            writer.send(b"after")                                # the writer follows
            assert writer.wait(WAIT)
            assert receive(reader, 1)[0].body == b"after"
    finally:
        gateway.kill()
