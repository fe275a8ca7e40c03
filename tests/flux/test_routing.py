"""Request routing as a table: (role, state, message) -> what the node does.

Every row starts from one settled tree (kary:2, seven ranks), brought into a
state (``settled``, rank 3 lost, rank 1 gone, rank 4 orphaned)::

            0
          /   \\
         1     2
        / \\   / \\
       3   4 5   6

with a service ``svc`` (method ``svc.echo``) on rank 4's handle, then feeds
one message to one node (from a link, or from a local handle) and
classifies its first output.
"""

from __future__ import annotations

from typing import Any

import pytest

from peermesh.flux.core import PARENT, Deliver, FluxCore, Send, State
from peermesh.wire.flux import (
    NODEID_ANY, Control, ControlType, Errno, EventMessage, MsgFlag, Request, Response, decode, encode,
    read_json,
)

from .harness import Tree

UP = MsgFlag.UPSTREAM
NORESP = MsgFlag.NORESPONSE


def settled() -> tuple[Tree, dict[int, FluxCore], int]:
    tree = Tree(k=2)
    cores = {c.rank: c for c in tree.grow(7)}
    handle = cores[4].open_handle()
    cores[4].register(handle, "svc.echo")
    return tree, cores, handle


def classify(core: FluxCore, outputs: list, cores: dict[int, FluxCore]) -> tuple[Any, ...]:
    """('up', kind) / ('down', rank, kind) / ('deliver', topic) / ('error', errnum, where) / ()."""
    ranks = {c.identity: r for r, c in cores.items()}
    for output in outputs:
        if isinstance(output, Deliver):
            message = output.item[1]
            if isinstance(message, Response) and message.errnum:
                return ("error", Errno(message.errnum).name, "local")
            return ("deliver", message.topic)
        if isinstance(output, Send):
            frames = output.frames if output.link == PARENT else output.frames[1:]
            message = decode(frames)
            where: Any = "up" if output.link == PARENT else ranks.get(output.link, "stranger")
            if isinstance(message, Response) and message.errnum:
                return ("error", Errno(message.errnum).name, where)
            return ("up",) if where == "up" else ("down", where)
    return ()


def request(topic: str, nodeid: int = NODEID_ANY, flags: MsgFlag = MsgFlag(0)) -> list[bytes]:
    return encode(Request(topic, b"{}\0", nodeid, 7, flags, ()))


ROWS = [
    # (state, node, from, message, expected)
    ("settled", 1, 3, request("svc.echo"), ("up",)),
    ("settled", 4, "parent", request("svc.echo"), ("deliver", "svc.echo")),
    ("settled", 4, "parent", request("svc.other"), ("error", "ENOSYS", "up")),
    ("settled", 0, 1, request("nosvc.x"), ("error", "ENOSYS", 1)),
    ("settled", 0, 2, request("nosvc.x", flags=NORESP), ()),
    ("settled", 0, 1, request("svc.echo", 4), ("down", 1)),
    ("settled", 1, "parent", request("svc.echo", 4), ("down", 4)),
    ("settled", 1, 3, request("svc.echo", 5), ("up",)),
    ("settled", 2, "parent", request("svc.echo", 5), ("down", 5)),
    ("settled", 0, 1, request("svc.echo", 9), ("error", "EHOSTUNREACH", 1)),
    ("settled", 0, 1, request("svc.echo", 0xFFFFFFF0), ("error", "EHOSTUNREACH", 1)),
    ("settled", 4, "parent", request("nosvc.x", 4), ("error", "ENOSYS", "up")),
    ("settled", 3, "parent", request("broker.ping", 3), ("error", None, "up")),
    ("settled", 3, "parent", request("broker.ping"), ("error", None, "up")),
    ("settled", 4, "parent", request("svc.echo", 4, UP), ("up",)),
    ("settled", 1, 3, request("svc.echo", 3, UP), ("up",)),
    ("settled", 0, 1, request("nosvc.x", 1, UP), ("error", "ENOSYS", 1)),
    ("settled", 1, "stranger", request("svc.echo"), ()),
    ("settled", 1, 3, encode(Response("svc.echo", None, 0, 7, routes=(b"z" * 16,))),
     ("down", "stranger")),
    ("settled", 1, "stranger", encode(Response("svc.echo", None, 0, 7, routes=(b"z" * 16,))),
     ()),
    ("settled", 3, 3, encode(EventMessage("x", None, 1)), ()),
    ("settled", 1, 3, [b"junk"], ()),
    ("settled", 1, 3, encode(Control(ControlType.HEARTBEAT)), ()),
    # rank 3 is gone (its parent's heartbeat found it so)
    ("3-lost", 1, "parent", request("svc.echo", 3), ("error", "EHOSTUNREACH", "up")),
    ("3-lost", 4, "parent", request("svc.echo", 3), ("error", "EHOSTUNREACH", "up")),
    ("3-lost", 0, 2, request("svc.echo", 3), ("down", 1)),
    # rank 1 is gone and its children have not re-attached yet (silence < lost)
    ("1-gone", 0, 2, request("svc.echo", 4), ("error", "EHOSTUNREACH", 2)),
    ("1-gone", 4, "stranger", request("svc.echo"), ()),
    # rank 4 lost its parent at once (DISCONNECT) and is attaching to rank 0
    ("4-orphan", 4, "local", request("other.x"), ("error", "EHOSTUNREACH", "local")),
    ("4-orphan", 4, "local", request("svc.x"), ("error", "ENOSYS", "local")),
    ("4-orphan", 4, "local", request("svc.echo"), ("deliver", "svc.echo")),
    ("4-orphan", 0, 2, request("svc.echo", 4), ("down", 1)),  # rank 1 does not know yet
]


