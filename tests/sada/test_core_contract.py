"""The routing core on the one core contract (``peermesh.core``): outputs returned.

A ``RequestRouter`` made without ``send``/``answer`` returns what it wants
done: ``Send`` for messages to servers, ``Deliver((token, value, error))``
for answers and ``Emit(CATALOG_CHANGED)`` when the catalog changes. No
sockets and no clock.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from peermesh.core import Core, Deliver, Emit, Send
from peermesh.sada import RequestTimeout, ServerLost, ServiceError
from peermesh.sada.routing import CATALOG_CHANGED, RequestRouter

from .test_routing import PING, intr, rep

pytestmark = pytest.mark.usefixtures("native_path")


def router(**settings: Any) -> RequestRouter:
    return RequestRouter("c0ffee", now=0.0, **settings)


def test_a_router_without_callbacks_is_a_core_returning_its_outputs() -> None:
    core = router()
    assert isinstance(core, Core)
    assert core.receive(b"s1", intr("echo 1.0"), 0.0) == [Emit(CATALOG_CHANGED)]
    assert core.catalog_version == 1
    rid = core.submit("token", "echo", "say", {"x": 1}, 0.1)
    (out,) = core.take()
    assert type(out) is Send and out.link == b"s1"
    assert list(out.frames[:4]) == [b"", b"SADA1", b"REQ", rid]
    assert core.take() == []
    # the link may carry the driver's metadata (the Peer-Address) with the routing id
    assert core.receive((b"s1", "127.0.0.1"), rep(rid, "hi"), 0.2) == [
        Deliver(("token", "hi", None))]
    assert core.pending == 0


def test_a_new_servers_address_comes_from_the_links_metadata() -> None:
    core = router(address_of=lambda meta: meta or "?")
    core.receive((b"s1", "10.0.0.7"), intr("echo 1.0"), 0.0)
    core.receive(b"s2", intr("echo 1.0"), 0.0)
    assert {s.id: s.address for s in core.servers(0.0)} == {b"s1".hex(): "10.0.0.7",
                                                             b"s2".hex(): "?"}


def test_handle_timer_returns_timeouts_pings_and_drops() -> None:
    core = router(ping_interval=1.0, dead_after=3.0)
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    core.submit("late", "echo", "say", None, 0.0, timeout=0.5)
    core.take()
    assert core.next_deadline() <= 0.5
    (answer,) = core.handle_timer(0.5)
    assert type(answer) is Deliver and answer.item[0] == "late"
    assert isinstance(answer.item[2], RequestTimeout)
    pings = core.handle_timer(1.0)
    assert pings == [Send(b"s1", PING)]
    core.submit("held", "echo", "say", None, 1.0)
    core.take()
    out = []
    now = 1.0
    while now < 4.5:
        now += 0.25
        out += core.handle_timer(now)
    delivered = [o.item for o in out if type(o) is Deliver]
    assert [(token, type(error)) for token, _, error in delivered] == [("held", ServerLost)]
    assert Emit(CATALOG_CHANGED) in out and core.offers("echo") == 0


def test_the_unread_port_keeps_the_timer_from_judging() -> None:
    waiting = [True]
    core = router(ping_interval=1.0, dead_after=3.0, unread=lambda: waiting[0])
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    now = 0.0
    while now < 5.0:
        now += 0.25
        core.handle_timer(now)
    assert core.offers("echo") == 1          # messages wait unread: nobody is judged dead
    waiting[0] = False
    core.handle_timer(now + 0.25)
    assert core.offers("echo") == 0


def test_a_router_with_callbacks_returns_nothing_and_calls_them() -> None:
    sent: list[tuple[bytes, list[bytes]]] = []
    answered: list[tuple[Any, Any, Any]] = []
    core = RequestRouter("c0ffee", lambda i, f: sent.append((i, f)),
                         lambda t, v, e: answered.append((t, v, e)), now=0.0)
    assert core.receive(b"s1", intr("echo 1.0"), 0.0) == []
    rid = core.submit("t", "echo", "say", None, 0.0)
    assert core.take() == [] and sent[0][0] == b"s1"
    assert core.receive(b"s1", rep(rid, msgpack.unpackb(msgpack.packb(3))), 0.1) == []
    assert answered == [("t", 3, None)]


def test_a_timeout_counts_in_the_servers_latency() -> None:
    """A server that let a request time out looks as slow as that wait, not as fast as its
    last replies (the penalty alone halves back within a ping interval)."""
    core = router()
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    core.submit("token", "echo", "say", None, 0.0, timeout=1.0)
    core.take()
    (timed_out,) = [o for o in core.handle_timer(1.0) if type(o) is Deliver]
    assert isinstance(timed_out.item[2], RequestTimeout)
    (info,) = core.servers(1.0)
    assert info.latency > 0.1 and info.penalty == 2


def test_the_usual_rep_is_answered_by_answer_of_and_anything_else_left_alone() -> None:
    """``answer_of`` (a driver's ``delivery`` fast path) takes in the usual REP (below
    400, from the server holding the request) and returns its caller's answer, the
    router's state updated as ``receive`` would; any other message is left untouched
    (None) for ``receive``."""
    core = router()
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    core.receive(b"s2", intr("echo 1.0"), 0.0)
    first = core.submit("first", "echo", "say", None, 0.1)
    second = core.submit("second", "echo", "say", None, 0.1)
    raw = core.submit("raw", "echo", "say", b"x", 0.1, raw=True)
    core.take()
    held = {rid: core._pending[rid].server.identity for rid in (first, second, raw)}
    other = b"s2" if held[first] == b"s1" else b"s1"
    assert core.answer_of(other, rep(first, "wrong"), 0.2) is None   # not its server
    assert core.answer_of(held[second], rep(second, b"busy", status=503), 0.2) is None
    assert core.answer_of(held[first], intr("echo 1.0"), 0.2) is None
    assert core.answer_of(held[first], rep(b"c0ffee-99", "none"), 0.2) is None
    assert core.pending == 3 and core.stats["replies"] == 0 and core.take() == []
    assert core.answer_of(held[first], rep(first, {"ok": 1}), 0.3) == ("first", {"ok": 1},
                                                                       None)
    assert core.answer_of(held[raw], rep(raw, b"\xc1"), 0.3) == ("raw", b"\xc1", None)
    token, value, error = core.answer_of(held[second], rep(second, b"\xc1"), 0.3)
    assert (token, value) == ("second", None) and isinstance(error, ServiceError)
    assert core.pending == 0 and core.stats["replies"] == 3 and core.take() == []
    assert sum(s.in_flight for s in core.servers(0.3)) == 0
    assert core.reply_times.count == 3


def test_an_addressed_router_names_the_server_first_in_every_message() -> None:
    core = router(addressed=True)
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    rid = core.submit("token", "echo", "say", {"x": 1}, 0.1)
    (req,) = core.take()
    assert req.link == b"s1" and list(req.frames[:5]) == [b"s1", b"", b"SADA1", b"REQ", rid]
    assert core.handle_timer(1.0) == [Send(b"s1", [b"s1", *PING])]
    core.send_failed(b"s1", list(req.frames[1:]), 1.1, full=False)   # (after the id)
    assert not core.servers(1.1)


def test_answer_each_takes_a_batchs_usual_reps_and_stops_at_the_first_other() -> None:
    """``answer_each`` (a driver's ``delivery_each``) takes the usual REPs of a batch in
    order, each answer to ``sink`` at once, and returns the index of the first message it
    leaves for ``receive`` (a REP of another server, a 503, an unknown id, a short one, an
    oversized one: None), untouched."""
    core = router()
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    rids = [core.submit(f"t{i}", "echo", "say", i, 0.1, server=b"s1".hex()) for i in range(4)]
    core.take()
    answers: list[Any] = []
    batch = [(b"s1", rep(rids[0], 0)), (b"s1", rep(rids[1], 1)), (b"s2", rep(rids[2], 2)),
             (b"s1", rep(rids[2], 2))]
    assert core.answer_each(batch, 0, 0.2, answers.append) == 2
    assert answers == [("t0", 0, None), ("t1", 1, None)]
    assert core.answer_each(batch, 3, 0.2, answers.append) == 4
    assert answers[-1] == ("t2", 2, None) and core.pending == 1
    for other in ([b"", b"SADA1", b"REP", rids[3], b"503", b"busy"],     # a 503
                  [b"", b"SADA1", b"REP", b"c0ffee-99", b"200", b""],    # unknown id
                  [b"", b"SADA1", b"REP", rids[3][:-1], b"200", b""],    # a short id
                  [b"", b"SADA1", b"REP", rids[3], b"200"],              # a frame short
                  [b"", b"SADA1", b"REP", rids[3], b"200", b"", b""],    # a frame over
                  [b"x", b"SADA1", b"REP", rids[3], b"200", b""],        # no delimiter
                  [b"", b"SADA1", b"REP", rids[3], b"2000", b""],        # not a status
                  None):                                                 # oversized
        assert core.answer_each([(b"s1", other)], 0, 0.3, answers.append) == 0
    assert len(answers) == 3 and core.pending == 1 and core.take() == []
    assert core.answer_each([], 0, 0.3, answers.append) == 0


def test_a_forgotten_requests_answer_goes_nowhere_and_its_reply_still_counts() -> None:
    core = router()
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    first = core.submit("first", "echo", "say", None, 0.1)
    second = core.submit("second", "echo", "say", None, 0.1, timeout=1.0)
    core.take()
    core.forget(first)
    core.forget(second)
    core.forget(b"c0ffee-99")   # (an unknown id: nothing)
    answers: list[Any] = []
    assert core.answer_each([(b"s1", rep(first, "late"))], 0, 0.2, answers.append) == 1
    assert answers == [] and core.stats["replies"] == 1
    assert [o for o in core.handle_timer(1.1) if type(o) is Deliver] == []   # (timed out)
    assert core.pending == 0 and core.stats["timeouts"] == 1


def test_deadlines_expire_in_their_order_whatever_the_order_of_the_requests() -> None:
    """Deadlines in the order of the requests wait in a queue, an earlier one behind a
    later one in a heap: they expire earliest first, ties in the order of the requests."""
    core = router(ping_interval=100.0)
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    for token, now, timeout in (("a", 0.0, 1.0), ("b", 0.0, 3.0), ("c", 0.5, 0.5),
                                ("d", 0.5, 2.5), ("e", 1.0, 0.5), ("f", 2.0, 0.5)):
        core.submit(token, "echo", "say", None, now, timeout=timeout)
    core.take()
    assert core.next_deadline() == 1.0
    expired = [o.item[0] for o in core.handle_timer(3.0) if type(o) is Deliver]
    assert expired == ["a", "c", "e", "f", "b", "d"]
    assert core.pending == 0 and not core._due and core._deadlines == []   # noqa: SLF001
