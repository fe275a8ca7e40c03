"""``flux_take`` (the C extension's ``Routing.pass_through`` over a batch read) does what
the Python path does, and refuses hostile input.

Each message of the routing table (``test_routing.ROWS``), the common hops, their
malformed variants and hostile shapes go to two copies of the same node: one through
``core.receive`` (its ``Send`` outputs), one through ``flux_take`` first (sending on two
inproc pipes standing for the ROUTER and the DEALER to the parent) and ``receive`` for a
message it does not take, as the driver does. What is sent, what each keeps in flight,
its counters and what it keeps of its children and parent must be equal.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any, Optional

import pytest
import zmq

from peermesh.flux.core import PARENT, FluxCore, Send, State
from peermesh.io import zmqbatch
from peermesh.wire.flux import (
    NODEID_ANY, MsgFlag, Request, Response, encode,
)

from .conftest import wait_until
from .test_fastpath import variants
from .test_routing import ROWS, in_state

#: why the C path cannot be tested here ("" when it can)
NO_C = "" if zmqbatch.flux_take is not None else \
    f"no flux_take in the C extension ({zmqbatch.why_not or 'a build older than this code'})"


class Pipes:
    """Two inproc PAIRs whose sending ends stand for the ROUTER and the DEALER."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.sockets: list[zmq.Socket] = []
        self.router, self.router_out = self._pair("router")
        self.dealer, self.dealer_out = self._pair("dealer")

    def _pair(self, name: str) -> tuple[zmq.Socket, zmq.Socket]:
        a = self.context.socket(zmq.PAIR)
        self.sockets.append(a)
        b = self.context.socket(zmq.PAIR)
        self.sockets.append(b)
        for sock in (a, b):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 0)
            sock.setsockopt(zmq.SNDTIMEO, 0)
        a.bind(f"inproc://flux-take-{name}-{id(self)}")
        b.connect(f"inproc://flux-take-{name}-{id(self)}")
        return a, b

    def drain(self) -> list[tuple[str, list[bytes]]]:
        """What was sent, in order on each (ROUTER's first)."""
        got = []
        for name, sock in (("router", self.router_out), ("dealer", self.dealer_out)):
            while sock.poll(0):
                got.append((name, sock.recv_multipart(zmq.NOBLOCK)))
        return got

    def close(self) -> None:
        for sock in self.sockets:
            sock.close(0)
        self.context.term()


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    if NO_C:
        pytest.skip(NO_C)
    made = Pipes()
    try:
        yield made
    finally:
        made.close()


def sent_by(outputs: list[Any]) -> list[Any]:
    """``receive``'s outputs as the pipes would carry them (a ``Send`` to the parent on the
    DEALER, any other, addressed, on the ROUTER)."""
    return [(("dealer" if o.link == PARENT else "router"), list(o.frames))
            if type(o) is Send else o for o in outputs]


def kept(core: FluxCore) -> tuple[Any, ...]:
    routing = core.routing
    return (routing.inflight, routing.via, core.stats, routing.parent_heard,
            routing.parent_sent, {i: (c.heard, c.sent, c.torpid) for i, c in core.children.items()},
            core.clients.clients, core.clients.untracked)


def through_c(core: FluxCore, pipes: Pipes, link: bytes, frames: list[bytes],
              now: float) -> tuple[bool, list[Any]]:
    """``frames`` from ``link`` as the driver hands them on: to ``flux_take`` (an ONLINE
    node), else (or not taken) to ``receive``; whether C took it, and what went out."""
    if link == PARENT:
        batch = [(frames[0], list(frames[1:]))]
    else:
        batch = [(link, list(frames))]
    if core.state is State.ONLINE:
        shape = core.routing.take_shape(pipes.router.underlying, pipes.dealer.underlying)
        end, forwarded, used = zmqbatch.flux_take(  # type: ignore[misc]
            batch, 0, PARENT if link == PARENT else None, now, shape)
        core.stats["forwarded"] += forwarded
        if end == 1:
            sent = pipes.drain()
            assert used == {"router": 1, "dealer": 2}[sent[0][0]]
            return True, sent
        assert end == 0 and forwarded == 0 and used == 0 and not pipes.drain()
    return False, sent_by(core.receive(link, list(frames), now))


