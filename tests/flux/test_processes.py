"""Flux across processes on loopback: RPC, streams, events, SIGKILL, re-attachment, hostile input.

Rank 0 and the other members run in ``fluxchild.py`` processes; the test's
own node joins as a leaf (kary:2: ranks 0; 1, 2; 3 under 1) and talks
through the tree on real sockets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import zmq

from peermesh.flux import Errno, FluxError, FluxOverlay, FluxSettings, MsgFlag, Notice
from peermesh.wire.flux import Request, encode, json_payload

from .conftest import FluxChild, wait_until

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)


@pytest.fixture
def leaf() -> Iterator[Callable[[list[str]], FluxOverlay]]:
    made: list[FluxOverlay] = []

    def join(parents: list[str]) -> FluxOverlay:
        node = FluxOverlay(parents=parents, topology="kary:2", settings=FAST,
                           address="127.0.0.1").start()
        made.append(node)
        assert node.wait_online(10), node.info()
        return node

    try:
        yield join
    finally:
        for node in made:
            node.stop()


def test_rpc_any_rank_stream_cancel_noresponse_and_events(
        flux_children: Callable[..., FluxChild], leaf: Callable[[list[str]], FluxOverlay]) -> None:
    root = flux_children(root=True)
    one = flux_children(parents=[root.endpoint])
    two = flux_children(parents=[root.endpoint])
    me = leaf([two.endpoint])                  # joins through rank 2, attaches under rank 1
    assert (one.ready["rank"], two.ready["rank"], me.rank) == (1, 2, 3)
    assert me.info()["parent"] == 1
    seen = me.subscribe("test.")

    answer = me.rpc("svc.echo", {"x": 1}).get_json(5)      # ANY: up to the first server (rank 1)
    assert answer["rank"] == 1 and answer["got"] == {"x": 1}
    answer = me.rpc("svc.echo", {}, 2).get_json(5)
    assert (answer["rank"], answer["pid"]) == (2, two.ready["pid"])
    assert me.rpc("broker.ping", b"hi", 0).get(5) == b"hi"
    with pytest.raises(FluxError) as error:
        me.rpc("nosuch.thing", None, 2).get(5)
    assert error.value.errnum == Errno.ENOSYS
    with pytest.raises(FluxError) as error:
        me.rpc("svc.echo", {}, 57).get(5)
    assert error.value.errnum == Errno.EHOSTUNREACH

    stream = me.rpc("svc.stream", {"count": 5}, 2, streaming=True)
    assert [p for p in stream.stream(5)] == [json_payload({"i": i}) for i in range(5)]
    long = me.rpc("svc.stream", {"count": 100000, "interval": 0.005}, 0, streaming=True)
    items = long.stream(5)
    first = [next(items) for _ in range(3)]
    assert first == [json_payload({"i": i}) for i in range(3)]
    long.cancel()
    rest = list(items)                          # ends with ENODATA, long before 100000
    assert len(rest) < 1000 and long.done

    futures = [me.rpc("svc.note", {"n": n}, 1, MsgFlag.NORESPONSE) for n in range(5)]
    assert all(f.done and f.matchtag == 0 for f in futures)
    assert me.rpc("svc.notes", None, 1).get_json(5)["notes"] == [{"n": n} for n in range(5)]

    seqs = me.rpc("svc.publish", {"topics": ["test.a", "other.b", "test.c"]}, 2).get_json(5)
    first_seq = seqs["seqs"][0]
    assert seqs["seqs"] == [first_seq, first_seq + 1, first_seq + 2]
    got = [seen.get(5) for _ in range(2)]
    assert [(e.topic, e.seq) for e in got if e] == [("test.a", first_seq),
                                                    ("test.c", first_seq + 2)]
    events = wait_until(lambda: [e for e in me.rpc("svc.events", None, 1).get_json(5)["events"]
                                 if e[1] >= first_seq] or None, 5, "events at rank 1")
    assert events[:3] == [["test.a", first_seq], ["other.b", first_seq + 1],
                          ["test.c", first_seq + 2]]


def test_sigkilled_child_fails_rpcs_through_it_at_once(
        flux_children: Callable[..., FluxChild], leaf: Callable[[list[str]], FluxOverlay]) -> None:
    root = flux_children(root=True, heartbeat=0.1, lost=30.0)
    victim = flux_children(parents=[root.endpoint], lost=30.0)
    me = leaf([root.endpoint])                   # rank 2, under rank 0
    held = [me.rpc("svc.hold", None, victim.ready["rank"]) for _ in range(3)]
    stream = me.rpc("svc.stream", {"count": 10 ** 6, "interval": 0.01}, victim.ready["rank"],
                    streaming=True)
    assert next(stream.stream(5)) == json_payload({"i": 0})
    victim.kill9()
    for future in held:                          # long before `lost` (30 s): a send failed
        with pytest.raises(FluxError) as error:
            future.get(5)
        assert error.value.errnum == Errno.EHOSTUNREACH
    with pytest.raises(FluxError) as error:
        list(stream.stream(5))
    assert error.value.errnum == Errno.EHOSTUNREACH
    assert me.rpc("broker.ping", b"", 0).get(5) == b""


def test_orphans_reattach_keeping_ranks_and_fetch_missed_events(
        flux_children: Callable[..., FluxChild]) -> None:
    root = flux_children(root=True)
    one = flux_children(parents=[root.endpoint])
    flux_children(parents=[root.endpoint])
    settings = FluxSettings(heartbeat=0.1, torpid=0.3, lost=2.0, hello_timeout=0.5)
    me = FluxOverlay(parents=[root.endpoint], topology="kary:2", settings=settings,
                     address="127.0.0.1").start()
    try:
        assert me.wait_online(10)
        assert me.rank == 3 and me.info()["parent"] == 1
        notices: list[Notice] = []
        me.add_listener(notices.append)
        seen = me.subscribe("gap.")
        base = me.rpc("svc.publish", {"topics": ["gap.0"]}, 2).get_json(5)["seqs"][0]
        assert seen.get(5).seq == base  # type: ignore[union-attr]
        # rank 2 publishes 0.2 s from now; rank 3 stays orphaned for 2 s after the kill
        assert me.rpc("svc.publish", {"topics": ["gap.1", "gap.2", "gap.3"], "delay": 0.2},
                      2).get_json(5) == {"accepted": True}
        one.kill9()
        wait_until(lambda: any(n.what == "online" for n in notices), 10, "re-attachment")
        assert me.rank == 3 and me.info()["parent"] == 0
        got = [seen.get(5) for _ in range(3)]
        assert [(e.topic, e.seq) for e in got if e] == [
            ("gap.1", base + 1), ("gap.2", base + 2), ("gap.3", base + 3)]
        assert me.core.stats["replayed"] == 3     # fetched from rank 0, not missed
        assert not [n for n in notices if n.what == "events-lost"]
        assert me.rpc("svc.echo", {}, 2).get_json(5)["rank"] == 2
        assert me.rpc("peermesh.info", None, 0).get_json(5)["children"] == [2, 3]
    finally:
        me.stop()


def test_hostile_frames_are_dropped_and_traffic_goes_on(
        flux_children: Callable[..., FluxChild], leaf: Callable[[list[str]], FluxOverlay]) -> None:
    root = flux_children(root=True, max_message=65536)
    one = flux_children(parents=[root.endpoint])
    me = leaf([root.endpoint])
    context = zmq.Context.instance()
    hostile = []
    for identity in (os.urandom(16), b"^", b"@1", b"abc"):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, identity)
        sock.connect(root.endpoint)
        hostile.append(sock)
    junk = [[b""], [b"x" * 100], [b"\x8e\x01" + b"\0" * 18], [b"a"] * 50, [b"x" * 200000],
            encode(Request("svc.echo", b"{}\0", 1, 9, routes=())),
            encode(Request("peermesh.hello",
                           json_payload({"rank": 1, "uuid": "u", "endpoint": "e"}),
                           0, 3, routes=())),
            encode(Request("peermesh.join", b"not json", 0, 4, routes=()))]
    for sock in hostile:
        for frames in junk:
            sock.send_multipart(frames)
    for _ in range(20):
        answer = me.rpc("svc.echo", {}, one.ready["rank"]).get_json(5)
        assert answer["rank"] == 1
    info = me.rpc("peermesh.info", None, 0).get_json(5)
    assert info["children"] == [1, 2]            # no stranger became a child
    for sock in hostile:
        sock.close(linger=0)
