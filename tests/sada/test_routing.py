"""The channel's routing core as tables: frames and times in, frames and answers out.

No sockets and no clock: every test feeds a ``RequestRouter`` messages from
made-up routing ids (``b"s1"``...) at given times and checks what it sent
and what it answered.
"""

from __future__ import annotations

from typing import Any, Optional
from weakref import WeakKeyDictionary

import msgpack
import pytest

from peermesh.sada import ChannelClosed, NoServerError, RequestTimeout, ServerLost, ServiceError
from peermesh.sada.routing import MAX_SERVICES, RequestRouter

PING = [b"", b"SADA1", b"PING"]
PONG = [b"", b"SADA1", b"PONG"]
RINTR = [b"", b"SADA1", b"RINTR"]


def intr(*services: str) -> list[bytes]:
    """An INTR listing ``"name version"`` pairs."""
    frames = [b"", b"SADA1", b"INTR"]
    for service in services:
        name, version = service.split()
        frames += [name.encode(), version.encode()]
    return frames


def rep(rid: bytes, value: Any = None, status: int = 200) -> list[bytes]:
    payload = value if isinstance(value, bytes) else msgpack.packb(value)
    return [b"", b"SADA1", b"REP", rid, str(status).encode(), payload]


def make(**settings: Any) -> RequestRouter:
    """A router (ping interval 1 s, dead after 3 intervals, timeout 5 s) at time 0 whose
    ``send`` and ``answer`` collect what they are given (see ``sent`` and ``answers``)."""
    out: list[tuple[bytes, list[bytes]]] = []
    got: list[tuple[Any, Any, Optional[BaseException]]] = []
    router = RequestRouter("c0ffee", lambda identity, frames: out.append((identity, frames)),
                           lambda token, value, error: got.append((token, value, error)),
                           now=0.0, **settings)
    _collected[router] = (out, got)
    return router


_collected: WeakKeyDictionary[RequestRouter, tuple[list, list]] = WeakKeyDictionary()


def _take(found: list) -> list:
    taken = found[:]
    found.clear()
    return taken


def sent(router: RequestRouter) -> list[tuple[bytes, list[bytes]]]:
    """What the router sent since the last look."""
    return _take(_collected[router][0])


def answers(router: RequestRouter) -> list[tuple[Any, Any, Optional[BaseException]]]:
    """What the router answered since the last look."""
    return _take(_collected[router][1])


def served(router: RequestRouter, *servers: tuple[bytes, list[str]], now: float = 0.0) -> None:
    """Introduce ``(identity, ["name version", ...])`` servers."""
    for identity, services in servers:
        router.on_message(identity, intr(*services), now)
    sent(router)


def req_to(router: RequestRouter) -> tuple[bytes, bytes, bytes]:
    """The one REQ sent: (server, request id, version frame)."""
    ((identity, frames),) = sent(router)
    assert frames[:3] == [b"", b"SADA1", b"REQ"]
    return identity, frames[3], frames[5]


def test_request_goes_out_as_the_spec_draws_it_and_the_reply_comes_back() -> None:
    router = make()
    served(router, (b"s1", ["echo 1.0"]))
    rid = router.submit("token", "echo", "say", {"x": 1}, 0.5, category="talk")
    assert rid == b"c0ffee-1"
    assert sent(router) == [(b"s1", [b"", b"SADA1", b"REQ", b"c0ffee-1", b"echo", b"1.0",
                                     b"talk", b"say", msgpack.packb({"x": 1})])]
    router.on_message(b"s1", rep(rid, {"x": 1}), 0.6)
    assert answers(router) == [("token", {"x": 1}, None)]
    (info,) = router.servers(0.6)
    assert (info.in_flight, info.replies) == (0, 1)
    assert info.latency == pytest.approx(0.001 + 0.2 * (0.1 - 0.001))
    assert router.reply_times.count == 1 and router.reply_times.last == pytest.approx(0.1)
    assert router.pending == 0 and router._deadlines == []   # noqa: SLF001
    assert router.submit("t2", "echo", "say", raw=True, payload=b"\x01", now=1.0) == b"c0ffee-2"


