"""Request routing as a table: (role, state, message) -> what the node does.

Every row starts from the same settled tree (kary:2, seven ranks)::

            0
          /   \\
         1     2
        / \\   / \\
       3   4 5   6

with a service ``svc`` (method ``svc.echo``) on rank 4's handle, then feeds
one message to one node and classifies its first output.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from peermesh.flux.core import PARENT, Deliver, FluxCore, Send
from peermesh.wire.flux import (
    NODEID_ANY, Control, ControlType, Errno, Event, MsgFlag, Request, Response, decode, encode, read_json,
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
            return ("deliver", output.message.topic)
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
    # (node, from, message, expected)
    (1, 3, request("svc.echo"), ("up",)),
    (4, "parent", request("svc.echo"), ("deliver", "svc.echo")),
    (4, "parent", request("svc.other"), ("error", "ENOSYS", "up")),
    (0, 1, request("nosvc.x"), ("error", "ENOSYS", 1)),
    (0, 2, request("nosvc.x", flags=NORESP), ()),
    (0, 1, request("svc.echo", 4), ("down", 1)),
    (1, "parent", request("svc.echo", 4), ("down", 4)),
    (1, 3, request("svc.echo", 5), ("up",)),
    (2, "parent", request("svc.echo", 5), ("down", 5)),
    (0, 1, request("svc.echo", 9), ("error", "EHOSTUNREACH", 1)),
    (0, 1, request("svc.echo", 0xFFFFFFF0), ("error", "EHOSTUNREACH", 1)),
    (4, "parent", request("nosvc.x", 4), ("error", "ENOSYS", "up")),
    (3, "parent", request("broker.ping", 3), ("error", None, "up")),
    (3, "parent", request("broker.ping"), ("error", None, "up")),
    (4, "parent", request("svc.echo", 4, UP), ("up",)),
    (1, 3, request("svc.echo", 3, UP), ("up",)),
    (0, 1, request("nosvc.x", 1, UP), ("error", "ENOSYS", 1)),
    (1, "stranger", request("svc.echo"), ()),
    (1, 3, encode(Response("svc.echo", None, 0, 7, routes=(b"z" * 16,))), ("down", "stranger")),
    (1, "stranger", encode(Response("svc.echo", None, 0, 7, routes=(b"z" * 16,))), ()),
    (3, 3, encode(Event("x", None, 1)), ()),
    (1, 3, [b"junk"], ()),
    (1, 3, encode(Control(ControlType.HEARTBEAT)), ()),
]


@pytest.mark.parametrize("node, source, frames, expected", ROWS)
def test_route(node: int, source: Any, frames: list[bytes], expected: tuple) -> None:
    tree, cores, _ = settled()
    core = cores[node]
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
        tree.rpc(cores[6], client, "overlay.info", None, rank)
    got = tree.taken(cores[6], client)
    assert all(r.errnum == 0 for r in got)
    assert [read_json(r.payload)["rank"] for r in got] == list(range(7))
