"""The C extension's ``sada_take`` (``RequestRouter.answer_each``'s usual case in C):
its argument checks, and hostile batches left untouched for the Python path.

A real router holds the requests (no sockets); the extension is called as
``answer_each`` calls it. Skipped when the extension is not built.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from peermesh.sada import routing
from peermesh.sada.routing import RequestRouter

from .test_routing import intr, rep

take = routing._take_in_c
pytestmark = pytest.mark.skipif(take is None, reason="the C extension (sada_take) is not built")


def held(count: int = 2) -> tuple[RequestRouter, list[bytes]]:
    """A router whose server ``s1`` holds ``count`` requests (tokens t0, t1, ...)."""
    core = RequestRouter("c0ffee")
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    rids = [core.submit(f"t{i}", "echo", "say", i, 0.1) for i in range(count)]
    core.take()
    return core, rids


def run(core: RequestRouter, batch: Any, start: int = 0, now: float = 0.3,
        sink: Any = None) -> tuple[int, list[Any]]:
    answers: list[Any] = []
    end = take(batch, start, core._pending, now, sink or answers.append, core._take_shape)
    return end, answers


def test_the_usual_reps_are_taken_in_as_the_python_path_takes_them() -> None:
    core, rids = held(3)
    core.forget(rids[2])
    end, answers = run(core, [(b"s1", rep(rids[0], {"a": 1})), (b"s1", rep(rids[1], None)),
                              (b"s1", rep(rids[2], "late"))])
    assert end == 3 and answers == [("t0", {"a": 1}, None), ("t1", None, None)]
    assert core.pending == 0
    server = core.servers(0.3)[0]
    assert server.in_flight == 0 and server.replies == 3
    assert core.reply_times.count == 3 and core.reply_times.last == pytest.approx(0.2)


def test_a_raw_requests_payload_and_an_empty_one_are_taken_as_they_are() -> None:
    core = RequestRouter("c0ffee")
    core.receive(b"s1", intr("echo 1.0"), 0.0)
    raw = core.submit("raw", "echo", "say", b"\xc1", 0.1, raw=True)
    empty = core.submit("empty", "echo", "say", None, 0.1)
    core.take()
    end, answers = run(core, [(b"s1", rep(raw, b"\xc1")), (b"s1", rep(empty, b""))])
    assert end == 2 and answers == [("raw", b"\xc1", None), ("empty", None, None)]


@pytest.mark.parametrize("args", [
    (), ([], 0, {}, 0.0, print),                                   # counts
    ({}, 0, {}, 0.0, print, None),                                 # batch not a sequence
    ([], 0, [], 0.0, print, None),                                 # pendings not a dict
    ([], 0, {}, 0.0, None, None),                                  # sink not callable
    ([], 0, {}, "now", print, None),                               # now not a number
    ([], "0", {}, 0.0, print, None),                               # start not an int
])
def test_arguments_are_checked(args: tuple[Any, ...]) -> None:
    core, _ = held(1)
    fixed = [*args]
    if len(fixed) == 6 and fixed[5] is None:
        fixed[5] = core._take_shape
    with pytest.raises(TypeError):
        take(*fixed)


def test_a_negative_start_and_bad_shapes_are_refused() -> None:
    core, _ = held(1)
    shape = core._take_shape
    with pytest.raises(ValueError):
        take([], -1, core._pending, 0.0, print, shape)
    for bad in (None, shape[:7], (1, *shape[1:]), (shape[0], "REP", *shape[2:]),
                (*shape[:2], [], *shape[3:]), (*shape[:3], None, *shape[4:]),
                (*shape[:6], [0.1], shape[7]), (*shape[:6], (0.1, 1), shape[7]),
                (*shape[:7], "ewma")):
        with pytest.raises(TypeError):
            take([], 0, core._pending, 0.0, print, bad)


def test_times_other_than_a_round_trip_leave_the_batch_to_the_python_path() -> None:
    core, rids = held(1)
    batch = [(b"s1", rep(rids[0], 1))]
    for times in (None, object(), [0.0] * 5):
        shape = (*core._take_shape[:5], times, *core._take_shape[6:])
        assert take(batch, 0, core._pending, 0.3, print, shape) == 0
    core.reply_times.counts = None     # (a RoundTrip whose slots are not as add keeps them)
    assert run(core, batch) == (0, [])
    assert core.pending == 1 and core.servers(0.3)[0].replies == 0


@pytest.mark.parametrize("nows", [(0.3, 0.35, 0.6), (0.05, 0.1, 7.0), (0.1, 0.1, 0.1)])
def test_reply_times_and_latency_are_kept_as_the_python_path_keeps_them(
        nows: tuple[float, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples in several buckets, one on a bucket's bound and one from a clock that stepped
    back (before the request was sent: not a sample), taken in C and in Python alike."""
    both = [held(3), held(3)]
    (fast, rids), (slow, _) = both
    monkeypatch.setattr(routing, "_take_in_c", None)
    for rid, now in zip(rids, nows):
        assert run(fast, [(b"s1", rep(rid, 1))], now=now)[0] == 1
        assert slow.answer_each([(b"s1", rep(rid, 1))], 0, now, print) == 1
    for attr in ("smoothed", "last", "count", "total", "counts"):
        assert getattr(fast.reply_times, attr) == getattr(slow.reply_times, attr), attr
    one, other = fast.servers(7.0)[0], slow.servers(7.0)[0]
    assert (one.latency, one.replies, one.in_flight) == (other.latency, other.replies,
                                                          other.in_flight)