def same(core: FluxCore, pipes: Pipes, link: bytes, frames: list[bytes], now: float) -> bool:
    """The C path and the Python path do the same with ``frames``; whether C took it."""
    twin = copy.deepcopy(core)
    taken, got = through_c(core, pipes, link, frames, now)
    assert got == sent_by(twin.receive(link, list(frames), now))
    assert kept(core) == kept(twin)
    return taken


def link_of(cores: dict[int, FluxCore], source: Any) -> bytes:
    return {"parent": PARENT, "stranger": b"S" * 16}.get(source) or cores[source].identity


@pytest.mark.parametrize("state, node, source, frames", [row[:4] for row in ROWS])
def test_routes_as_the_python_path(pipes: Pipes, state: str, node: int, source: Any,
                                   frames: list[bytes]) -> None:
    tree, cores = in_state(state)
    if source == "local":
        return  # (a local handle's RPC never reaches flux_take)
    for variant in variants(frames):
        same(cores[node], pipes, link_of(cores, source), variant, tree.now + 0.5)


@pytest.mark.parametrize("flags", [0, MsgFlag.NORESPONSE, MsgFlag.STREAMING])
def test_common_hops_are_taken(pipes: Pipes, flags: int) -> None:
    """A request for another rank down and up, its response back down and up, a ping for
    this rank without a JSON body: all taken in C, each as the Python path does it."""
    tree, cores = in_state("settled")
    now = tree.now + 0.5
    down = encode(Request("broker.ping", b"", 4, 9, flags, (b"@1",)))
    assert same(cores[1], pipes, PARENT, down, now)             # down to rank 4
    up = encode(Request("svc.echo", b"x", 6, 9, flags, ()))
    assert same(cores[1], pipes, cores[3].identity, up, now)    # up to the parent
    across = encode(Request("svc.echo", b"x", 6, 9, flags, (cores[3].identity,)))
    assert same(cores[0], pipes, cores[1].identity, across, now)   # down the other side
    ping = encode(Request("broker.ping", b"raw", 3, 9, flags & ~MsgFlag.NORESPONSE, (b"@2",)))
    assert same(cores[3], pipes, PARENT, ping, now)             # answered here
    echo = encode(Request("broker.ping", None, 1, 9, flags & ~MsgFlag.NORESPONSE, ()))
    assert same(cores[1], pipes, cores[3].identity, echo, now)
    for errnum in (0, 11):
        back = encode(Response("svc.echo", b"r", errnum, 9, flags & MsgFlag.STREAMING,
                               (PARENT, b"@1")))
        assert same(cores[1], pipes, cores[4].identity, back, now)   # up
        home = encode(Response("svc.echo", b"r", errnum, 9, flags & MsgFlag.STREAMING,
                               (cores[3].identity, PARENT, b"@1")))
        assert same(cores[1], pipes, PARENT, home, now)              # down


