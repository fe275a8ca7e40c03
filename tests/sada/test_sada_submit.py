"""The C extension's ``sada_submit`` (``RequestRouter.submit``'s usual request in C): the
same request, id, deadline and REQ as the Python path; anything else left to it; its
argument checks.

Real routers (``addressed``, as a channel makes them), no sockets. Skipped when the
extension is not built.
"""

from __future__ import annotations

from typing import Any

import pytest

from peermesh.core import Send
from peermesh.sada import routing
from peermesh.sada.routing import RequestRouter

from .test_routing import intr

usual = routing._submit_in_c
pytestmark = pytest.mark.skipif(usual is None, reason="the C extension (sada_submit) is not built")

SLOTS = ("rid", "service", "version", "fields", "body", "raw", "token", "timeout", "server",
         "target", "sent_at", "attempts", "retries", "excluded", "parked", "deadline")


def router(*servers: bytes) -> RequestRouter:
    core = RequestRouter("c0ffee", addressed=True, timeout=2.0)
    for identity in servers:
        core.receive(identity, intr("echo 1.0", "echo 2.0"), 0.0)
    core.take()
    return core


def state(core: RequestRouter) -> list[Any]:
    """What the router holds of its requests, as plain values (servers by routing id)."""
    def plain(value: Any) -> Any:
        return value.identity if type(value) is routing._Server else value
    return [[plain(getattr(p, name)) for name in SLOTS] for p in core._pending.values()] + [
        [p.rid for p in core._due], [(s.id, s.in_flight) for s in core.servers(0.0)],
        core.stats["requests"]]


taken: list[bytes] = []   # request ids the C path made


def counted(*args: Any) -> Any:
    rid = usual(*args)
    if rid is not None:
        taken.append(rid)
    return rid


def both(calls: list[tuple[Any, ...]], *servers: bytes,
         prepare: Any = None) -> tuple[list[Any], list[Any]]:
    """The outputs and state after ``calls`` (submit's arguments), with the C path
    and with Python alone."""
    seen = []
    taken.clear()
    for take in (counted, None):
        core = router(*servers)
        if prepare is not None:
            prepare(core)
        saved = routing._submit_in_c
        routing._submit_in_c = take
        try:
            outputs = []
            for call in calls:
                core.submit(*call)
                outputs += core.take()
        finally:
            routing._submit_in_c = saved
        seen.append(([(o.link, tuple(o.frames)) for o in outputs], state(core)))
    return seen[0], seen[1]


def test_the_usual_request_is_made_as_the_python_path_makes_it() -> None:
    calls = [(f"t{i}", "echo", "say", {"i": i}, 0.5 + i) for i in range(3)]
    c, python = both(calls, b"s1")
    assert c == python and len(c[0]) == 3
    assert taken == [b"c0ffee-2", b"c0ffee-3"]   # (the first: fields and route not cached)
    assert c[0][0][1][:5] == (b"s1", b"", b"SADA1", b"REQ", b"c0ffee-1")


@pytest.mark.parametrize("counter", [0xe, 0xf, 0xabcdef, (1 << 62) - 3])   # (last: 16 digits)
def test_request_ids_are_the_counter_in_hex_as_the_python_path_makes_them(
        counter: int) -> None:
    def far(core: RequestRouter) -> None:
        core._counter = counter
    calls = [(f"t{i}", "echo", "say", i, 0.5) for i in range(3)]
    c, python = both(calls, b"s1", prepare=far)
    assert c == python and taken == [b"c0ffee-%x" % (counter + 2), b"c0ffee-%x" % (counter + 3)]


def test_what_is_not_the_usual_request_takes_the_python_path_the_same() -> None:
    def suspect(core: RequestRouter) -> None:
        core._servers[b"s1"].suspect = True

    def longer_first(core: RequestRouter) -> None:
        core.submit("long", "echo", "say", None, 0.0, timeout=60.0)
        core.take()

    def far_counter(core: RequestRouter) -> None:
        core._counter = 1 << 63
    cases: list[tuple[list[tuple[Any, ...]], tuple[bytes, ...], Any]] = [
        ([("a", "echo", "say", 1, 0.1, "1.0")], (b"s1",), None),          # a version
        ([("a", "echo", "say", 1, 0.1, None, "", 0.5)], (b"s1",), None),  # a timeout
        ([("a", "echo", "say", 1, 0.1, None, "", None, b"s1".hex())], (b"s1",), None),
        ([("a", "echo", "say", 1, 0.1, None, "", None, None, 1)], (b"s1",), None),
        ([("a", "echo", "say", b"x", 0.1, None, "", None, None, 0, True)], (b"s1",), None),
        ([("a", "echo", "say", 1, 0.1)] * 3, (b"s1", b"s2"), None),       # two servers
        ([("a", "echo", "say", 1, 0.1)] * 2, (b"s1",), suspect),
        ([("a", "echo", "say", 1, 0.1)] * 2, (b"s1",), longer_first),     # (the heap)
        ([("a", "echo", "say", 1, 0.1)] * 2, (b"s1",), far_counter),
        ([("a", "nothing", "say", 1, 0.1)] * 2, (b"s1",), None),          # parked
        ([("a", "echo", "say", 1, 0.1), ("b", "echo", "other", 2, 0.2)], (b"s1",), None),
    ]
    for calls, servers, prepare in cases:
        c, python = both(calls, *servers, prepare=prepare)
        assert c == python, calls
        assert len(taken) < len(calls), calls   # (the Python path made one at least)


def test_a_payload_that_cannot_be_packed_is_refused_and_nothing_taken() -> None:
    core = router(b"s1")
    core.submit("a", "echo", "say", 1, 0.1)
    core.take()
    before = state(core)
    with pytest.raises(TypeError):
        core.submit("b", "echo", "say", object(), 0.2)
    assert state(core) == before and core.take() == []


def test_arguments_and_shapes_are_checked() -> None:
    core = router(b"s1")
    core.submit("a", "echo", "say", 1, 0.1)   # (fields and route cached)
    core.take()
    shape = core._submit_shape
    args = (core, "t", "echo", "", "say", 1, 0.2)
    with pytest.raises(TypeError):
        usual(*args)
    with pytest.raises(TypeError):
        usual(core, "t", "echo", "", "say", 1, "now", shape)
    for bad in (None, shape[:11], ([], *shape[1:]), (*shape[:4], None, *shape[5:]),
                (*shape[:5], "c0ffee-", *shape[6:]), (*shape[:8], "", *shape[9:])):
        with pytest.raises(TypeError):
            usual(*args, bad)

    class Loose:   # (a class with a __dict__: its instances are not made in C)
        pass

    class Short:
        __slots__ = ("link",)
    for classes in ((Loose, Send), (int, Send), (routing._Pending, Short), ("x", Send)):
        with pytest.raises(TypeError):
            usual(*args, (*shape[:6], *classes, *shape[8:]))
    assert core.pending == 1 and core.take() == []
    assert usual(*args, shape) == b"c0ffee-2"   # (what the checks refused took nothing)


def test_a_router_timeout_that_is_not_a_number_is_an_error_of_both_paths() -> None:
    for take in (usual, None):
        core = router(b"s1")
        core.submit("a", "echo", "say", 1, 0.1)
        core.take()
        core.timeout = None   # type: ignore[assignment]
        saved = routing._submit_in_c
        routing._submit_in_c = take
        try:
            with pytest.raises(TypeError):
                core.submit("b", "echo", "say", 1, 0.2)
        finally:
            routing._submit_in_c = saved
        assert core.pending == 1