def test_send_and_answer_come_last_so_a_driver_may_act_on_them_at_once() -> None:
    seen: list[tuple[str, int, int]] = []

    def send(identity: bytes, frames: list[bytes]) -> None:
        if frames[2] == b"REQ":
            seen.append(("send", router.servers(0.0)[0].in_flight, router.pending))

    def answer(token: Any, value: Any, error: Optional[BaseException]) -> None:
        seen.append(("answer", router.servers(0.1)[0].in_flight, router.pending))

    router = RequestRouter("c0ffee", send, answer)
    router.on_message(b"s1", intr("echo 1"), 0.0)
    rid = router.submit("t", "echo", "say", None, 0.0)
    router.on_message(b"s1", rep(rid), 0.1)
    assert seen == [("send", 1, 1), ("answer", 0, 0)]
    assert (router.stats["requests"], router.stats["replies"]) == (1, 1)


CATALOG = [(b"s1", ["calc 1.2"]), (b"s2", ["calc 1.10"]), (b"s3", ["calc 2.0"]),
           (b"s4", ["calc beta"])]


@pytest.mark.parametrize("version, server, chosen", [
    (None, b"s3", b"2.0"),        # nothing asked: the highest
    ("1.2", b"s1", b"1.2"),       # exact wins
    ("1.3", b"s2", b"1.10"),      # the highest compatible
    ("1", b"s2", b"1.10"),
    ("2", b"s3", b"2.0"),
    ("beta", b"s4", b"beta"),     # not dotted numbers: exact only
])
def test_version_choice(version: Optional[str], server: bytes, chosen: bytes) -> None:
    router = make()
    served(router, *CATALOG)
    router.submit("t", "calc", "add", [1], 0.0, version=version)
    identity, _, version_frame = req_to(router)
    assert (identity, version_frame) == (server, chosen)


@pytest.mark.parametrize("service, version, status, words", [
    ("calc", "3.0", 406, "compatible with '3.0' (offered: beta, 1.2, 1.10, 2.0)"),
    ("nothing", None, 404, "no server offers service 'nothing'"),
])
def test_nothing_to_serve_waits_then_fails_clearly(service: str, version: Optional[str],
                                                   status: int, words: str) -> None:
    router = make()
    served(router, *CATALOG)
    router.submit("t", service, "add", None, 0.0, version=version, timeout=2.0)
    assert sent(router) == []
    router.handle_timer(1.9)
    assert answers(router) == []
    router.handle_timer(2.0)
    ((token, value, error),) = answers(router)
    assert isinstance(error, NoServerError) and error.status == status
    assert words in error.message


def test_a_parked_request_goes_out_when_a_server_offers_the_service() -> None:
    router = make()
    router.submit("t", "late", "run", None, 0.0)
    assert sent(router) == [] and router.pending == 1
    version = router.catalog_version
    router.on_message(b"s9", intr("late 1.0"), 0.3)
    assert router.catalog_version != version
    assert req_to(router)[0] == b"s9"


@pytest.mark.parametrize("in_flight, penalty, chosen", [
    ((0, 0), (1, 1), b"s1"),      # a tie: the first
    ((1, 0), (1, 1), b"s2"),      # busier
    ((0, 0), (4, 1), b"s2"),      # penalised
    ((3, 0), (1, 8), b"s1"),      # 4 x 1 < 1 x 8
])
def test_load_and_penalty_choose_the_server(in_flight: tuple[int, int], penalty: tuple[int, int],
                                            chosen: bytes) -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]), (b"s2", ["svc 1"]))
    for identity, count, factor in zip((b"s1", b"s2"), in_flight, penalty):
        server = router._servers[identity]   # noqa: SLF001
        server.in_flight, server.penalty = count, float(factor)
    router.submit("t", "svc", "run", None, 0.0)
    assert req_to(router)[0] == chosen