def test_what_is_left_to_python(pipes: Pipes) -> None:
    """Not taken (the Python path handles them, the same way): a JSON ping, a ping with
    NORESPONSE, a response for a local handle, a client's request, NODEID_ANY,
    UPSTREAM, ``peermesh.attached``, a node not online."""
    tree, cores = in_state("settled")
    now = tree.now + 0.5
    core = cores[1]
    client = b"C" * 16
    assert core.clients.accept(client, tree.now - 1)
    for link, frames in [
            (PARENT, encode(Request("broker.ping", b'{"seq":1}\0', 1, 9, 0, ()))),
            (PARENT, encode(Request("broker.ping", b"x", 1, 9, MsgFlag.NORESPONSE, ()))),
            (cores[3].identity, encode(Response("broker.ping", b"", 0, 9, routes=(b"@1",)))),
            (client, encode(Request("svc.echo", b"x", 4, 9, 0, ()))),
            (cores[3].identity, encode(Request("svc.echo", b"x", NODEID_ANY, 9, 0, ()))),
            (cores[3].identity, encode(Request("svc.echo", b"x", 6, 9, MsgFlag.UPSTREAM, ()))),
            (cores[3].identity, encode(Request("peermesh.attached", b'{"rank":3}', 0, 9,
                                               MsgFlag.NORESPONSE, ())))]:
        assert not same(core, pipes, link, frames, now)
    core.state = State.ATTACHING
    assert not same(core, pipes, PARENT, encode(Request("svc.echo", b"x", 4, 9, 0, ())), now)


def hostile(frames: list[bytes]) -> list[list[bytes]]:
    """``frames`` made hostile: PROTO short, long, empty or missing, bad magic and version,
    a route stack cut (no delimiter, nothing but routes), frames not bytes."""
    proto = frames[-1]
    return [frames[:-1] + [proto[:19]], frames[:-1] + [proto + b"\0"], frames[:-1] + [b""],
            frames[:-1], frames[:-1] + [b"\x8e\x02" + proto[2:]], [b"\x00" + proto[1:]],
            [f for f in frames if f], frames[:1], [frames[0]] * 70 + frames,
            frames[:-1] + [bytearray(proto)], [memoryview(f) for f in frames]]  # type: ignore


def test_hostile_input_is_left_to_python(pipes: Pipes) -> None:
    """Malformed messages are not taken (nothing sent, nothing kept): the Python path drops
    them, or answers them, as it does anyway. Also a sender that is no child, and a
    request when ``max_inflight`` are kept already."""
    tree, cores = in_state("settled")
    now = tree.now + 0.5
    core = cores[1]
    down = encode(Request("svc.echo", b"x", 4, 9, 0, (b"@1",)))
    back = encode(Response("svc.echo", b"r", 0, 9, 0, (cores[3].identity, PARENT)))
    for frames in hostile(down) + hostile(back):
        shape = core.routing.take_shape(pipes.router.underlying, pipes.dealer.underlying)
        batch = [(frames[0], list(frames[1:]))]
        before = copy.deepcopy(kept(core))
        assert zmqbatch.flux_take(batch, 0, PARENT, now, shape) == (0, 0, 0)  # type: ignore
        assert kept(core) == before and not pipes.drain()
    up = encode(Request("svc.echo", b"x", 6, 9, 0, ()))
    for stranger in (b"S" * 16, b"S" * 15, b"S" * 36, PARENT):
        assert not same(core, pipes, stranger, up, now)
    core.routing.inflight.update({(b"x", n): ("t", 0, False)
                                  for n in range(core.settings.max_inflight)})
    assert not same(core, pipes, PARENT, down, now)    # the Python path answers EAGAIN
    assert not same(core, pipes, cores[3].identity, up, now)
    assert same(core, pipes, cores[3].identity, encode(Request(   # NORESPONSE: not kept
        "svc.echo", b"x", 6, 9, MsgFlag.NORESPONSE, ())), now)


