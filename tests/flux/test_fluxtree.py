"""Flux mode with children, without flux-core: the rank's core fed flux-core's messages
(hello checks, subtree status, route stacks), and a whole config-booted tree of
peermesh ranks on loopback (rank 0, an interior rank, leaves) from one configuration
file. The same ranks against real flux-core brokers: test_fluxmode.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import gevent
import pytest
import waiting

from peermesh.flux import FluxError
from peermesh.flux.fluxmode import FluxModeMember
from peermesh.flux.fluxrank import STATE_RUN, STATE_SHUTDOWN, FluxModeCore
from peermesh.flux.fluxtree import FluxTree, read_config
from peermesh.flux.outputs import PARENT, Send
from peermesh.io.keys import generate, write_keypair
from peermesh.wire.flux import (
    NODEID_ANY, Control, ControlType, Errno, MsgFlag, Request, Response, decode, encode,
    json_payload, read_json,
)

CHILD = "11111111-2222-3333-4444-555555555555"


def hello(rank: int, *, uuid: str = CHILD, hostname: Optional[str] = None,
          version: int = 0x005800, status: int = 1) -> list[bytes]:
    body: dict[str, Any] = {"rank": rank, "version": version, "uuid": uuid, "status": status}
    if hostname is not None:
        body["hostname"] = hostname
    return encode(Request("overlay.hello", json_payload(body), NODEID_ANY, 7, routes=()))


def sent(outputs: list[Any], link: bytes) -> list[Any]:
    """The messages of ``outputs`` sent on ``link`` (a child's: its identity frame off)."""
    return [decode(o.frames[0 if link == PARENT else 1:]) for o in outputs
            if isinstance(o, Send) and o.link == link]


def rank0(size: int = 3) -> FluxModeCore:
    core = FluxModeCore(0, size, "fake0", hosts=[f"fake{r}" for r in range(size)])
    core.start(0.0)
    return core


@pytest.mark.parametrize("frames,errnum,text", [
    (hello(1, hostname="fake1"), 0, None),
    (hello(1), 0, None),                                     # hostname is optional
    (hello(1, hostname="elsewhere"), Errno.EINVAL, "fake1 is configured as rank 1"),
    (hello(5, hostname="fake5"), Errno.EINVAL, "rank 5 is not a child of rank 0"),
    (hello(1, version=0x005700), Errno.EINVAL,
     "client (0.87.0) version mismatched with server (0.88.0)"),
    (hello(1, uuid="22222222-2222-3333-4444-555555555555"), Errno.EPROTO, "identity"),
    (encode(Request("overlay.hello", b"{}\0", NODEID_ANY, 7, routes=())), Errno.EPROTO, "rank"),
])
def test_a_childs_hello_is_checked_as_flux_core_checks_it(frames: list[bytes], errnum: int,
                                                          text: Optional[str]) -> None:
    core = rank0()
    [answer] = sent(core.receive_child(CHILD.encode(), frames, 1.0), CHILD.encode())
    assert isinstance(answer, Response) and answer.matchtag == 7 and answer.routes == ()
    assert answer.errnum == errnum
    if errnum:
        assert text in answer.payload.rstrip(b"\0").decode()
        assert not core.children[1].online
    else:
        assert read_json(answer.payload) == {"uuid": core.uuid}
        assert core.children[1].online


def test_an_unknown_child_is_disconnected_and_a_goodbye_takes_it_offline() -> None:
    core = rank0()
    child = CHILD.encode()
    ping = encode(Request("broker.ping", b'{"seq":1}\0', 0, 3, routes=()))
    [refusal] = sent(core.receive_child(child, ping, 1.0), child)
    assert isinstance(refusal, Control) and refusal.ctype == ControlType.DISCONNECT
    core.receive_child(child, hello(1), 1.0)
    [pong] = sent(core.receive_child(child, ping, 1.0), child)
    assert read_json(pong.payload)["rank"] == 0
    bye = encode(Request("overlay.goodbye", None, NODEID_ANY, 9, routes=()))
    [answer] = sent(core.receive_child(child, bye, 2.0), child)
    assert (answer.topic, answer.errnum, answer.matchtag) == ("overlay.goodbye", 0, 9)
    assert core.health(2.5)["children"][0] == {
        "rank": 1, "status": "offline", "duration": 0.5, "error": "administrative shutdown"}


def test_an_interior_rank_reports_its_subtree_upstream() -> None:
    core = FluxModeCore(1, 3, "fake1", parents=FluxTree.kary(3, 1, 1).parents,
                        hosts=["fake0", "fake1", "fake2"])
    [first] = sent(core.start(0.0), PARENT)
    assert read_json(first.payload)["status"] == 2            # partial: its child is not in
    parent = "99999999-2222-3333-4444-555555555555"
    out = core.receive(encode(Response("overlay.hello", json_payload({"uuid": parent}), 0,
                                       first.matchtag, routes=())), 1.0)
    status, watch = sent(out, PARENT)
    assert (status.ctype, status.status) == (ControlType.STATUS, 2)
    assert (watch.topic, watch.nodeid, watch.flags & MsgFlag.UPSTREAM) == (
        "state-machine.monitor", 1, MsgFlag.UPSTREAM)
    [up] = sent(core.receive_child(CHILD.encode(), hello(2, hostname="fake2"), 2.0), PARENT)
    assert (up.ctype, up.status) == (ControlType.STATUS, 1)  # full now
    health = core.health(3.0)
    assert (health["status"], health["children"][0]["status"]) == ("full", "full")
    # the child asks its parent's state, as a flux-core broker does
    monitor = encode(Request("state-machine.monitor", b'{"final":7}\0', 2, 4,
                             MsgFlag.STREAMING | MsgFlag.UPSTREAM, routes=()))
    [state] = sent(core.receive_child(CHILD.encode(), monitor, 3.0), CHILD.encode())
    assert read_json(state.payload) == {"state": STATE_RUN}
    # a request from the parent for rank 2 goes down with this rank's uuid pushed; the
    # answer comes back and goes up with it popped
    ping = Request("broker.ping", b'{"seq":1}\0', 2, 5, routes=(parent.encode(), b"client"))
    [down] = sent(core.receive(encode(ping), 4.0), CHILD.encode())
    assert down.routes == (core.identity, parent.encode(), b"client")
    pong = Response("broker.ping", b"{}\0", 0, 5, routes=down.routes)
    [back] = sent(core.receive_child(CHILD.encode(), encode(pong), 4.0), PARENT)
    assert back.routes == (parent.encode(), b"client")
    # a request the child has not answered when it goes fails (EHOSTUNREACH), not waits
    held = Request("pm.hold", None, 2, 6, routes=(parent.encode(), b"client"))
    assert sent(core.receive(encode(held), 4.5), CHILD.encode())[0].topic == "pm.hold"
    # leaving: the child is told SHUTDOWN (its stream ends); goodbye waits for its goodbye
    out = core.leave(5.0)
    told = sent(out, CHILD.encode())
    assert read_json(told[0].payload) == {"state": STATE_SHUTDOWN} and \
        told[1].errnum == Errno.ENODATA
    assert sent(out, PARENT) == [] and core.state == "draining"
    bye = encode(Request("overlay.goodbye", None, NODEID_ANY, 9, routes=()))
    up = sent(core.receive_child(CHILD.encode(), bye, 6.0), PARENT)
    failed = [m for m in up if isinstance(m, Response)]
    assert [(m.topic, m.errnum, m.matchtag, m.routes) for m in failed] == [
        ("pm.hold", Errno.EHOSTUNREACH, 6, (parent.encode(), b"client"))]
    assert [m.topic for m in up if isinstance(m, Request)] == ["overlay.goodbye"]
    assert core.state == "leaving"


@pytest.mark.parametrize("frames", [
    [b"garbage"],                                                    # not a message
    encode(Request("broker.ping", b"{}\0", 0, 3)),                   # no route stack
    encode(Response("broker.ping", b"{}\0", 0, 3, routes=(b"someone-else",))),
    encode(Control(ControlType.STATUS, 99, routes=())),              # a status out of range
])
def test_hostile_messages_of_a_child_are_dropped(frames: list[bytes]) -> None:
    core = rank0()
    child = CHILD.encode()
    core.receive_child(child, hello(1), 1.0)
    dropped = core.stats["dropped"]
    out = core.receive_child(child, frames, 2.0)
    assert out == [] and core.stats["dropped"] == dropped + 1
    assert core.health(3.0)["children"][0]["status"] == "full"


# --- a tree of peermesh ranks on loopback ----------------------------------------------

@pytest.fixture
def config(tmp_path: Path, free_tcp_port: int) -> Path:
    """kary:2 over 4 hosts: 0 -> 1, 2; 1 -> 3. Ranks 0 and 1 listen."""
    import socket
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        port1 = other.getsockname()[1]
    write_keypair(tmp_path / "curve", generate())
    hosts = "".join(f'[[bootstrap.hosts]]\nhost = "fake{r}"\n' + (
        f'bind = "tcp://127.0.0.1:{port}"\nconnect = "tcp://127.0.0.1:{port}"\n'
        if port else "") for r, port in enumerate([free_tcp_port, port1, 0, 0]))
    path = tmp_path / "bootstrap.toml"
    path.write_text(f'[tbon]\ntopo = "kary:2"\n[bootstrap]\ncurve_cert = "curve_secret"\n'
                    + hosts)
    return path


@pytest.fixture
def tree(config: Path) -> Iterator[list[FluxModeMember]]:
    members: list[FluxModeMember] = []
    try:
        for rank in range(4):
            members.append(FluxModeMember.from_config(str(config), f"fake{rank}",
                                                      heartbeat=0.5).start())
            assert members[-1].wait_online(20)
        yield members
    finally:
        for member in reversed(members):
            member.stop(5)


def test_read_config_places_every_rank(config: Path) -> None:
    places = [read_config(str(config), f"fake{r}") for r in range(4)]
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    assert places[0]["parents"] == [-1, 0, 0, 1]
    assert [p["parent"] is None for p in places] == [True, False, False, False]
    assert [p["bind"] is not None for p in places] == [True, True, False, False]
    assert places[3]["parent"] == places[1]["bind"]
    assert places[0]["config"]["tbon"] == {"topo": "kary:2"}
    with pytest.raises(ValueError, match="not among the hosts"):
        read_config(str(config), "elsewhere")


def test_a_tree_of_peermesh_ranks_in_flux_mode(tree: list[FluxModeMember]) -> None:
    root, interior, leaf, below = tree
    waiting.poll_until(lambda: root.core.health(0)["status"] == "full", 20, "a full tree",
                       sleep=gevent.sleep)
    assert [c["status"] for c in root.core.health(0)["children"]] == ["full", "full"]
    # requests route up and down through the interior rank, as flux-core routes them
    pong = json.loads(root.rpc("broker.ping", {"seq": 3, "pad": "x"}, 3, 10).rstrip(b"\0"))
    assert (pong["rank"], pong["seq"], pong["pad"]) == (3, 3, "x")
    assert pong["route"].count("!") == 2                      # 0 -> 1 -> 3
    assert json.loads(below.rpc("attr.get", {"name": "size"}, 0, 10).rstrip(b"\0")) == {
        "value": "4", "flags": 1}
    leaf.register("pm.where", lambda request: {"rank": 2, "got": request.json()})
    assert json.loads(below.rpc("pm.where", {"n": 1}, 2, 10).rstrip(b"\0")) == {
        "rank": 2, "got": {"n": 1}}
    topology = json.loads(below.rpc("overlay.topology", {"rank": 0}, 0, 10).rstrip(b"\0"))
    assert topology == {"rank": 0, "size": 4, "children": [
        {"rank": 1, "size": 2, "children": [{"rank": 3, "size": 1, "children": []}]},
        {"rank": 2, "size": 1, "children": []}]}
    with pytest.raises(FluxError) as missing:
        below.rpc("kvs.lookup", {}, NODEID_ANY, 10)           # up to rank 0: nobody has it
    assert missing.value.errnum == Errno.ENOSYS
    assert "a peermesh rank 0 has no kvs service" in missing.value.message
    # events: rank 0 numbers them, every rank gets them
    events = [member.subscribe("fm.") for member in tree]
    assert root.publish("fm.one", {"n": 1}) == 1
    assert below.publish("fm.two", None, 10) == 2             # through event.publish
    for next_event in events:
        got = [next_event(10), next_event(10)]
        assert [(e.topic, e.seq) for e in got if e] == [("fm.one", 1), ("fm.two", 2)]
    # rank 1 leaves: its child is told the parent shuts down, says goodbye and leaves too
    interior.stop(10)
    assert below.ended.wait(10) and below.core.state == "stopped"
    assert interior.core.state == "stopped"
    children = {c["rank"]: c["status"] for c in root.core.health(0)["children"]}
    assert children == {1: "offline", 2: "full"} and root.core.status == 2  # partial


def test_ranks_0_and_interior_leave_their_children_first(tree: list[FluxModeMember]) -> None:
    root = tree[0]
    root.stop(10)
    for member in tree[1:]:
        assert member.ended.wait(10) and member.core.state == "stopped", member.rank
    assert root.core.state == "stopped" and all(
        not child.online for child in root.core.children.values())