def in_state(state: str) -> tuple[Tree, dict[int, FluxCore]]:
    tree, cores, _ = settled()
    if state == "3-lost":
        tree.kill(cores[3])
        tree.advance(tree.settings.heartbeat)
    elif state == "1-gone":
        tree.kill(cores[1])
        tree.advance(tree.settings.heartbeat)
    elif state == "4-orphan":
        tree.hung.add(cores[0].endpoint)      # rank 0 does not answer the hello (yet)
        tree.call(cores[4], cores[4].receive(PARENT, encode(Control(ControlType.DISCONNECT)),
                                             tree.now))
        tree.hung.discard(cores[0].endpoint)
        assert cores[4].state is State.ATTACHING
    return tree, cores


@pytest.mark.parametrize("state, node, source, frames, expected", ROWS)
def test_route(state: str, node: int, source: Any, frames: list[bytes],
               expected: tuple) -> None:
    tree, cores = in_state(state)
    core = cores[node]
    if source == "local":   # from a local handle of the node
        message = decode(frames)
        handle = core.open_handle()
        _, outputs = core.rpc(handle, message.topic, message.payload,  # type: ignore[union-attr]
                              message.nodeid, message.flags, tree.now)  # type: ignore[union-attr]
        assert classify(core, outputs, cores) == expected
        return
    link = {"parent": PARENT, "stranger": b"S" * 16}.get(source) or cores[source].identity
    outputs = core.receive(link, frames, tree.now)
    got = classify(core, outputs, cores)
    if expected[:2] == ("error", None):  # built-ins answer with success
        assert got == ("up",) and decode(outputs[0].frames).errnum == 0  # type: ignore
        return
    assert got == expected


def test_lost_subtree_below_is_unreachable_from_above() -> None:
    tree, cores, _ = settled()
    tree.kill(cores[3])
    tree.advance(tree.settings.heartbeat * 2)  # rank 1's heartbeat finds 3 gone
    outputs = cores[1].receive(PARENT, request("svc.echo", 3), tree.now)
    assert classify(cores[1], outputs, cores) == ("error", "EHOSTUNREACH", "up")
    outputs = cores[4].receive(PARENT, request("svc.echo", 3), tree.now)
    assert classify(cores[4], outputs, cores) == ("error", "EHOSTUNREACH", "up")
    outputs = cores[4].receive(PARENT, request("svc.echo", 3), tree.now)


def test_every_request_answered_once_by_rank() -> None:
    tree, cores, _ = settled()
    client = cores[6].open_handle()
    for rank in range(7):
        tree.rpc(cores[6], client, "peermesh.info", None, rank)
    got = tree.taken(cores[6], client)
    assert all(r.errnum == 0 for r in got)
    assert [read_json(r.payload)["rank"] for r in got] == list(range(7))