def test_timeout_names_the_server_and_penalises_it() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    rid = router.submit("t", "svc", "run", None, 0.0, timeout=0.6)
    sent(router)
    assert router.next_deadline() == 0.25      # the liveness look comes first
    router.handle_timer(0.25)
    assert router.next_deadline() == 0.5
    router.handle_timer(0.5)
    assert router.next_deadline() == 0.6
    router.handle_timer(0.6)
    ((_, _, error),) = answers(router)
    assert isinstance(error, RequestTimeout) and not isinstance(error, ServerLost)
    assert "from server 7331 within 0.6 s" in str(error) and error.request_id == rid
    (info,) = router.servers(0.6)
    assert info.penalty == 2 and info.in_flight == 0
    router.on_message(b"s1", rep(rid, 1), 0.7)   # too late: ignored
    assert answers(router) == []
    router.on_message(b"s1", PONG, 1.6)
    router.handle_timer(1.75)                    # penalties halve back each interval
    assert router.servers(1.75)[0].penalty == 1


def test_503_goes_to_another_server_without_using_a_retry() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]), (b"s2", ["svc 1"]))
    rid = router.submit("t", "svc", "run", None, 0.0)
    first = req_to(router)[0]
    router.on_message(first, rep(rid, b"busy", 503), 0.1)
    second = req_to(router)[0]
    assert second != first
    router.on_message(second, rep(rid, "done"), 0.2)
    assert answers(router) == [("t", "done", None)]
    assert router.stats["retries_503"] == 1


@pytest.mark.parametrize("status, payload, words", [
    (404, b"no such service", "404 no such service"),
    (500, b"handler failed", "500 handler failed"),
    (200, b"\xc1", "reply payload is not msgpack"),
])
def test_error_replies(status: int, payload: bytes, words: str) -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    rid = router.submit("t", "svc", "run", None, 0.0)
    sent(router)
    router.on_message(b"s1", rep(rid, payload, status), 0.1)
    ((_, _, error),) = answers(router)
    assert isinstance(error, ServiceError) and words in str(error)
    assert error.server == b"s1".hex()


def test_a_reply_counts_only_from_the_server_holding_the_request() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]), (b"evil", ["svc 1.9"]))
    rid = router.submit("t", "svc", "run", None, 0.0, version="1.0")
    holder = req_to(router)[0]
    other = b"s1" if holder == b"evil" else b"evil"
    router.on_message(other, rep(rid, "forged"), 0.1)
    assert answers(router) == []
    router.on_message(holder, rep(rid, "real"), 0.2)
    assert answers(router) == [("t", "real", None)]


# liveness: (time, what the router sends, suspect, still there)
SILENT_SERVER = [
    (0.25, [], False, True),
    (1.0, [PING], False, True),        # an interval of silence: PING
    (1.25, [], False, True),
    (1.5, [], True, True),             # unanswered for half an interval: suspect
    (2.0, [PING], True, True),
    (2.75, [], True, True),
    (3.0, [], True, False),            # dead_after intervals: dropped
]


def test_a_silent_server_is_pinged_suspected_then_dropped() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    for now, frames, suspect, there in SILENT_SERVER:
        router.handle_timer(now)
        assert [f for _, f in sent(router)] == frames, now
        servers = router.servers(now)
        assert bool(servers) == there, now
        if servers:
            assert servers[0].suspect == suspect, now
    assert router.stats["servers_dropped"] == 1


def test_a_pong_keeps_a_server_and_clears_suspicion() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    for now in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5):
        router.handle_timer(now)
    assert router.servers(1.5)[0].suspect
    router.on_message(b"s1", PONG, 1.6)
    assert not router.servers(1.6)[0].suspect
    for now in (1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25):
        router.handle_timer(now)
    assert router.servers(3.25)


