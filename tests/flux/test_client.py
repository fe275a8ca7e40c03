"""Rankless clients: a member serves them on its ROUTER (core tables, then real sockets)."""

from __future__ import annotations

import os

import gevent
import pytest

from peermesh.flux import (
    Errno, FluxClient, FluxError, FluxOverlay, FluxRequest, FluxSettings, FluxStateError,
)
from peermesh.flux.core import Send
from peermesh.wire.flux import (
    NODEID_ANY, NODEID_UPSTREAM, Control, ControlType, EventMessage, Request, Response, decode, encode,
    json_payload, read_json,
)

from .conftest import wait_until
from .harness import Tree

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)


def said(out: list, identity: bytes) -> list:
    """What ``out`` sends to ``identity``, decoded."""
    return [decode(o.frames[1:]) for o in out if isinstance(o, Send) and o.link == identity]


def request(topic: str, body: object = None, nodeid: int = NODEID_ANY, tag: int = 1) -> list:
    payload = json_payload(body) if isinstance(body, dict) else None
    return encode(Request(topic, payload, nodeid, tag, 0, ()))


# --- the core: a table of what a member does with a client ---------------------------


def test_a_member_serves_a_client_without_giving_it_a_rank() -> None:
    tree = Tree(k=2, max_clients=2, client_prefixes=1)
    root, one = tree.grow(2)
    me = os.urandom(16)
    assert one.receive(me, request("broker.ping", nodeid=0), tree.now) == []   # stranger: dropped
    (hello,) = said(one.receive(me, request("peermesh.client"), tree.now), me)
    assert isinstance(hello, Response) and hello.errnum == 0
    assert read_json(hello.payload) == {"rank": 1, "size": 2, "seq": 0, "topology": "kary:2",
                                        "heartbeat": 2.0}
    assert root.size == 2 and sorted(root.directory.members) == [0, 1]
    assert one.info()["clients"] == 1

    # a request to rank 0 goes up as from rank 1 and its answer comes back down to the client
    (up,) = one.receive(me, request("peermesh.info", nodeid=0, tag=7), tree.now)
    assert isinstance(up, Send) and up.link == b"^"
    (down,) = root.receive(one.identity, up.frames, tree.now)
    assert isinstance(down, Send) and down.link == one.identity
    (answer,) = said(one.receive(b"^", down.frames[1:], tree.now), me)
    assert isinstance(answer, Response) and answer.matchtag == 7
    assert read_json(answer.payload)["rank"] == 0

    (ok,) = said(one.receive(me, request("event.subscribe", {"topic": "job."}), tree.now), me)
    assert ok.errnum == 0
    (full,) = said(one.receive(me, request("event.subscribe", {"topic": "x"}), tree.now), me)
    assert full.errnum == Errno.EAGAIN                      # client_prefixes
    events = []
    for seq, topic in enumerate(("other.a", "job.done"), 1):
        events += said(one.receive(b"^", encode(EventMessage(topic, None, seq)), tree.now), me)
    assert [(e.topic, e.seq) for e in events] == [("job.done", 2)]

    others = [os.urandom(16), os.urandom(16)]
    (second,) = said(one.receive(others[0], request("peermesh.client"), tree.now), others[0])
    (third,) = said(one.receive(others[1], request("peermesh.client"), tree.now), others[1])
    assert second.errnum == 0 and third.errnum == Errno.ENOSPC    # max_clients
    one.receive(others[0], encode(Control(ControlType.DISCONNECT)), tree.now)
    one.link_down(me, tree.now)                        # a send found its connection gone
    assert one.info()["clients"] == 0

    (again,) = said(one.receive(me, request("peermesh.client"), tree.now), me)
    beats = said(one.handle_timer(tree.now + FAST.heartbeat + 2.0), me)    # idle: a heartbeat
    assert again.errnum == 0 and isinstance(beats[0], Control)
    one.handle_timer(tree.now + tree.settings.lost + 1)       # silent for ``lost``: forgotten
    assert one.info()["clients"] == 0


