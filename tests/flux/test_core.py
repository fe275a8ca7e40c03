"""FluxCore scenarios on the in-memory tree: joining, RPC, streaming, events, faults."""

from __future__ import annotations

import pytest

from peermesh.flux.core import FluxCore, FluxSettings, Notice, State
from peermesh.flux.errors import FluxStateError
from peermesh.flux.topology import Topology, TopologyError
from peermesh.wire.flux import (
    NODEID_UPSTREAM, Errno, EventMessage, MsgFlag, Request, Response, read_json,
)

from .harness import Tree


def notices(tree: Tree, what: str) -> list[Notice]:
    return [n for _, n in tree.notices if n.what == what]


def test_topology() -> None:
    k2 = Topology.parse("kary:2")
    assert [k2.parent(r) for r in range(1, 7)] == [0, 0, 1, 1, 2, 2]
    assert list(k2.ancestors(9)) == [4, 1, 0] and k2.depth(9) == 3
    assert list(k2.children(1, 10)) == [3, 4] and k2.is_descendant(9, 1)
    flat = Topology.parse("kary:0")
    assert flat.parent(57) == 0 and list(flat.children(0, 4)) == [1, 2, 3]
    assert str(Topology.parse("kary:32")) == "kary:32"
    for bad in ("kary", "kary:-1", "binomial:2", "kary:x"):
        with pytest.raises(TopologyError):
            Topology.parse(bad)


@pytest.mark.parametrize("k", [0, 1, 2, 32])
def test_ranks_and_parents_follow_the_formula(k: int) -> None:
    tree = Tree(k=k)
    cores = tree.grow(12)
    assert [c.rank for c in cores] == list(range(12))
    assert all(c.state is State.ONLINE for c in cores)
    topology = Topology(k)
    assert [c.parent_rank for c in cores[1:]] == [topology.parent(r) for r in range(1, 12)]
    assert cores[0].size == 12 and sorted(cores[0].directory.members) == list(range(12))
    assert all(m.online for m in cores[0].directory.members.values())


def test_join_while_running_and_static_claims() -> None:
    tree = Tree(k=2)
    tree.grow(3)
    late = tree.add(rank=9)               # a static rank: its parent 4 is not there yet
    assert late.rank == 9 and late.parent_rank == 1  # the nearest online ancestor
    grown = tree.add()
    assert grown.rank == 10 and tree.cores["tcp://n0"].size == 11
    clash = tree.add(rank=9)              # rank 9 is held by a live node
    assert clash.rank == 11 and notices(tree, "rank-taken")
    ping = tree.by_rank(0).open_handle()
    tree.rpc(tree.by_rank(0), ping, "peermesh.info", None, 9)
    (answer,) = tree.taken(tree.by_rank(0), ping)
    assert read_json(answer.payload)["rank"] == 9


def test_matchtags_are_reused_only_after_the_final_response() -> None:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(4)}
    server = cores[3].open_handle()
    cores[3].register(server, "svc.slow")
    client = cores[0].open_handle()
    first = tree.rpc(cores[0], client, "svc.slow", None, 3)
    second = tree.rpc(cores[0], client, "svc.slow", None, 3)
    assert (first, second) == (1, 2)
    requests = tree.taken(cores[3], server)
    tree.call(cores[3], cores[3].respond(server, requests[0], b"{}\0", 0, tree.now))
    assert [r.matchtag for r in tree.taken(cores[0], client)] == [1]
    assert tree.rpc(cores[0], client, "svc.slow", None, 3) == 1   # freed: reused
    assert tree.rpc(cores[0], client, "svc.slow", None, 3) == 3   # 2 still pending
    assert tree.rpc(cores[0], client, "svc.slow", None, 3, MsgFlag.NORESPONSE) == 0


def test_streaming_until_enodata_and_cancel() -> None:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(6)}
    server = cores[5].open_handle()
    cores[5].register(server, "svc.stream")
    client = cores[3].open_handle()
    tag = tree.rpc(cores[3], client, "svc.stream", None, 5, MsgFlag.STREAMING)
    (request,) = tree.taken(cores[5], server)
    assert request.flags & MsgFlag.STREAMING
    for i in range(3):
        tree.call(cores[5], cores[5].respond(server, request, b"%d" % i, 0, tree.now))
    got = tree.taken(cores[3], client)
    assert [r.payload for r in got] == [b"0", b"1", b"2"]
    assert tag in cores[3].handles[client].pending
    tree.call(cores[3], cores[3].cancel(client, tag, tree.now))
    (cancel,) = tree.taken(cores[5], server)
    assert cancel.topic == "svc.cancel" and read_json(cancel.payload) == {"matchtag": tag}
    assert cancel.flags & MsgFlag.NORESPONSE and cancel.routes == request.routes
    tree.call(cores[5], cores[5].respond(server, request, None, Errno.ENODATA, tree.now))
    (end,) = tree.taken(cores[3], client)
    assert end.errnum == Errno.ENODATA and tag not in cores[3].handles[client].pending
    assert not any(c.routing.inflight for c in cores.values())  # nothing left tracked on the way