@pytest.mark.parametrize("retries, outcome", [(1, "failover"), (0, "lost")])
def test_requests_of_a_dead_server_fail_over_or_fail(retries: int, outcome: str) -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    rid = router.submit("t", "svc", "run", None, 0.0, retries=retries)
    sent(router)
    router.on_message(b"s2", intr("svc 1"), 0.5)
    for now in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0):
        router.on_message(b"s2", PONG, now)
        router.handle_timer(now)
    frames = [(identity, f) for identity, f in sent(router) if f[2] == b"REQ"]
    if outcome == "failover":
        assert [(identity, f[3]) for identity, f in frames] == [(b"s2", rid)]
        assert router.stats["failovers"] == 1 and answers(router) == []
    else:
        assert frames == []
        ((_, _, error),) = answers(router)
        assert isinstance(error, ServerLost) and "no retries allowed" in str(error)


def test_nobody_is_judged_dead_while_answers_wait_unread_or_after_a_stall() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    for now in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75):
        router.handle_timer(now)
    router.handle_timer(3.0, backlog=True)
    assert router.servers(3.0)
    router.handle_timer(9.0)               # the driver was late: look again before judging
    assert router.servers(9.0)
    router.handle_timer(9.25)
    assert not router.servers(9.25)


def test_send_failures() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]), (b"s2", ["svc 1"]), (b"s3", ["svc 1"]))
    rid = router.submit("t", "svc", "run", None, 0.0)
    first, frames = sent(router)[0]
    router.send_failed(first, frames, 0.0, full=True)       # busy: penalised, the next one
    second, frames = sent(router)[0]
    assert second != first and frames[3] == rid
    assert {s.id: s.penalty for s in router.servers(0.0)}[first.hex()] == 2
    router.send_failed(second, frames, 0.0, full=False, reason="Host unreachable")
    assert second.hex() not in [s.id for s in router.servers(0.0)]      # gone: dropped
    third, frames = sent(router)[0]
    assert third not in (first, second) and frames[3] == rid
    router.on_message(third, rep(rid, "ok"), 0.1)
    assert answers(router) == [("t", "ok", None)]
    assert router.stats["failovers"] == 0      # a REQ that never left uses no retry
    assert [s.in_flight for s in router.servers(0.1)] == [0, 0]


def test_unknown_servers_get_rintr_at_most_once_per_interval() -> None:
    router = make()
    for now, expected in [(0.0, [RINTR]), (0.5, []), (1.0, [RINTR])]:
        router.on_message(b"ghost", PONG, now)
        assert [f for _, f in sent(router)] == expected, now
    router.on_message(b"ghost", rep(b"c0ffee-9", 1), 1.2)
    assert sent(router) == [] and answers(router) == []


@pytest.mark.parametrize("frames", [
    [],
    [b"x"],
    [b"", b"SADA2", b"INTR"],
    [b"", b"SADA1", b"NOPE"],
    [b"", b"SADA1", b"INTR", b"odd"],
    [b"", b"SADA1", b"REP", b"", b"200", b""],
    [b"", b"SADA1", b"REP", b"c0ffee-1", b"999", b""],
    [b"", b"SADA1", b"REQ", b"r", b"s", b"1", b"", b"a", b""],   # not for a channel
    [b"", b"SADA1", b"PING"],
    intr(*[f"s{i} 1" for i in range(MAX_SERVICES + 1)]),
], ids=lambda f: repr(f[:4]))
def test_hostile_frames_are_dropped(frames: list[bytes]) -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    rid = router.submit("t", "svc", "run", None, 0.0)
    sent(router)
    router.on_message(b"s1", frames, 0.1)
    router.on_message(b"s2", frames, 0.1)
    assert router.stats["dropped"] >= 1
    assert [s.id for s in router.servers(0.1)] == [b"s1".hex()]
    router.on_message(b"s1", rep(rid, "fine"), 0.2)
    assert answers(router) == [("t", "fine", None)]


def test_a_server_named_by_id() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]), (b"s2", ["svc 1"]))
    router.submit("t", "svc", "run", None, 0.0, server=b"s2".hex())
    assert req_to(router)[0] == b"s2"
    router.submit("u", "svc", "run", None, 0.0, server="00dead")
    ((token, _, error),) = answers(router)
    assert token == "u" and isinstance(error, NoServerError) and "no server 00dead" in str(error)
    with pytest.raises(ValueError, match="not a server id"):
        router.submit("v", "svc", "run", None, 0.0, server="not hex")


