"""The C extension's ``sada_jobs`` (``ServerCore.job_each``'s usual case in C): its
argument checks, and hostile batches left untouched for the Python path.

A real server core (no sockets); the extension is called as ``job_each`` calls it.
Skipped when the extension is not built.
"""

from __future__ import annotations

from typing import Any

import pytest

from peermesh.sada import serving
from peermesh.sada.serving import Job, ServerCore
from peermesh.wire import sada as wire

from .test_server_core import ALIAS, CHANNEL, req, served, wire_pack

take = serving._jobs_in_c
pytestmark = pytest.mark.skipif(take is None, reason="the C extension (sada_jobs) is not built")


def ready(**settings: Any) -> ServerCore:
    """A serving core whose ``calc`` service was resolved (its REQs take the fast path)."""
    core = served(**settings)
    core.link(CHANNEL, 0.0, direct=True)
    core.receive(ALIAS, req(b"r0", "double", wire_pack(0)), 0.0)
    core.take()
    return core


def run(core: ServerCore, batch: Any, start: int = 0, sink: Any = None) -> tuple[int, list[Any]]:
    jobs: list[Any] = []
    return take(batch, start, core, sink or jobs.append, core._jobs_shape), jobs


def test_the_usual_reqs_are_handed_on_as_the_python_path_hands_them() -> None:
    core = ready(max_concurrent=1)
    end, jobs = run(core, [(ALIAS, req(b"r1", "double", b"\x01")),
                           (ALIAS, req(b"r2", "add", b"\x90")),
                           (ALIAS, req(b"r3", "add", b"\x90"))])   # r3: busy
    assert end == 2 and [type(j) for j in jobs] == [Job, Job]
    assert jobs[0] == Job(ALIAS, jobs[0].handler, b"r1", b"\x01", None)
    assert jobs[0].handler.inline and not jobs[1].handler.inline
    assert core.busy == 1 and core.stats["requests"] == 3


@pytest.mark.parametrize("args", [
    (), ([], 0, None, print),                                   # counts
    ({}, 0, None, print, None),                                 # batch not a sequence
    ([], 0, None, None, None),                                  # sink not callable
    ([], "0", None, print, None),                               # start not an int
])
def test_arguments_are_checked(args: tuple[Any, ...]) -> None:
    core = ready()
    fixed = [core if a is None and i == 2 else a for i, a in enumerate(args)]
    if len(fixed) == 5 and fixed[4] is None:
        fixed[4] = core._jobs_shape
    with pytest.raises(TypeError):
        take(*fixed)


def test_a_negative_start_and_bad_shapes_are_refused() -> None:
    core = ready()
    shape = core._jobs_shape
    with pytest.raises(ValueError):
        take([], -1, core, print, shape)
    for bad in (None, shape[:5], ([], *shape[1:]), (shape[0], [], *shape[2:]),
                (*shape[:2], dict, *shape[3:]), (*shape[:2], 5, *shape[3:]),
                (*shape[:3], "SADA1", *shape[4:]), (*shape[:5], "255")):
        with pytest.raises(TypeError):
            take([], 0, core, print, bad)


def test_hostile_messages_stop_it_untouched() -> None:
    core = ready(max_concurrent=4)
    good = req(b"r5", "double", b"\x05")
    for item in (
            None, (ALIAS,), (ALIAS, None, None), [ALIAS, good], (ALIAS, None),  # shapes
            (ALIAS, tuple(good)), (ALIAS, good[:-1]), (ALIAS, good + [b""]),     # frames
            (ALIAS, [*good[:8], 5]), (ALIAS, ["", *good[1:]]),                  # not bytes
            (ALIAS, [*good[:4], bytearray(good[4]), *good[5:]]),
            (ALIAS, [b"x", *good[1:]]), (ALIAS, [b"", b"SADA2", *good[2:]]),     # delimiter..
            (ALIAS, [*good[:2], b"REP", *good[3:]]),                             # command
            (ALIAS, [*good[:3], b"", *good[4:]]),                                # ids
            (ALIAS, [*good[:3], b"r" * 256, *good[4:]]),
            (ALIAS, req(b"r6", "double", b"", version="9.9")),                  # unresolved
            (ALIAS, [*good[:4], b"nope", *good[5:]]),
            (ALIAS, [*good[:6], b"", b"nope", good[8]]),                        # no action
            (ALIAS, wire.encode(wire.Ping())),
    ):
        end, jobs = run(core, [item, (ALIAS, good)])
        assert (end, jobs) == (0, []), item
        assert core.stats["requests"] == 1 and core.busy == 0
    core.serving = False
    assert run(core, [(ALIAS, good)]) == (0, [])   # stopping: answered 503 by receive
    core.serving = True
    assert run(core, [(ALIAS, good)], start=1) == (1, [])


def test_a_handler_with_request_or_a_full_server_is_left_to_the_python_path() -> None:
    core = ready(max_concurrent=1)
    handler = core._by_frames[(b"calc", b"1.2")].by_frames[(b"", b"double")]
    handler.with_request = True
    assert run(core, [(ALIAS, req(b"r1", "double", b"\x01"))]) == (0, [])
    core.busy = 1
    assert run(core, [(ALIAS, req(b"r2", "add", b"\x90"))]) == (0, [])
    assert core.busy == 1 and core.stats["requests"] == 1


def test_an_error_of_sink_goes_to_the_caller_and_a_sink_may_empty_the_batch() -> None:
    core = ready()

    def failing(job: Any) -> None:
        raise RuntimeError(job.request_id)

    batch = [(ALIAS, req(b"r1", "double", b"\x01")), (ALIAS, req(b"r2", "double", b"\x02"))]
    with pytest.raises(RuntimeError, match="r1"):
        run(core, batch, sink=failing)
    assert core.stats["requests"] == 2
    jobs: list[Any] = []

    def emptying(job: Any) -> None:
        jobs.append(job)
        batch.clear()

    assert run(core, batch, sink=emptying)[0] == 1 and len(jobs) == 1