def test_a_batch_stops_at_the_first_it_does_not_take(pipes: Pipes) -> None:
    """Taken in order up to the first message left to Python; from ``start`` on; a send
    that cannot go (no socket for it) is not taken."""
    tree, cores = in_state("settled")
    now = tree.now + 0.5
    core = cores[1]
    down = [(f[0], f[1:]) for f in (encode(Request("svc.echo", b"x", rank, tag, 0, (b"@1",)))
                                    for rank, tag in ((3, 1), (4, 2), (5, 3), (3, 4)))]
    shape = core.routing.take_shape(pipes.router.underlying, pipes.dealer.underlying)
    # (rank 5: no child on its path, from the parent: left to Python)
    assert zmqbatch.flux_take(down, 0, PARENT, now, shape) == (2, 2, 1)  # type: ignore[misc]
    assert zmqbatch.flux_take(down, 3, PARENT, now, shape) == (4, 1, 1)  # type: ignore[misc]
    assert [frames[0] for _, frames in pipes.drain()] == [cores[3].identity,
                                                          cores[4].identity, cores[3].identity]
    assert len(core.routing.inflight) == 3 and core.children[cores[3].identity].sent == now
    assert core.routing.parent_heard == now
    no_router = core.routing.take_shape(0, pipes.dealer.underlying)
    assert zmqbatch.flux_take(down, 0, PARENT, now, no_router) == (0, 0, 0)  # type: ignore


def shape_of(core: FluxCore, pipes: Pipes, **changed: Any) -> tuple[Any, ...]:
    names = ("router", "dealer", "parent_id", "routing", "inflight", "children", "by_rank",
             "rank", "k", "ranks", "parent", "placed", "max_inflight")
    shape = dict(zip(names, core.routing.take_shape(pipes.router.underlying,
                                                    pipes.dealer.underlying)))
    shape.update(changed)
    return tuple(shape.values())


@pytest.mark.parametrize("args, error", [
    ((), TypeError),
    (("batch",), TypeError),
    (("not a list", 0, None, 1.0, "shape"), TypeError),
    (([], 0, "^", 1.0, "shape"), TypeError),                  # link not bytes
    (([], 0, b"^^", 1.0, "shape"), ValueError),               # link not PARENT
    (([], 0, None, 1.0, ("short",)), TypeError),
    (([], 0, None, 1.0, "list"), TypeError),                  # a list, not a tuple
    (([], -1, None, 1.0, "shape"), ValueError),
    (([], "0", None, 1.0, "shape"), TypeError),
    (([], 0, None, 1.0, {"inflight": []}), TypeError),
    (([], 0, None, 1.0, {"children": None}), TypeError),
    (([], 0, None, 1.0, {"by_rank": [1]}), TypeError),
    (([], 0, None, 1.0, {"placed": ()}), TypeError),
    (([], 0, None, 1.0, {"parent_id": "^"}), TypeError),
    (([], 0, None, 1.0, {"rank": -1}), OverflowError),
    (([], 0, None, 1.0, {"rank": 0xFFFFFFFE}), ValueError),
    (([], 0, None, 1.0, {"k": "2"}), TypeError),
    (([], 0, None, 1.0, {"router": "handle"}), TypeError),
    (([], 0, None, 1.0, {"max_inflight": None}), TypeError),
])
def test_argument_checks(pipes: Pipes, args: tuple[Any, ...], error: type) -> None:
    tree, cores = in_state("settled")
    if len(args) == 5:
        shape: Any = args[4]
        if isinstance(shape, dict):
            shape = shape_of(cores[1], pipes, **shape)
        elif shape == "shape":
            shape = shape_of(cores[1], pipes)
        args = (*args[:4], shape)
    with pytest.raises(error):
        zmqbatch.flux_take(*args)  # type: ignore[misc]


@pytest.mark.parametrize("item", [None, (b"x",), [b"x", [b"y"]], (b"x", None), (b"x", (b"y",)),
                                  ("x", [b"y"]), (b"x", [b"y"], b"z")])
def test_items_not_read_off_a_socket_are_not_taken(pipes: Pipes, item: Optional[Any]) -> None:
    tree, cores = in_state("settled")
    shape = shape_of(cores[1], pipes)
    assert zmqbatch.flux_take([item], 0, None, 1.0, shape) == (0, 0, 0)  # type: ignore[misc]
    assert zmqbatch.flux_take([item], 5, None, 1.0, shape) == (5, 0, 0)  # type: ignore[misc]


