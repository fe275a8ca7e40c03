"""The routing fast path (PROTO and route frames only) does exactly what the full path does.

Every message of the routing table (``test_routing.ROWS``), its responses, and
malformed variants of each, go to two copies of the same node: one as it
is, one whose fast path is switched off (``Routing.pass_through`` and ``_next_hop``
answer None, so every message is decoded and every RPC built as a message).
Outputs, what each tracks in flight and its counters must be equal.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest

from peermesh.flux.bodies import ping_body
from peermesh.flux.core import PARENT, FluxCore, Send
from peermesh.wire.flux import NODEID_ANY, MsgFlag, Request, Response, decode, encode, read_json

from .test_routing import ROWS, in_state


def full_path_only(core: FluxCore) -> FluxCore:
    """A copy of ``core`` that decodes everything (its fast path switched off)."""
    twin = copy.deepcopy(core)
    twin.routing.pass_through = lambda *args: None  # type: ignore[method-assign]
    twin.routing._next_hop = lambda *args: None  # type: ignore[method-assign]
    return twin


def variants(frames: list[bytes]) -> list[list[bytes]]:
    """``frames`` and malformed versions of it."""
    proto = frames[-1]
    out = [frames, frames[:-1] + [b"\x8f" + proto[1:]],          # bad magic
           frames[:-1] + [proto[:2] + b"\x10" + proto[3:]]]      # unknown type
    if b"" in frames:
        d = frames.index(b"")
        out.append(frames[:d] + frames[d + 1:])                     # no delimiter
        out.append(frames[:-1] + [b"extra", proto])                  # a frame no flag announces
        if proto[3] & MsgFlag.TOPIC:
            out.append(frames[:d + 1] + [b""] + frames[d + 2:])      # empty topic
            out.append(frames[:d + 1] + [b"\xff\xfe"] + frames[d + 2:])  # topic not UTF-8
        out.append(frames[:-1] + [proto[:3] + bytes([proto[3] | 0x44]) + proto[4:]])
    return out


def same(core: FluxCore, link: bytes, frames: list[bytes], now: float) -> None:
    twin = full_path_only(core)
    assert core.receive(link, list(frames), now) == twin.receive(link, list(frames), now)
    assert core.routing.inflight == twin.routing.inflight and core.routing.via == twin.routing.via
    assert core.stats == twin.stats
    assert core.clients.clients == twin.clients.clients
    assert core.clients.untracked == twin.clients.untracked


@pytest.mark.parametrize("state, node, source, frames", [row[:4] for row in ROWS])
def test_fast_path_routes_as_the_full_path(state: str, node: int, source: Any,
                                           frames: list[bytes]) -> None:
    tree, cores = in_state(state)
    core = cores[node]
    if source == "local":
        return  # local RPCs: test_local_rpc_fast_path
    link = {"parent": PARENT, "stranger": b"S" * 16}.get(source) or cores[source].identity
    for variant in variants(frames):
        same(core, link, variant, tree.now)


@pytest.mark.parametrize("flags", [0, MsgFlag.NORESPONSE, MsgFlag.STREAMING])
def test_responses_on_the_way_back_and_to_a_handle(flags: int) -> None:
    tree, cores = in_state("settled")
    handle = cores[4].open_handle()
    cores[4].register(handle, "job.slow")
    client = cores[6].open_handle()
    tree.rpc(cores[6], client, "job.slow", b"x", 4, flags)
    (request,) = tree.taken(cores[4], handle)
    outputs = cores[4].respond(handle, request, b"answer", 0, tree.now)
    hops: list[tuple[FluxCore, bytes, list[bytes]]] = []
    # follow the response up from rank 4 and down to rank 6, checking each hop
    for output in outputs:
        hops.append((cores[1], cores[4].identity, output.frames))
    checked = 0
    while hops:
        core, link, frames = hops.pop()
        checked += 1
        for variant in variants(frames):
            same(core, link, variant, tree.now)
        for output in core.receive(link, list(frames), tree.now):
            if type(output) is not Send:
                continue
            target = next((c for c in cores.values() if c.identity == output.link), None)
            if target is not None:
                hops.append((target, PARENT, output.frames[1:]))
            elif output.link == PARENT:
                parent = cores[core.parent_rank]  # type: ignore[index]
                hops.append((parent, core.identity, output.frames))
    assert checked == (0 if flags & MsgFlag.NORESPONSE else 4)  # 4 -> 1 -> 0 -> 2 -> 6


@pytest.mark.parametrize("nodeid, flags", [(0, 0), (2, 0), (5, MsgFlag.STREAMING),
                                           (6, MsgFlag.NORESPONSE), (9, 0), (1, 0),
                                           (NODEID_ANY, 0), (3, MsgFlag.UPSTREAM)])
@pytest.mark.parametrize("payload", [None, b"p"])
def test_local_rpc_fast_path(nodeid: int, flags: int, payload: Optional[bytes]) -> None:
    tree, cores = in_state("settled")
    core = cores[3]
    handle = core.open_handle()
    twin = full_path_only(core)
    got = core.rpc(handle, "svc.echo", payload, nodeid, flags, tree.now)
    want = twin.rpc(handle, "svc.echo", payload, nodeid, flags, tree.now)
    assert got == want
    assert core.routing.inflight == twin.routing.inflight and core.stats == twin.stats


def test_ping_for_this_rank_is_answered_from_its_frames() -> None:
    tree, cores = in_state("settled")
    for flags in (0, MsgFlag.NORESPONSE, MsgFlag.STREAMING):
        ping = encode(Request("broker.ping", b"data", 3, 9, flags, (b"@2",)))
        same(cores[3], PARENT, ping, tree.now)
        same(cores[1], cores[3].identity, encode(Request("broker.ping", None, 1, 9, flags, ())),
             tree.now)
    stray = encode(Response("broker.ping", None, 0, 9, routes=(b"@7",)))
    same(cores[3], PARENT, stray, tree.now)   # a response to no handle


@pytest.mark.parametrize("body", [ping_body(3, "pp"), b'{"seq":1,"pad":"\xc3\xa9"}\0',
                                  b"{}\0", b"{not json\0", b'{"a":1}', b"{" * 300 + b"\0"])
def test_flux_json_ping_is_answered_from_its_frames(body: bytes) -> None:
    """flux's JSON ping for this rank, from the parent and from a child, with and without
    routes: the answer flux-core gives (route, userid, rolemask, rank added), made from
    the frames; malformed bodies get the full path's EPROTO."""
    tree, cores = in_state("settled")
    for flags in (0, MsgFlag.NORESPONSE, MsgFlag.STREAMING):
        same(cores[3], PARENT, encode(Request("broker.ping", body, 3, 9, flags, (b"@2",),
                                              1000, 5)), tree.now)
        same(cores[1], cores[3].identity, encode(Request("broker.ping", body, 1, 9, flags, ())),
             tree.now)
    (answer,) = cores[1].receive(cores[3].identity,
                                 encode(Request("broker.ping", ping_body(3, "pp"), 1, 9, 0, ())),
                                 tree.now)
    assert copy.deepcopy(cores[1]).routing.pass_through(   # (taken by the fast path)
        cores[3].identity, encode(Request("broker.ping", ping_body(3), 1, 9, 0, ())),
        tree.now) is not None
    got = read_json(decode(answer.frames[1:]).payload)  # type: ignore[union-attr]
    assert got["rank"] == 1 and got["seq"] == 3 and got["pad"] == "pp"
    assert got["route"] == f"{cores[3].uuid[:8]}!{cores[1].uuid[:8]}"