def test_noresponse_and_upstream() -> None:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(4)}
    for rank in (1, 3):
        h = cores[rank].open_handle()
        cores[rank].register(h, "svc.x")
    h3 = cores[3].open_handle()
    tree.rpc(cores[3], h3, "svc.x", b"a", NODEID_UPSTREAM)
    assert [type(m) for m in tree.taken(cores[1])] == [Request]     # served by rank 1, not 3
    assert [type(m) for m in tree.taken(cores[3], h3)] == []
    assert tree.rpc(cores[3], h3, "nosvc.x", None, 0xFFFFFFFF, MsgFlag.NORESPONSE) == 0
    assert tree.taken(cores[3], h3) == []                           # ENOSYS suppressed
    tree.rpc(cores[3], h3, "nosvc.x")
    (error,) = tree.taken(cores[3], h3)
    assert error.errnum == Errno.ENOSYS == 38


def test_lost_child_fails_rpcs_through_it_at_once() -> None:
    tree = Tree(k=2, heartbeat=1.0, torpid=3.0, lost=5.0)
    cores = {c.rank: c for c in tree.grow(4)}
    server = cores[3].open_handle()
    cores[3].register(server, "svc.slow")
    client = cores[0].open_handle()
    stream = tree.rpc(cores[0], client, "svc.slow", None, 3, MsgFlag.STREAMING)
    plain = tree.rpc(cores[0], client, "svc.slow", None, 3)
    tree.kill(cores[3])
    tree.advance(1.0)   # rank 1's next heartbeat finds rank 3 gone (ROUTER_MANDATORY)
    errors = tree.taken(cores[0], client)
    assert sorted(r.matchtag for r in errors) == sorted([stream, plain])
    assert all(r.errnum == Errno.EHOSTUNREACH for r in errors)
    assert [n.rank for n in notices(tree, "child-lost")] == [3]
    assert not cores[0].directory.members[3].online
    assert not cores[0].handles[client].pending


def test_orphans_reattach_to_the_nearest_live_ancestor_keeping_ranks() -> None:
    tree = Tree(k=2, heartbeat=1.0, torpid=3.0, lost=5.0)
    cores = {c.rank: c for c in tree.grow(10)}       # 1 has children 3, 4; 3 has 7, 8
    tree.kill(cores[1])
    tree.advance(8.0)
    assert cores[3].parent_rank == 0 and cores[4].parent_rank == 0
    assert cores[7].parent_rank == 3 and cores[3].rank == 3
    assert [n.rank for n in notices(tree, "parent-lost")] == [1, 1]
    client = cores[9].open_handle()   # 9 is under 4
    for rank in (3, 7, 8, 4):
        tree.rpc(cores[9], client, "broker.ping", b"p", rank)
    assert [r.errnum for r in tree.taken(cores[9], client)] == [0, 0, 0, 0]
    tree.rpc(cores[9], client, "broker.ping", b"p", 1)
    assert [r.errnum for r in tree.taken(cores[9], client)] == [Errno.EHOSTUNREACH]


def test_root_loss_then_return_rejoins_with_the_same_ranks() -> None:
    tree = Tree(k=2, heartbeat=1.0, torpid=3.0, lost=5.0, hello_timeout=2.0)
    cores = {c.rank: c for c in tree.grow(5)}
    tree.kill(cores[0])
    tree.advance(10.0)
    assert cores[1].state is State.JOINING and cores[3].parent_rank == 1
    tree.dead.discard(cores[0].endpoint)  # rank 0 back at its endpoint (fresh state)
    root = FluxCore(cores[0].identity, cores[0].endpoint, settings=tree.settings, root=True)
    tree.cores[root.endpoint] = root
    tree.run(root.endpoint, root.start(tree.now))
    tree.advance(6.0)
    assert cores[1].state is State.ONLINE and cores[1].rank == 1 and cores[2].rank == 2
    assert root.directory.members[1].online and root.directory.members[2].online


def test_leave_sends_disconnect_and_children_reattach_at_once() -> None:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(5)}
    tree.call(cores[1], cores[1].stop(tree.now))
    assert cores[3].parent_rank == 0 and cores[4].parent_rank == 0   # no timeout waited
    assert not cores[0].directory.members[1].online and cores[1].state is State.STOPPED