def test_a_response_pops_its_inflight_entry(pipes: Pipes) -> None:
    """Forwarded down in C and answered back up in C: nothing left in flight (a final
    response), the response's route popped on the way up."""
    tree, cores = in_state("settled")
    now = tree.now + 0.5
    core = cores[1]
    request = encode(Request("svc.echo", b"x", 4, 9, 0, (b"@1",)))
    assert same(core, pipes, PARENT, request, now)
    assert len(core.routing.inflight) == 1
    answer = encode(Response("svc.echo", b"r", 0, 9, 0, (PARENT, b"@1")))
    assert same(core, pipes, cores[4].identity, answer, now)
    assert core.routing.inflight == {}


@pytest.fixture
def tree_of_seven(both_paths: bool) -> Iterator[list[Any]]:
    """Seven ranks (kary:2) on real sockets in this process, with both paths."""
    if both_paths and NO_C:
        pytest.skip(NO_C)
    from peermesh.flux import FluxOverlay, FluxSettings
    fast = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)
    nodes: list[Any] = []
    try:
        nodes.append(FluxOverlay(root=True, topology="kary:2", settings=fast,
                                 address="127.0.0.1").start())
        for _ in range(6):
            nodes.append(FluxOverlay(parents=[nodes[0].endpoint], topology="kary:2",
                                     settings=fast, address="127.0.0.1").start())
        for node in nodes:
            assert node.wait_online(20)
        yield sorted(nodes, key=lambda node: node.rank)
    finally:
        for node in reversed(nodes):
            node.stop()


def test_a_tree_on_real_sockets(tree_of_seven: list[Any], both_paths: bool,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaf to leaf across the root, pings of every rank from a leaf, a stream and a
    NORESPONSE request: the same answers both ways, every request forwarded counted,
    nothing left in flight; in C, the hops were taken there."""
    from peermesh.flux import call_all
    nodes = tree_of_seven
    taken = [0]
    real = zmqbatch.flux_take

    def counting(batch: list, start: int, link: Any, now: float, shape: Any) -> Any:
        end, forwarded, used = real(batch, start, link, now, shape)  # type: ignore[misc]
        taken[0] += end - start
        return end, forwarded, used
    for node in nodes:   # (each driver looked the function up when it started)
        if node._driver._take is not None:
            monkeypatch.setattr(node._driver, "_take", counting)
    got: list[bytes] = []
    nodes[6].register("svc.echo", lambda request: request.payload)
    nodes[6].register("svc.note", lambda request: got.append(request.payload))

    def stream(request: Any) -> None:
        for n in range(3):
            request.respond(b"%d" % n)
        request.end()
    nodes[5].register("svc.stream", stream)
    before = sum(node.core.stats["forwarded"] for node in nodes)
    assert nodes[3].rpc("svc.echo", b"across", 6).get(10) == b"across"
    pings = call_all(nodes[4], "broker.ping", range(7), b"p", timeout=10)
    assert all(pings[rank] == b"p" for rank in range(7)), pings
    future = nodes[3].rpc("svc.stream", None, 5, flags=MsgFlag.STREAMING)
    answers = []
    future.on_response(lambda response: answers.append((response.errnum, response.payload)))
    nodes[4].rpc("svc.note", b"n", 6, flags=MsgFlag.NORESPONSE)
    wait_until(lambda: len(answers) == 4 and got, 10, "the stream and the note")
    assert [payload for _, payload in answers[:3]] == [b"0", b"1", b"2"] and got == [b"n"]
    # 3 -> 1 -> 0 -> 2 -> 6: 3 forwards; pings from 4: 1 (up), 0 (down: 1/2), ...
    assert sum(node.core.stats["forwarded"] for node in nodes) > before
    wait_until(lambda: not any(node.core.routing.inflight for node in nodes), 10,
               "nothing in flight")
    assert (taken[0] > 0) == both_paths
