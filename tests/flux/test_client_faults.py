"""A client's member lost (the client fails over to another) and a client gone (the
services it used are told, and end its streams): core tables, then real sockets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, Callable

import gevent
import pytest
import waiting

from peermesh.flux import (
    Errno, FluxClient, FluxError, FluxOverlay, FluxRequest, FluxSettings, FluxStateError,
)
from peermesh.flux.core import Send
from peermesh.wire.flux import NODEID_ANY, MsgFlag, Request, encode

from .conftest import HERE, FluxChild, wait_until
from .harness import Tree
from .test_client import request

#: each test with the common hops routed in C and in Python (conftest ``both_paths``)
pytestmark = pytest.mark.usefixtures("both_paths")

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)
STREAMING, NORESPONSE = int(MsgFlag.STREAMING), int(MsgFlag.NORESPONSE)


# --- the core: a gone client's disconnects -------------------------------------------------


def from_client(tree: Tree, member: Any, client: bytes, frames: list[bytes]) -> None:
    """``member`` receives ``frames`` from ``client``; what it sends back to the client is
    dropped (the harness would take the client, which is no core, for a gone link)."""
    out = member.receive(client, frames, tree.now)
    tree.call(member, [o for o in out if not (isinstance(o, Send) and o.link == client)])


def test_a_gone_client_is_told_to_each_service_it_used() -> None:
    tree = Tree(k=2, client_services=2)
    root, one = tree.grow(2)
    served = root.open_handle()
    for topic in ("svc.watch", "svc.get", "more.x"):
        root.register(served, topic)
    me = os.urandom(16)
    from_client(tree, one, me, request("peermesh.client"))

    def send(topic: str, nodeid: int, tag: int, flags: int = 0) -> None:
        from_client(tree, one, me, encode(Request(topic, None, nodeid, tag, flags, ())))

    send("svc.watch", 0, 1, STREAMING)
    send("svc.get", NODEID_ANY, 2)
    send("svc.get", NODEID_ANY, 3)                  # the same target: remembered once
    send("svc.note", 0, 0, NORESPONSE)              # nothing to answer: nothing to tell
    send("more.x", 0, 4)                            # past client_services: counted
    send("peermesh.info", 1, 5)                      # built in: nothing to tell
    watch, *_ = tree.taken(root, served)
    assert one.clients.clients[me].targets == {("svc", 0, 0), ("svc", NODEID_ANY, 0)}
    assert one.clients.untracked == 1

    tree.call(one, one.link_down(me, tree.now))     # a send found the client's link gone
    told = tree.taken(root, served)
    assert sorted((m.topic, m.nodeid, m.flags & NORESPONSE, m.routes) for m in told) == [
        ("svc.disconnect", 0, NORESPONSE, watch.routes),
        ("svc.disconnect", NODEID_ANY, NORESPONSE, watch.routes)]
    assert one.info()["clients"] == 0
    tree.call(one, one.link_down(me, tree.now))     # forgotten already: nothing more
    assert tree.taken(root, served) == []


def test_a_member_leaving_tells_the_services_its_clients_used() -> None:
    tree = Tree(k=2)
    root, one = tree.grow(2)
    served = root.open_handle()
    root.register(served, "svc.watch")
    me = os.urandom(16)
    from_client(tree, one, me, request("peermesh.client"))
    from_client(tree, one, me, encode(Request("svc.watch", None, 0, 1, STREAMING, ())))
    (watch,) = tree.taken(root, served)
    tree.call(one, [o for o in one.stop(tree.now) if not (isinstance(o, Send) and o.link == me)])
    # the member's disconnect for its client, then rank 0's for everything from its lost child
    assert [(m.topic, m.routes) for m in tree.taken(root, served)] == [
        ("svc.disconnect", watch.routes), ("svc.disconnect", (one.identity,))]
    assert watch.routes[:1] == (one.identity,)


def test_a_lost_child_is_told_to_the_services_its_requests_reached() -> None:
    """A member killed with its clients' streams open: its parent ends what came through it,
    here and along the links its requests went on (with their own route stacks)."""
    tree = Tree(k=2)
    root, one, two = tree.grow(3)                   # one and two: children of rank 0
    here, there = root.open_handle(), two.open_handle()
    root.register(here, "up.watch")
    two.register(there, "down.watch")
    me = os.urandom(16)
    from_client(tree, one, me, request("peermesh.client"))
    for topic, rank, tag in (("up.watch", 0, 1), ("down.watch", 2, 2), ("down.watch", 2, 3)):
        from_client(tree, one, me, encode(Request(topic, None, rank, tag, STREAMING, ())))
    (up,) = tree.taken(root, here)
    down = tree.taken(two, there)
    assert len(down) == 2 and len(root.routing.inflight) == 2
    tree.kill(one)
    tree.advance(tree.settings.lost + 1)            # rank 0 hears nothing from it: lost
    assert [(m.topic, m.routes) for m in tree.taken(root, here)] == [
        ("up.disconnect", (one.identity,))]
    assert up.routes[:1] == (one.identity,)         # (a stream that came through it)
    assert [(m.topic, m.routes) for m in tree.taken(two, there)] == [
        ("down.disconnect", down[0].routes)]        # once for both streams of that sender
    assert root.routing.inflight == {} and root.routing.via == {}


# --- real sockets: failover ----------------------------------------------------------------


def test_a_client_whose_member_leaves_carries_on_through_another(
        instance: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, one = instance
    ended: list[bool] = []

    def watch(request: FluxRequest) -> None:
        request.on_cancel = lambda: ended.append(request.cancelled)
        request.respond({"watching": True})

    root.register("demo.watch", watch)
    one.register("demo.hold", lambda request: None)
    client = FluxClient([one.endpoint, root.endpoint], failover=10).connect(5)
    notices: list[Any] = []
    client.add_listener(notices.append)
    try:
        events = client.subscribe("demo.", 5)
        held = client.rpc("demo.hold")
        stream = client.rpc("demo.watch", None, 0, streaming=True)
        assert stream.get_json(5) == {"watching": True}
        one.stop()                                   # DISCONNECT to its clients
        for future in (held, stream):
            with pytest.raises(FluxError) as info:
                future.get(5)
            assert info.value.errnum == Errno.EHOSTUNREACH
            assert "the member was lost" in info.value.message
        wait_until(lambda: client.connected, 10, "the client on rank 0")
        assert [n.what for n in notices] == ["member-lost", "member-changed"]
        assert (client.rank, client.endpoint) == (0, root.endpoint)
        # the stream the leaving member carried ended on the service (its disconnect)
        assert wait_until(lambda: ended, 5, "the stream ended on rank 0") == [True]
        assert client.rpc("peermesh.info").get_json(5)["rank"] == 0
        assert client.publish("demo.after").get_json(5)["seq"] >= 1
        event = events.get(5)
        assert event is not None and event.topic == "demo.after"
    finally:
        client.close()


def test_a_client_with_no_member_left_says_so(instance: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, one = instance
    client = FluxClient([one.endpoint], heartbeat=0.1, lost=0.6, failover=0.5).connect(5)
    notices: list[Any] = []
    client.add_listener(notices.append)
    one.stop()
    wait_until(lambda: len(notices) == 2, 10, "the failover given up")
    assert [n.what for n in notices] == ["member-lost", "failover-failed"]
    assert not client.connected and not client.reconnecting
    with pytest.raises(FluxError) as info:           # misuse is not hidden: not connected
        client.connect(0.2)
    assert info.value.errnum == Errno.ETIMEDOUT
    client.close()
    with pytest.raises(FluxStateError, match="failover"):
        FluxClient([one.endpoint], failover=-1)


def test_a_failover_looks_for_members_again_and_takes_one_that_came_later(
        instance: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, one = instance
    came: list[str] = []
    looks: list[float] = []

    def find_members(timeout: float) -> list[str]:   # as a look on the mesh would answer
        looks.append(timeout)
        return list(came)

    client = FluxClient([one.endpoint], heartbeat=0.1, lost=0.6, failover=10,
                        find_members=find_members).connect(5)
    notices: list[Any] = []
    client.add_listener(notices.append)
    later = FluxOverlay(parents=[root.endpoint], topology="kary:2", settings=FAST,
                        address="127.0.0.1").start()
    try:
        events = client.subscribe("demo.", 5)
        assert later.wait_online(10)
        came.append(later.endpoint)
        assert not looks                             # only a failover looks
        one.stop()
        wait_until(lambda: len(notices) == 2, 10, "the client on the member that came later")
        assert [n.what for n in notices] == ["member-lost", "member-changed"]
        assert (client.endpoint, client.rank) == (later.endpoint, later.rank)
        assert looks and 0 < looks[0] <= 10
        assert client.endpoints == [later.endpoint, one.endpoint]
        client.publish("demo.after").get(5)
        event = events.get(5)
        assert event is not None and event.topic == "demo.after"
    finally:
        client.close()
        later.stop()


def test_a_client_fails_over_when_its_member_is_killed(
        flux_children: Callable[..., FluxChild]) -> None:
    root = flux_children(root=True)
    first = flux_children(parents=[root.endpoint])
    second = flux_children(parents=[root.endpoint])
    client = FluxClient([first.endpoint, second.endpoint], heartbeat=0.1, lost=0.6,
                        failover=10).connect(5)
    notices: list[Any] = []
    client.add_listener(notices.append)
    try:
        assert client.rank == first.ready["rank"]
        events = client.subscribe("demo.", 5)
        assert client.publish("demo.before").get_json(5)["seq"] == 1
        held = client.rpc("svc.hold", None, 0)
        stream = client.rpc("svc.stream", {"count": 10 ** 6, "interval": 0.01}, 0,
                            streaming=True)
        assert stream.get_json(5) == {"i": 0}
        first.kill9()
        with FluxClient([root.endpoint]).connect(5) as other:  # events it cannot see now
            for topic in ("demo.gap1", "other.x", "demo.gap2"):
                other.publish(topic).get(5)
        for future in (held, stream):
            with pytest.raises(FluxError) as info:
                while True:
                    future.get(5)
            assert info.value.errnum == Errno.EHOSTUNREACH
        wait_until(lambda: client.connected, 10, "the client on the second member")
        assert [n.what for n in notices] == ["member-lost", "member-changed"]
        assert client.rank == second.ready["rank"]
        answer = client.rpc("svc.echo", {"n": 1}).get_json(5)   # ANY: the member serves it
        assert (answer["rank"], answer["got"]) == (second.ready["rank"], {"n": 1})
        assert client.publish("demo.after").get_json(5)["seq"] == 5
        got = [events.get(5) for _ in range(4)]
        # what was published while it had no member came from rank 0's buffer, in order
        assert [(e.seq, e.topic) for e in got if e is not None] == [
            (1, "demo.before"), (2, "demo.gap1"), (4, "demo.gap2"), (5, "demo.after")]
        assert "events-lost" not in [n.what for n in notices]
        # the stream the killed member carried ended on rank 0 (it lost that child)
        ended = wait_until(lambda: client.rpc("svc.ended", None, 0).get_json(5)["ended"], 10,
                           "the stream ended on rank 0")
        assert [e["cancelled"] for e in ended] == [True]
    finally:
        client.close()


# --- real sockets: a client process killed -------------------------------------------------


def test_a_killed_client_process_ends_its_stream_on_the_service(
        flux_children: Callable[..., FluxChild]) -> None:
    root = flux_children(root=True)
    one = flux_children(parents=[root.endpoint])
    stream_body = {"count": 10 ** 6, "interval": 0.02}
    with FluxClient([one.endpoint]).connect(5) as me:   # a client that closes: DISCONNECT
        stream = me.rpc("svc.stream", stream_body, 0, streaming=True)
        assert stream.get_json(5) == {"i": 0}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}
    env["PYTHONPATH"] = str(HERE.parent.parent)
    process = subprocess.Popen(
        [sys.executable, "-m", "peermesh", "flux", "rpc", "svc.stream",
         '{"count": 1000000, "interval": 0.02}', "--stream", "--rank", "0", "--json",
         "--parent", one.endpoint, "--interface", "lo"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    lines: list[Any] = []
    reader = gevent.spawn(waiting.read_json_lines, process.stdout, lines)
    try:
        wait_until(lambda: len(lines) >= 3, 20, "stream answers printed by the client")
        process.send_signal(signal.SIGKILL)        # no DISCONNECT, no cancel: it is just gone
        process.wait(5)
        with FluxClient([root.endpoint]).connect(5) as me:
            def both() -> Any:
                ended = me.rpc("svc.ended", None, 0).get_json(5)["ended"]
                return ended if len(ended) == 2 else None
            ended = wait_until(both, 10, "both streams ended on the service")
        assert [e["cancelled"] for e in ended] == [True, True]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)
        reader.kill(block=False)