def test_events_numbered_from_one_and_filtered_by_prefix() -> None:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(7)}
    watcher = cores[4].open_handle()
    cores[4].subscribe(watcher, "job.")
    other = cores[5].open_handle()
    cores[5].subscribe(other, "kvs.")
    publisher = cores[6].open_handle()
    for topic in ("job.start", "kvs.put", "job.end"):
        tree.call(cores[6], cores[6].publish(publisher, topic, b"{}\0", tree.now)[1])
    assert [read_json(r.payload)["seq"] for r in tree.taken(cores[6], publisher)] == [1, 2, 3]
    assert [(e.topic, e.seq) for e in tree.taken(cores[4], watcher)] == [("job.start", 1),
                                                                         ("job.end", 3)]
    assert [(e.topic, e.seq) for e in tree.taken(cores[5], other)] == [("kvs.put", 2)]
    assert all(c.seq == 3 for c in cores.values())


def test_missed_events_are_fetched_from_rank_0() -> None:
    tree = Tree(k=2, heartbeat=1.0, torpid=3.0, lost=5.0)
    cores = {c.rank: c for c in tree.grow(10)}
    watcher = cores[7].open_handle()         # 7 is under 3, under 1
    cores[7].subscribe(watcher, "")
    root = cores[0].open_handle()
    tree.call(cores[0], cores[0].publish(root, "a", None, tree.now)[1])
    tree.kill(cores[1])
    for topic in ("b", "c"):                 # published while 3's subtree is cut off
        tree.call(cores[0], cores[0].publish(root, topic, None, tree.now)[1])
    tree.advance(8.0)                        # 3 re-attaches to 0 and fetches 2..3
    tree.call(cores[0], cores[0].publish(root, "d", None, tree.now)[1])
    got = [(e.topic, e.seq) for e in tree.taken(cores[7], watcher) if isinstance(e, EventMessage)]
    assert got == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert not notices(tree, "events-lost")


def test_events_past_the_buffer_are_reported_lost() -> None:
    tree = Tree(k=2, heartbeat=1.0, torpid=3.0, lost=5.0, recent_events=2)
    cores = {c.rank: c for c in tree.grow(4)}
    watcher = cores[3].open_handle()
    cores[3].subscribe(watcher, "")
    root = cores[0].open_handle()
    tree.kill(cores[1])
    for topic in "abcde":
        tree.call(cores[0], cores[0].publish(root, topic, None, tree.now)[1])
    tree.advance(8.0)
    assert [e.seq for e in tree.taken(cores[3], watcher)] == [4, 5]
    assert [n.detail for n in notices(tree, "events-lost")] == [(1, 3)]


def test_bounds_children_and_inflight() -> None:
    tree = Tree(k=0, max_children=2, max_inflight=1, hello_timeout=1.0)
    cores = tree.grow(4)
    assert len(cores[0].children) == 2 and cores[3].state is not State.ONLINE
    server = cores[1].open_handle()
    cores[1].register(server, "svc.slow")
    client = cores[0].open_handle()
    tree.rpc(cores[0], client, "svc.slow", None, 1)
    tree.rpc(cores[0], client, "svc.slow", None, 1)
    (refused,) = tree.taken(cores[0], client)
    assert refused.errnum == Errno.EAGAIN
    with pytest.raises(FluxStateError):
        cores[0].register(server, "svc")
    with pytest.raises(FluxStateError):
        cores[0].register(server, "broker.x")
    with pytest.raises(FluxStateError, match="heartbeat <= torpid"):
        FluxSettings(heartbeat=5.0, torpid=1.0)


def test_hostile_hello_and_stranger_traffic() -> None:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(5)}
    from peermesh.wire.flux import encode, json_payload
    hello = encode(Request("peermesh.hello",
                           json_payload({"rank": 2, "uuid": "x", "endpoint": "e"}),
                           1, 5, routes=()))
    out = cores[1].receive(b"S" * 16, hello, tree.now)   # rank 2 is not below rank 1
    (send,) = out
    from peermesh.wire.flux import decode
    assert decode(send.frames[1:]).errnum == Errno.EINVAL  # type: ignore[union-attr]
    assert cores[1].receive(b"^", [b"x"], tree.now) == []  # a 1-byte identity posing as parent
    assert cores[1].receive(b"@1", hello, tree.now) == []
    assert isinstance(decode(hello), Request) and not isinstance(decode(hello), Response)