def test_hostile_messages_stop_it_untouched() -> None:
    core, rids = held(2)
    rid = rids[0]
    payload = msgpack.packb(1)
    for item in (
            None, (b"s1",), (b"s1", None, None), [b"s1", rep(rid, 1)],   # not a pair
            (b"s1", None),                                               # oversized
            (b"s1", tuple(rep(rid, 1))),                                 # not a list
            (b"s1", rep(rid, 1)[:5]), (b"s1", rep(rid, 1) + [b""]),      # frame counts
            (b"s1", [b"", b"SADA1", b"REP", rid, b"200", 1]),           # non-bytes frames
            (b"s1", [b"", "SADA1", b"REP", rid, b"200", payload]),
            (b"s1", [None, b"SADA1", b"REP", rid, b"200", payload]),
            (b"s1", [b"", b"SADA1", b"REP", rid.decode(), b"200", payload]),
            (b"s1", [b"", b"SADA1", b"REP", [rid], b"200", payload]),   # (unhashable)
            (b"s1", [b"", b"SADA1", b"REP", rid, bytearray(b"200"), payload]),
            (b"s1", [b"\x00", b"SADA1", b"REP", rid, b"200", payload]),  # no delimiter
            (b"s1", [b"", b"SADA2", b"REP", rid, b"200", payload]),     # other protocol
            (b"s1", [b"", b"SADA", b"REP", rid, b"200", payload]),
            (b"s1", [b"", b"SADA1", b"REQ", rid, b"200", payload]),     # other command
            (b"s1", rep(b"c0ffee-99", 1)), (b"s1", rep(rid[:-1], 1)),  # unknown, short ids
            (b"s1", rep(b"", 1)), (b"s1", rep(rid + b"0" * 4096, 1)),
            (b"s1", [b"", b"SADA1", b"REP", rid, b"2000", payload]),    # bad statuses
            (b"s1", [b"", b"SADA1", b"REP", rid, b"20", payload]),
            (b"s1", [b"", b"SADA1", b"REP", rid, b"abc", payload]),
            (b"s1", [b"", b"SADA1", b"REP", rid, b"099", payload]),
            (b"s1", rep(rid, b"busy", status=503)), (b"s1", rep(rid, b"no", status=404)),
            (b"s2", rep(rid, 1)), (None, rep(rid, 1)), ([b"s1"], rep(rid, 1)),  # not its server
            (b"s1", rep(rid, b"\xc1")),                                 # not msgpack
            (b"s1", rep(rid, b"\x92\x01")),                             # a short array
    ):
        end, answers = run(core, [item, (b"s1", rep(rids[1], 2))])
        assert (end, answers) == (0, []), item
        assert core.pending == 2 and core.servers(0.3)[0].replies == 0
    end, answers = run(core, [(b"s1", rep(rid, 1)), None], start=0)
    assert (end, answers) == (1, [("t0", 1, None)])
    assert run(core, [(b"s1", rep(rid, 1))]) == (0, [])   # (answered: no longer pending)
    assert run(core, [(b"s1", rep(rids[1], 2))], start=1) == (1, [])   # (start: the end)


def test_a_request_that_is_parked_or_already_answered_is_left_alone() -> None:
    core, rids = held(2)
    core._pending[rids[0]].parked = True
    core._pending[rids[1]].token = None
    for rid in rids:
        assert run(core, [(b"s1", rep(rid, 1))]) == (0, [])
    assert core.pending == 2


def test_an_error_of_sink_goes_to_the_caller_once_the_answer_is_taken_in() -> None:
    core, rids = held(2)

    def sink(answer: Any) -> None:
        raise RuntimeError(answer[0])

    with pytest.raises(RuntimeError, match="t0"):
        run(core, [(b"s1", rep(rids[0], 1)), (b"s1", rep(rids[1], 2))], sink=sink)
    assert core.pending == 1 and rids[1] in core._pending


def test_a_sink_that_empties_the_batch_ends_the_call() -> None:
    core, rids = held(3)
    batch = [(b"s1", rep(rid, i)) for i, rid in enumerate(rids)]
    answers: list[Any] = []

    def sink(answer: Any) -> None:
        answers.append(answer)
        batch.clear()

    assert run(core, batch, sink=sink)[0] == 1 and answers == [("t0", 0, None)]


def test_answer_each_goes_on_in_python_after_what_the_c_path_leaves() -> None:
    """A REP whose payload is not msgpack stops ``sada_take``; ``answer_each`` answers
    it with the error the Python path makes, then takes the rest."""
    core, rids = held(3)
    answers: list[Any] = []
    batch = [(b"s1", rep(rids[0], 0)), (b"s1", rep(rids[1], b"\xc1")), (b"s1", rep(rids[2], 2))]
    assert core.answer_each(batch, 0, 0.3, answers.append) == 3
    assert answers[0] == ("t0", 0, None) and answers[2] == ("t2", 2, None)
    assert answers[1][0] == "t1" and "not msgpack" in str(answers[1][2])
    assert core.stats["replies"] == 3 and core.pending == 0


@pytest.mark.parametrize("unset", ["token", "parked", "raw", "server", "sent_at",
                                   "server.replies", "server.in_flight", "server.latency",
                                   "server.identity", "times.counts", "times.total"])
def test_unset_slots_stop_it_untouched(unset: str) -> None:
    """A request, server or histogram with a slot deleted is left to the Python path."""
    core, rids = held(1)
    pending = core._pending[rids[0]]
    owner = {"server": pending.server, "times": core.reply_times}.get(unset.split(".")[0])
    delattr(owner if "." in unset else pending, unset.split(".")[-1])
    assert run(core, [(b"s1", rep(rids[0], 1))]) == (0, [])
    assert core.pending == 1 and core.reply_times.count == 0