CLIENT = b"C" * 16


@pytest.mark.parametrize("frames", [
    encode(Request("broker.ping", ping_body(0), 5, 9, 0, ())),       # routed down
    encode(Request("broker.ping", ping_body(0), 1, 9, 0, ())),       # this rank, JSON
    encode(Request("broker.ping", b"raw", 1, 9, 0, ())),             # this rank, raw
    encode(Request("broker.ping", ping_body(0), 0, 9, 0, ())),       # up to the parent
    encode(Request("svc.echo", b"x", 4, 9, 0, ())),                  # a service: armed
    encode(Request("svc.echo", b"x", 4, 9, MsgFlag.NORESPONSE, ())),  # not armed
    encode(Request("svc.echo", b"x", 4, 9, MsgFlag.STREAMING, ())),
    encode(Request("svc.echo", b"x", 9, 9, 0, ())),                  # no rank 9
    encode(Request("svc.echo", b"x", 1, 9, MsgFlag.UPSTREAM, ())),
    encode(Request("peermesh.info", None, NODEID_ANY, 9, 0, ())),
    encode(Response("broker.ping", b"p", 0, 9, routes=(PARENT,))),    # a client answers nothing
])
def test_requests_of_a_client_go_as_on_the_full_path(frames: list[bytes]) -> None:
    """A rankless client's requests (``peermesh.flux.clients``) take the fast path too:
    the same outputs, in-flight tracking, counters, and what the member keeps of the
    client (when it was heard, the services told of its going)."""
    tree, cores = in_state("settled")
    core = cores[1]
    assert core.clients.accept(CLIENT, tree.now - 1)
    for variant in variants(frames):
        same(core, CLIENT, variant, tree.now)
    message = decode(frames)
    if isinstance(message, Request) and message.nodeid in (1, 5) \
            and not message.flags & MsgFlag.UPSTREAM:  # (the fast path takes it)
        assert copy.deepcopy(core).routing.pass_through(CLIENT, list(frames), tree.now) is not None
    core.clients.max_targets = 0  # past the bound: counted as untracked alike
    same(core, CLIENT, frames, tree.now)


def test_responses_going_up() -> None:
    """A response whose top route is the parent goes up as it came, the route popped;
    at the root (no parent) both paths drop it."""
    tree, cores = in_state("settled")
    up = encode(Response("broker.ping", b"p", 0, 9, routes=(PARENT, PARENT, b"@1")))
    for variant in variants(up):
        same(cores[1], cores[3].identity, variant, tree.now)
    (output,) = cores[1].receive(cores[3].identity, list(up), tree.now)
    assert output.link == PARENT and output.frames == up[1:]  # type: ignore[union-attr]
    same(cores[0], cores[1].identity, up, tree.now)
    assert cores[0].receive(cores[1].identity, list(up), tree.now) == []
