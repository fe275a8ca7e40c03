"""Meshes without broadcast: seeds reached by unicast beacons, then peer exchange."""

from __future__ import annotations

import socket
import time
from typing import Iterator

import pytest

import peermesh
from peermesh.wire import zre
from rawpeer import RawPeer


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def threaded_nodes() -> Iterator[list[peermesh.ThreadedNode]]:
    nodes: list[peermesh.ThreadedNode] = []
    yield nodes
    for node in nodes:
        node.stop(0)


def seeded(nodes: list, name: str, port: int, seeds=(), **settings) -> peermesh.ThreadedNode:
    node = peermesh.ThreadedNode(name, interface="lo", port=port, discovery=(), seeds=seeds,
                                 interval=0.1, **settings).start()
    nodes.append(node)
    return node


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.mark.parametrize("shape", ["chain", "star"])
def test_twelve_nodes_each_knowing_one_seed_converge_to_a_full_mesh(threaded_nodes, shape):
    ports = [free_port() for _ in range(12)]
    for i, port in enumerate(ports):
        seed = () if i == 0 else (f"127.0.0.1:{ports[i - 1 if shape == 'chain' else 0]}",)
        seeded(threaded_nodes, f"n{i}", port, seed)
    wait_until(lambda: all(len(n.peers()) == 11 for n in threaded_nodes))
    everyone = {n.uuid for n in threaded_nodes}
    for node in threaded_nodes:
        assert set(node.peers()) == everyone - {node.uuid}
    # They talk like any mesh: a whisper across the chain.
    first, last = threaded_nodes[0], threaded_nodes[-1]
    first.whisper(last.uuid, b"end to end")
    event = next(e for e in last.events(timeout=5) if e.type == "WHISPER")
    assert event.frames == (b"end to end",)


def test_seeds_that_do_not_answer_are_harmless(threaded_nodes):
    dead = free_port()  # nobody listens there
    real = free_port()
    seeded(threaded_nodes, "seed", real)
    node = seeded(threaded_nodes, "hopeful", free_port(),
                  (f"127.0.0.1:{dead}", f"127.0.0.1:{real}"))
    wait_until(lambda: len(node.peers()) == 1)
    assert node.peer_name(node.peers()[0]) == "seed"


def test_unresolvable_or_malformed_seeds_are_clear_errors():
    with pytest.raises(ValueError, match="cannot resolve host"):
        peermesh.Node(interface="lo", seeds=("no-such-host.invalid:5670",))
    with pytest.raises(ValueError, match="not a number"):
        peermesh.Node(interface="lo", seeds=("127.0.0.1:http",))
    with pytest.raises(ValueError, match="1..65535"):
        peermesh.Node(interface="lo", seeds=("127.0.0.1:0",))


def test_a_plain_zre_peer_never_sees_peer_exchange(threaded_nodes):
    # A seeded node and a Zyre-like raw peer (no X-PM-PEX header): the raw peer
    # must only ever receive the seven ZRE commands.
    other = free_port()
    seeded(threaded_nodes, "other", other)
    node = seeded(threaded_nodes, "seeded", free_port(), (f"127.0.0.1:{other}",))
    wait_until(lambda: len(node.peers()) == 1)  # PEX-capable peers exchange lists
    with RawPeer(name="zyre-like") as raw:
        raw.connect(node.endpoint)
        raw.hello()
        hello = raw.expect(zre.Hello, timeout=5)
        assert hello.headers.get("X-PM-PEX") == "1"  # the node asks for PEX itself ...
        node.whisper(raw.uuid, b"marker")
        seen = []
        while True:
            message = raw.recv(2.0)
            assert message is not None, f"no marker; saw {seen}"
            seen.append(type(message).__name__)
            if isinstance(message, zre.Whisper) and message.content == (b"marker",):
                break
        # ... but never sends it to a peer that did not ask.
        assert not {"PeerExchange", "Unknown"} & set(seen), seen


def test_malformed_peer_exchange_entries_are_ignored(threaded_nodes):
    node = seeded(threaded_nodes, "seeded", free_port(), ("127.0.0.1:9",))
    with RawPeer(name="liar", headers={"X-PM-PEX": "1"}) as raw:
        raw.connect(node.endpoint)
        raw.hello()
        raw.expect(zre.Hello, timeout=5)
        wait_until(lambda: raw.uuid in node.peers())
        entries = ("not an entry", "0" * 32 + " udp://1.2.3.4:5", "zz" * 16 + " tcp://1.2.3.4:5",
                   node.uuid.hex + " " + node.endpoint,  # itself: ignored
                   "x" * 100_000)
        raw.send_message(zre.PeerExchange(raw.next_sequence(), entries))
        raw.whisper(b"after")
        event = next(e for e in node.events(timeout=5)
                     if e.type == "WHISPER" and e.peer == raw.uuid)
        assert event.frames == (b"after",)
        assert node.peers() == [raw.uuid]