def test_only_a_direct_link_is_a_client() -> None:
    tree = Tree(k=2)
    root, one = tree.grow(2)
    (refused,) = said(root.receive(one.identity, request("peermesh.client"), tree.now),
                      one.identity)                    # rank 1 is rank 0's child
    assert refused.errnum == Errno.EINVAL
    stranger = os.urandom(16)                          # not a client: its requests are dropped
    assert root.receive(stranger, request("event.subscribe", {"topic": ""}), tree.now) == []
    (child,) = said(root.receive(one.identity, request("event.subscribe", {"topic": ""}),
                                 tree.now), one.identity)
    assert child.errnum == Errno.EPROTO                # a child subscribes through its handles
    assert root.stats["dropped"] >= 1 and root.info()["clients"] == 0


# --- real sockets ------------------------------------------------------------------------


def test_a_client_calls_subscribes_and_leaves_no_trace(
        instance: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, one = instance

    def count(request: FluxRequest) -> None:
        def run() -> None:
            for i in range(request.json()["n"]):
                request.respond({"i": i})
            request.end()
        gevent.spawn(run)

    root.register("demo.count", count)
    root.register("demo.who", lambda request: {"rank": root.rank})
    one.register("here.who", lambda request: {"rank": one.rank})
    for _ in range(3):
        with FluxClient([one.endpoint]).connect(5) as client:
            assert (client.rank, client.size, str(client.topology)) == (1, 2, "kary:2")
            assert client.heartbeat == FAST.heartbeat     # the member's, shorter than 2 s
            assert client.rpc("demo.who").get_json(5) == {"rank": 0}   # ANY: up the tree
            assert client.rpc("here.who").get_json(5) == {"rank": 1}  # the member first
            with pytest.raises(FluxError) as info:      # UPSTREAM: past the member, up
                client.rpc("here.who", None, NODEID_UPSTREAM).get(5)
            assert info.value.errnum == Errno.ENOSYS
            assert client.rpc("peermesh.info", None, 0).get_json(5)["clients"] == 0
            assert [read_json(p)["i"] for p in
                    client.rpc("demo.count", {"n": 3}, 0, streaming=True).stream(5)] == [0, 1, 2]
            with pytest.raises(FluxError) as info:
                client.rpc("demo.who", None, 5).get(5)
            assert info.value.errnum == Errno.EHOSTUNREACH
            assert client.ping(0, 5) > 0
            events = client.subscribe("demo.", 5)
            assert root.publish("demo.x", {"n": 1}).get_json(5)["seq"] >= 1
            assert client.publish("demo.y").get_json(5)["seq"] >= 2
            got = [events.get(5), events.get(5)]
            assert [e.topic for e in got if e is not None] == ["demo.x", "demo.y"]
            assert one.info()["clients"] == 1
        wait_until(lambda: one.info()["clients"] == 0, 5, "the client forgotten")
    assert root.size == 2 and sorted(root.core.directory.members) == [0, 1]


def test_client_bounds_and_misuse(instance: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, one = instance
    with pytest.raises(FluxStateError):
        FluxClient([])
    client = FluxClient([one.endpoint])
    with pytest.raises(FluxStateError):
        client.rpc("a.b")                              # not connected
    unreachable = FluxClient(["tcp://127.0.0.1:9"])
    with pytest.raises(FluxError) as info:
        unreachable.connect(0.3)
    assert info.value.errnum == Errno.ETIMEDOUT
    unreachable.close()
    with client.connect(5):
        with pytest.raises(FluxStateError):
            client.connect(5)


def test_a_lost_member_fails_the_client_rpcs_and_says_so(
        instance: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, one = instance
    client = FluxClient([one.endpoint], heartbeat=0.1, lost=0.6).connect(5)
    lost: list = []
    client.add_listener(lost.append)
    one.register("slow.never", lambda request: None)   # never answered
    future = client.rpc("slow.never")
    one.stop()                                         # DISCONNECT to its clients
    with pytest.raises(FluxError) as info:
        future.get(5)
    assert info.value.errnum == Errno.EHOSTUNREACH, info.value
    assert [n.what for n in lost] == ["member-lost"] and not client.connected
    client.close()
