"""The server's protocol core on the one core contract (``peermesh.core``).

A ``ServerCore`` returns what it wants done: ``Send`` for REPs, PONGs and
INTRs, ``Deliver(Job)`` for each request a handler is to run (its outcome
comes back through ``reply``), ``Dial``/``Hangup`` for the channels it
serves. No sockets and no clock.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import msgpack
import pytest

from peermesh.core import Core, Deliver, Dial, Hangup, Send
from peermesh.sada import Service
from peermesh.sada.serving import Job, ServerCore
from peermesh.wire import sada as wire
from peermesh.wire.sada import Intr, Ping, Rintr, ServiceId

pytestmark = pytest.mark.usefixtures("native_path")

CHANNEL = "tcp://127.0.0.1:5555"
ALIAS = CHANNEL.encode()


def served(**settings: Any) -> ServerCore:
    core = ServerCore(**{"max_concurrent": 8, "max_services": 16, "forget_after": 10.0,
                         **settings})
    calc = Service("calc", "1.2")
    calc.add("add", lambda numbers: sum(numbers))
    calc.add("double", lambda n: 2 * n, inline=True)
    assert core.add_service(calc) == []     # no channel yet: no INTR to send
    core.serving = True
    return core


def req(rid: bytes, action: str, payload: bytes, version: str = "1.2") -> list[bytes]:
    return wire.encode(wire.Req(rid, "calc", version, "", action, payload))


def test_a_server_core_is_a_core() -> None:
    core = served()
    assert isinstance(core, Core)
    assert core.next_deadline() is None


def test_a_channel_is_dialled_and_introduced_to() -> None:
    core = served()
    dial, intr = core.link(CHANNEL, 0.0, direct=True)
    assert dial == Dial(ALIAS, CHANNEL, ALIAS, None)
    assert type(intr) is Send and intr.link == ALIAS
    assert wire.decode(list(intr.frames)) == Intr((ServiceId("calc", "1.2"),))
    assert core.link(CHANNEL, 0.0, direct=True) == []     # known: nothing new
    assert core.receive(ALIAS, wire.encode(Ping()), 0.1) == [
        Send(ALIAS, wire.encode(wire.Pong()))]
    (again,) = core.receive(ALIAS, wire.encode(Rintr()), 0.2)
    assert again.frames == intr.frames
    assert core.stats["intr_sent"] == 2


def test_a_request_is_delivered_to_its_handler_and_its_outcome_sent_back() -> None:
    core = served()
    core.link(CHANNEL, 0.0, direct=True)
    for attempt in range(2):   # the careful path, then the fast one (resolved before)
        (out,) = core.receive(ALIAS, req(b"r%d" % attempt, "add", wire_pack([1, 2])), 1.0)
        assert type(out) is Deliver and type(out.item) is Job
        job = out.item
        assert (job.alias, job.request_id, job.handler.inline) == (ALIAS, b"r%d" % attempt,
                                                                 False)
        assert core.busy == 1
        (rep,) = core.reply(job, 200, wire_pack(3))
        assert core.busy == 0
        assert rep == Send(ALIAS, (b"", b"SADA1", b"REP", b"r%d" % attempt, b"200",
                                   wire_pack(3)))
    assert core.stats["requests"] == core.stats["replies"] == 2


def test_unknown_services_versions_and_actions_are_answered_at_once() -> None:
    core = served()
    (rep,) = core.receive(ALIAS, req(b"r1", "add", b"", version="2.0"), 0.0)
    assert type(rep) is Send and rep.frames[2:5] == (b"REP", b"r1", b"406")
    (rep,) = core.receive(ALIAS, req(b"r2", "nope", b""), 0.0)
    assert rep.frames[4] == b"405"
    assert core.stats["errors"] == 2
    assert core.receive(ALIAS, [b"", b"SADA1", b"BOGUS"], 0.0) == []
    assert core.stats["dropped"] == 1


def test_past_max_concurrent_and_once_stopping_requests_get_503() -> None:
    core = served(max_concurrent=1)
    core.link(CHANNEL, 0.0, direct=True)
    (first,) = core.receive(ALIAS, req(b"r1", "add", wire_pack([1])), 0.0)
    assert type(first) is Deliver
    (busy,) = core.receive(ALIAS, req(b"r2", "add", wire_pack([1])), 0.0)
    assert busy.frames[4] == b"503" and core.stats["busy"] == 1
    # an inline handler runs in the reader: it is never counted against the limit
    (inline,) = core.receive(ALIAS, req(b"r3", "double", wire_pack(2)), 0.0)
    assert type(inline) is Deliver and inline.item.handler.inline
    (empty,) = core.stop()
    assert wire.decode(list(empty.frames)) == Intr(())
    (stopping,) = core.receive(ALIAS, req(b"r4", "double", wire_pack(2)), 0.0)
    assert stopping.frames[4] == b"503"
    core.closed = True
    assert core.reply(first.item, 200, b"") == []    # closed: the REP is dropped


def test_a_channel_that_left_the_mesh_is_forgotten_after_forget_after() -> None:
    core = served(networks=[ipaddress.ip_network("127.0.0.0/8")])
    assert core.link("tcp://10.1.2.3:5555", 0.0, owner="peer") == []   # outside: ignored
    assert core.limits.snapshot()["channel_networks"] == 1
    core.link(CHANNEL, 0.0, owner="peer")
    core.peer_left("peer", 5.0)
    assert core.next_deadline() == 15.0
    assert core.handle_timer(14.9) == []
    assert core.handle_timer(15.0) == [Hangup(ALIAS)]
    assert core.endpoints == {} and core.next_deadline() is None
    (dial, _) = core.link(CHANNEL, 20.0, owner="peer")   # back: a fresh routing id
    assert dial.link == ALIAS + b"#1"


def test_a_curve_server_needs_the_channels_key() -> None:
    core = served()
    assert core.link(CHANNEL, 0.0, direct=True, need_key=True) == []
    dial, _ = core.link(CHANNEL, 0.0, direct=True, key="k" * 40, need_key=True)
    assert dial.server_key == b"k" * 40


def wire_pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def test_the_usual_req_is_handed_over_by_job_of_and_anything_else_left_alone() -> None:
    """``job_of`` (a driver's ``delivery`` fast path) returns the job of the usual REQ (a
    service resolved before, an action it has), counted as ``receive`` counts it; any
    other message, and a REQ to be answered 503 past ``max_concurrent``, is left
    untouched (None) for ``receive``."""
    core = served(max_concurrent=1)
    core.link(CHANNEL, 0.0, direct=True)
    assert core.job_of(ALIAS, req(b"r1", "add", wire_pack([1])), 0.0) is None   # unresolved
    assert core.stats["requests"] == 0
    (first,) = core.receive(ALIAS, req(b"r1", "add", wire_pack([1])), 0.0)
    assert core.busy == 1
    assert core.job_of(ALIAS, req(b"r2", "add", wire_pack([1])), 0.0) is None   # busy
    assert core.busy == 1 and core.stats["requests"] == 1
    job = core.job_of(ALIAS, req(b"r3", "double", wire_pack(2)), 0.0)   # inline: no limit
    assert job == Job(ALIAS, job.handler, b"r3", wire_pack(2), None) and job.handler.inline
    assert core.job_of(ALIAS, wire.encode(Ping()), 0.0) is None
    assert core.job_of(ALIAS, req(b"r4", "nope", b""), 0.0) is None
    assert core.stats["requests"] == 2 and core.take() == []
    core.reply(first.item, 200, wire_pack(1))
    job = core.job_of(ALIAS, req(b"r5", "add", wire_pack([2])), 0.0)
    assert job is not None and core.busy == 1 and core.stats["requests"] == 3


def test_job_each_hands_a_batchs_usual_reqs_over_and_stops_at_the_first_other() -> None:
    """``job_each`` (a driver's ``delivery_each``) hands the jobs of a batch's usual REQs
    to ``sink`` in order and returns the index of the first message it leaves for
    ``receive`` (unresolved, busy, malformed, oversized: None), untouched."""
    core = served(max_concurrent=1)
    core.link(CHANNEL, 0.0, direct=True)
    core.receive(ALIAS, req(b"r0", "double", wire_pack(0)), 0.0)   # (resolved from now on)
    jobs: list[Job] = []
    batch = [(ALIAS, req(b"r1", "double", wire_pack(1))), (ALIAS, req(b"r2", "add", b"\x90")),
             (ALIAS, req(b"r3", "add", b"\x90")), (ALIAS, req(b"r4", "double", b"\x04"))]
    assert core.job_each(batch, 0, 0.1, jobs.append) == 2    # r3: busy past max_concurrent
    assert [job.request_id for job in jobs] == [b"r1", b"r2"] and core.busy == 1
    assert core.job_each(batch, 3, 0.1, jobs.append) == 4 and jobs[-1].request_id == b"r4"
    good = req(b"r5", "double", b"\x05")
    for other in (good[:-1], good + [b""], [b"x", *good[1:]],             # frames, delimiter
                  good[:3] + [b""] + good[4:], good[:3] + [b"r" * 256] + good[4:],   # ids
                  good[:6] + [b"", b"nope"] + good[8:],                   # no such action
                  wire.encode(Ping()), None):                             # a PING, oversized
        assert core.job_each([(ALIAS, other)], 0, 0.2, jobs.append) == 0
    assert len(jobs) == 3 and core.stats["requests"] == 4 and core.take() == []
    assert core.job_each([], 0, 0.2, jobs.append) == 0


def test_an_addressed_core_names_the_channel_first_in_every_message() -> None:
    core = served(addressed=True)
    _, intr = core.link(CHANNEL, 0.0, direct=True)
    assert intr.frames[0] == ALIAS and wire.decode(list(intr.frames[1:])) == Intr(
        (ServiceId("calc", "1.2"),))
    assert core.receive(ALIAS, wire.encode(Ping()), 0.1) == [
        Send(ALIAS, (ALIAS, *wire.encode(wire.Pong())))]
    (out,) = core.receive(ALIAS, req(b"r1", "add", wire_pack([1, 2])), 1.0)
    (rep,) = core.reply(out.item, 200, wire_pack(3))
    assert rep == Send(ALIAS, (ALIAS, b"", b"SADA1", b"REP", b"r1", b"200", wire_pack(3)))
    core.unsent(rep.frames)   # (as sent: the alias first)
    assert core.stats["replies"] == 0 and core.stats["unsent"] == 1