def test_a_join_cannot_grow_the_instance_past_max_size() -> None:
    from peermesh.wire.flux import decode, encode, json_payload
    tree = Tree(k=2, max_size=8)
    root = tree.grow(3)[0]
    for rank in (8, 0xFFFFFFF0):
        join = encode(Request("peermesh.join", json_payload(
            {"rank": rank, "uuid": "u", "endpoint": "tcp://x"}), 0, 5, routes=()))
        (answer,) = root.receive(b"S" * 16, join, tree.now)
        assert decode(answer.frames[1:]).errnum == Errno.EPROTO  # type: ignore[union-attr]
    assert root.size == 3
    for _ in range(5):
        tree.add()
    assert root.size == 8 and tree.add().state is State.JOINING  # ENOSPC: no ninth rank


def test_a_silent_child_is_torpid_then_lost_and_heartbeats_keep_idle_links_alive() -> None:
    tree = Tree(k=2, heartbeat=1.0, torpid=3.0, lost=6.0)
    cores = {c.rank: c for c in tree.grow(4)}
    tree.advance(20.0)                       # idle: heartbeats alone keep every link
    assert not notices(tree, "child-torpid") and not notices(tree, "child-lost")
    tree.hung.add(cores[3].endpoint)         # alive to the network, but silent
    tree.advance(3.5)
    assert [n.rank for n in notices(tree, "child-torpid")] == [3] and 3 in cores[1].info()["torpid"]
    assert not notices(tree, "child-lost")
    tree.advance(3.0)
    assert [n.rank for n in notices(tree, "child-lost")] == [3]
    assert 3 not in cores[1].info()["children"] and not cores[0].directory.members[3].online


def test_a_joining_node_takes_the_instance_topology_from_the_join_answer() -> None:
    import os
    tree = Tree(k=2)
    tree.grow(3)
    odd = FluxCore(os.urandom(16), "tcp://odd", settings=FluxSettings(topology=Topology(32)),
                   bootstrap=["tcp://n0"])                  # started with the default kary:32
    tree.cores[odd.endpoint], tree.delivered[odd.endpoint] = odd, []
    tree.dialed[odd.endpoint] = None
    tree.run(odd.endpoint, odd.start(tree.now))
    assert (odd.rank, odd.parent_rank, odd.topology) == (3, 1, Topology(2))
    assert odd.info()["topology"] == "kary:2"
    below = tree.add(rank=7)          # in kary:2 rank 7 is below rank 3 (in kary:32, rank 0's)
    assert below.online and below.parent_rank == 3


def test_a_refused_join_is_tried_again_soon_with_a_bounded_backoff() -> None:
    tree = Tree(k=2)
    root = tree.add(root=True)
    detached = tree.add(bootstrap=[])       # not in the tree: it refuses joins (EHOSTUNREACH)
    late = tree.add(bootstrap=[detached.endpoint, root.endpoint])
    assert late.state is State.JOINING and notices(tree, "join-failed")
    assert late.next_deadline() == pytest.approx(tree.now + 0.05)    # not the 2 s tick
    tree.advance(0.05, step=0.05)
    assert late.online and late.rank == 1

    alone = tree.add(bootstrap=[detached.endpoint])     # refused again and again
    waits = []
    for _ in range(8):
        waits.append(round(alone.next_deadline() - tree.now, 3))
        tree.advance(alone.next_deadline() - tree.now, step=alone.next_deadline() - tree.now)
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]       # doubled up to heartbeat
    assert not alone.online


def test_the_parts_are_held_with_their_own_state_not_inherited() -> None:
    """Routing, the event log and membership are parts the node holds: no base class, each
    part's state its own, and no module reads another's private names."""
    import ast
    import inspect

    from peermesh.flux import core, events, membership, routing

    assert FluxCore.__bases__ == (object,)
    tree = Tree(k=2)
    cores = tree.grow(4)
    node = cores[3]
    assert node.routing.node is node and node.log.node is node
    assert node.membership.node is node and node.membership.routing is node.routing
    assert node.membership.candidates[0][0] == node.parent_rank == 1  # (the parent it tried)
    assert not [name for name in vars(node) if name in (
        "inflight", "via", "internal", "parent_heard", "candidates", "deadline", "backoff")]
    for module in (core, events, membership, routing):
        source = ast.parse(inspect.getsource(module))
        own = {"self", "cls"} | {n.name for n in ast.walk(source) if isinstance(n, ast.ClassDef)}
        foreign = [f"{module.__name__}:{n.lineno} .{n.attr}" for n in ast.walk(source)
                   if isinstance(n, ast.Attribute) and n.attr.startswith("_")
                   and not n.attr.startswith("__")
                   and not (isinstance(n.value, ast.Name) and n.value.id in own)]
        assert foreign == []