@pytest.mark.parametrize("args, error", [
    (dict(service=""), ValueError),
    (dict(service="x" * 256), ValueError),
    (dict(action=1), TypeError),
    (dict(timeout=0), ValueError),
    (dict(retries=-1), ValueError),
    (dict(raw=True, payload="text"), TypeError),
])
def test_requests_that_cannot_be_sent_are_refused_and_leave_nothing(args: dict, error: type
                                                                   ) -> None:
    router = make()
    call = dict(service="svc", action="run", payload=None, **{"now": 0.0})
    call.update(args)
    with pytest.raises(error):
        router.submit("t", **call)
    assert router.pending == 0 and sent(router) == [] and router.stats["requests"] == 0


def test_close_answers_every_waiting_request() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]))
    router.submit("a", "svc", "run", None, 0.0)
    router.submit("b", "parked", "run", None, 0.0)
    router.close(ChannelClosed("stopped"))
    assert sorted(token for token, _, error in answers(router)
                  if isinstance(error, ChannelClosed)) == ["a", "b"]
    assert router.pending == 0


def test_refresh_and_probe_reach_every_server() -> None:
    router = make()
    served(router, (b"s1", ["svc 1"]), (b"s2", ["svc 1"]))
    router.refresh()
    assert sorted(sent(router)) == [(b"s1", RINTR), (b"s2", RINTR)]
    router.probe(0.1)
    assert sorted(sent(router)) == [(b"s1", PING), (b"s2", PING)]


def test_settings_are_checked() -> None:
    for bad in (dict(ping_interval=0), dict(timeout=-1), dict(dead_after=0.5)):
        with pytest.raises(ValueError):
            make(**bad)


# (who, INTR) in turn -> the catalog after each
CATALOG_CHANGES = [
    (b"s1", ["a 1", "b 1"], {"a": {"1": ["s1"]}, "b": {"1": ["s1"]}}),
    (b"s2", ["a 1", "a 2"], {"a": {"1": ["s1", "s2"], "2": ["s2"]}, "b": {"1": ["s1"]}}),
    (b"s1", ["b 2"], {"a": {"1": ["s2"], "2": ["s2"]}, "b": {"2": ["s1"]}}),
    (b"s2", [], {"b": {"2": ["s1"]}}),                  # an empty INTR: offers nothing
    (b"s1", ["b 2"], {"b": {"2": ["s1"]}}),             # the same again: nothing changes
]


def test_every_intr_replaces_that_servers_catalog_only() -> None:
    router = make()
    for identity, services, catalog in CATALOG_CHANGES:
        router.on_message(identity, intr(*services), 0.0)
        hexed = {name: {v: [bytes.fromhex(i).decode() for i in ids]
                        for v, ids in versions.items()}
                 for name, versions in router.services().items()}
        assert hexed == catalog, (identity, services)
    router.submit("t", "a", "run", None, 0.0)
    assert sent(router) == []                           # nobody offers "a" any more
    router.on_message(b"s2", intr("a 2"), 0.1)
    assert req_to(router)[0] == b"s2"


def test_the_catalog_is_bounded_and_a_refused_intr_changes_nothing() -> None:
    router = make(max_catalog=4)
    served(router, (b"s1", ["a 1", "b 1"]))
    router.on_message(b"s2", intr("c 1", "d 1", "e 1"), 0.0)     # would make 5
    assert [s.id for s in router.servers(0.0)] == [b"s1".hex()]
    router.on_message(b"s1", intr("a 1", "b 1", "c 1", "d 1", "e 1"), 0.0)
    assert sorted(router.services()) == ["a", "b"]              # s1 keeps what it had
    router.on_message(b"s1", intr("a 1"), 0.0)                   # shrinking frees room
    router.on_message(b"s2", intr("c 1", "d 1", "e 1"), 0.0)
    assert sorted(router.services()) == ["a", "c", "d", "e"]
    assert router.stats["dropped"] == 2
    router.submit("t", "e", "run", None, 0.0)
    assert req_to(router)[0] == b"s2"
