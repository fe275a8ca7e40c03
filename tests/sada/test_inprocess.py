"""Channels and servers in one process on loopback, plus plain-spec peers made of raw sockets.

The raw peers (``RawPeer``) are bare ZeroMQ ROUTER sockets speaking the spec's
frames by hand: they check what peermesh puts on the wire and stand in for
another implementation of the spec, a hung server, or a hostile one.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Optional

import gevent
import gevent.lock
import pytest
import zmq.green as zmq_green

from peermesh import Node, ThreadedNode
from peermesh.sada import (Channel, ChannelClosed, NoServerError, RequestTimeout, Server,
                           ServerLost, Service, ServiceError, ThreadedChannel, ThreadedServer,
                           echo_service)
from peermesh.sada.handlers import pack

from .conftest import PING, WAIT, Loopback, wait_until


class RawPeer:
    """A bare ROUTER (zmq.green) that speaks SADA1 frames by hand."""

    def __init__(self, identity: Optional[bytes] = None) -> None:
        self.context = zmq_green.Context.instance()
        self.sock = self.context.socket(zmq_green.ROUTER)
        self.sock.setsockopt(zmq_green.LINGER, 0)
        if identity is not None:
            self.sock.setsockopt(zmq_green.ROUTING_ID, identity)

    def bind(self, endpoint: str) -> "RawPeer":
        self.sock.bind(endpoint)
        return self

    def connect(self, endpoint: str) -> "RawPeer":
        self.sock.setsockopt(zmq_green.CONNECT_ROUTING_ID, endpoint.encode())
        self.sock.connect(endpoint)
        return self

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = WAIT) -> Optional[list[bytes]]:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return self.sock.recv_multipart()

    def expect(self, command: bytes, timeout: float = WAIT) -> list[bytes]:
        """The next message whose frame 3 is ``command`` (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self.recv(max(0.0, deadline - time.monotonic()))
            if frames is None:
                pytest.fail(f"no {command!r} within {timeout}s")
            if len(frames) > 3 and frames[3] == command:
                return frames

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
def raw() -> Any:
    peers: list[RawPeer] = []

    def make(identity: Optional[bytes] = None) -> RawPeer:
        peer = RawPeer(identity)
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.close()


# --------------------------------------------------------------------------
# Requests and replies


@pytest.mark.usefixtures("native_path")
def test_request_reply_sync_async_and_raw(loop: Loopback) -> None:
    channel = loop.channel()
    server = loop.server(channel)

    @server.handler("bytes", "reverse", raw=True, inline=True)
    def reverse(data: bytes) -> bytes:
        return data[::-1]

    @server.handler("ids", "mine", request=True)
    def mine(_: Any, request: Any) -> bytes:
        return request.request_id

    assert channel.wait_for("echo", timeout=WAIT)
    assert channel.wait_for("ids", timeout=WAIT)
    value = {"text": "ünïcode", "bin": b"\x00\xff", "list": [1, 2.5, None, True], "n": 2**40}
    assert channel.request("echo", "echo", value) == value
    assert channel.request("echo", "echo") is None
    assert channel.request("bytes", "reverse", b"\x01\x02abc", raw=True) == b"cba\x02\x01"
    results = [channel.request_async("echo", "echo", i) for i in range(300)]
    assert [r.get(WAIT) for r in results] == list(range(300))
    ids = {channel.request("ids", "mine") for _ in range(5)}
    assert len(ids) == 5
    assert all(i.startswith(channel.id.encode() + b"-") for i in ids)
    assert channel.request("echo", "info")["server"] == "s"
    assert channel.stats["replies"] >= 308 and channel.stats["dropped"] == 0
    with pytest.raises(TypeError):
        channel.request("bytes", "reverse", "text", raw=True)


def test_request_ids_differ_across_channels_and_restarts(loop: Loopback) -> None:
    ids = {loop.channel().id for _ in range(4)}
    assert len(ids) == 4 and all(len(i) == 16 for i in ids)


@pytest.mark.usefixtures("native_path")
def test_error_statuses(loop: Loopback) -> None:
    channel = loop.channel()
    loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    (server,) = channel.servers()
    cases = [("nope", "x", None, 404, "unknown service 'nope'"),
             ("echo", "x", None, 405, "service 'echo' 1.0 has no action 'x'"),
             ("echo", "echo", "2.0", 406,
              "service 'echo' has no version compatible with '2.0' (offers 1.0)")]
    for service, action, version, status, message in cases:
        with pytest.raises(ServiceError) as info:
            channel.request(service, action, version=version, server=server.id)
        assert (info.value.status, info.value.message) == (status, message)
        assert info.value.server == server.id
    with pytest.raises(ServiceError) as info:
        channel.request("echo", "fail", "boom")
    assert (info.value.status, info.value.message) == (500, "RuntimeError: boom")
    assert channel.request("echo", "echo", "still alive") == "still alive"
    # asked of the catalog: the channel itself says no server offers it
    started = time.monotonic()
    with pytest.raises(NoServerError) as info:
        channel.request("nope", "x", timeout=0.2)
    assert info.value.status == 404 and "no server offers service 'nope'" in info.value.message
    with pytest.raises(NoServerError) as info:
        channel.request("echo", "echo", version="2", timeout=0.2)
    assert info.value.status == 406 and "offered: 1.0" in info.value.message
    assert time.monotonic() - started < 2


def test_version_choice_across_servers(loop: Loopback) -> None:
    channel = loop.channel()
    for version, label in (("1.2", "a"), ("1.5", "b"), ("2.0", "c")):
        loop.server(channel, services=[echo_service(label, version)])
    assert channel.wait_until(lambda ch: len(ch.servers()) == 3, WAIT)
    who = lambda version: channel.request("echo", "info", version=version)["server"]  # noqa
    assert who("1.2") == "a"       # exact
    assert who("1.3") == "b"       # same major, the highest not lower
    assert who("1") == "b"
    assert who(None) == "c"        # nothing asked: the highest
    assert who("2") == "c"
    by_version = sorted(channel.servers(), key=lambda i: i.services[0].version)
    expected = {v: [s.id] for v, s in zip(("1.2", "1.5", "2.0"), by_version)}
    assert channel.services() == {"echo": expected}


def test_load_spreads_over_servers(loop: Loopback) -> None:
    channel = loop.channel()
    for label in ("a", "b"):
        service = Service("work", "1.0")

        @service.action("run")
        def run(ms: int, label: str = label) -> str:
            gevent.sleep(ms / 1000.0)
            return label

        loop.server(channel, services=[service])
    assert channel.wait_for("work", count=2, timeout=WAIT)
    results = [channel.request_async("work", "run", 3) for _ in range(200)]
    served = [r.get(WAIT) for r in results]
    assert 40 <= served.count("a") <= 160, served.count("a")
    assert sorted(s.replies for s in channel.servers()) == sorted(
        [served.count("a"), served.count("b")])


def test_pipelined_load_spreads_over_servers_that_serve_one_at_a_time(loop: Loopback) -> None:
    # bench_sada's server-bound case: each server runs one request at a time, so
    # throughput only scales if the channel keeps every one of them busy.
    channel = loop.channel()
    labels = "abcd"
    for label in labels:
        service = Service("work", "1.0")
        one_at_a_time = gevent.lock.Semaphore(1)

        @service.action("run")
        def run(ms: float, label: str = label, lock: Any = one_at_a_time) -> str:
            with lock:
                gevent.sleep(ms / 1000.0)
            return label

        loop.server(channel, services=[service])
    assert channel.wait_for("work", count=4, timeout=WAIT)
    served: list[str] = []
    numbers = iter(range(400))

    def sender() -> None:         # a window of 16: each sends its next when answered
        for _ in numbers:
            served.append(channel.request("work", "run", 0.5, timeout=WAIT))

    gevent.joinall([gevent.spawn(sender) for _ in range(16)], timeout=4 * WAIT,
                   raise_error=True)
    assert len(served) == 400
    counts = {label: served.count(label) for label in labels}
    assert all(count >= 50 for count in counts.values()), counts   # an even share is 100
    assert sorted(s.replies for s in channel.servers()) == sorted(counts.values())


@pytest.mark.usefixtures("native_path")
def test_timeout_is_clear_and_penalises_the_server(loop: Loopback) -> None:
    channel = loop.channel()
    slow = Service("svc", "1.0")
    slow.add("run", lambda ms: gevent.sleep(ms / 1000.0) or "slow")
    fast = Service("svc", "1.0")
    fast.add("run", lambda ms: "fast")
    loop.server(channel, services=[slow])
    assert channel.wait_for("svc", timeout=WAIT)
    (slow_info,) = channel.servers()
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        channel.request("svc", "run", 2000, timeout=0.15)
    assert 0.14 <= time.monotonic() - started < 1.0
    assert info.value.server == slow_info.id and "within 0.15 s" in str(info.value)
    assert not isinstance(info.value, ServerLost)
    loop.server(channel, services=[fast])
    assert channel.wait_for("svc", count=2, timeout=WAIT)
    penalised = {s.id: s.penalty for s in channel.servers()}
    assert penalised[slow_info.id] > 1
    assert [channel.request("svc", "run", 0) for _ in range(10)] == ["fast"] * 10
    assert channel.stats["timeouts"] == 1


def _gated(loop: Loopback) -> tuple[Any, gevent.event.Event]:
    """A channel and a server whose "gate"/"wait" handler blocks until the event is set."""
    channel = loop.channel()
    server = loop.server(channel)
    gate = gevent.event.Event()

    @server.handler("gate", "wait")
    def wait(_: Any) -> str:
        gate.wait()
        return "opened"

    assert channel.wait_for("gate", timeout=WAIT)
    return channel, gate


def test_one_timer_keeps_every_deadline(loop: Loopback) -> None:
    """A short deadline behind long ones still expires; answered requests leave nothing."""
    channel, gate = _gated(loop)
    held = [channel.request_async("gate", "wait", timeout=30) for _ in range(3)]
    short = channel.request_async("gate", "wait", timeout=0.1)
    with pytest.raises(RequestTimeout):
        short.get(timeout=WAIT)
    assert not any(r.ready() for r in held)
    gate.set()
    assert [r.get(WAIT) for r in held] == ["opened"] * 3
    assert [channel.request("echo", "echo", i) for i in range(100)] == list(range(100))
    assert channel._core._deadlines == [] and not channel._core._due  # noqa: SLF001


@pytest.mark.usefixtures("native_path")
def test_a_caller_that_stops_waiting_gets_no_late_answer(loop: Loopback) -> None:
    """A caller killed or timed out (``gevent.Timeout``) while its request waits is left
    alone when the answer comes: the greenlet waits for something else by then."""
    channel, gate = _gated(loop)
    timed_out = gevent.event.Event()
    after = gevent.event.AsyncResult()

    def impatient() -> None:
        try:
            with gevent.Timeout(0.05):
                channel.request("gate", "wait", timeout=30)
        except gevent.Timeout:
            timed_out.set()
        after.set(gevent.event.Event().wait(0.5))   # (an answer switched in: not False)

    waiting = gevent.spawn(impatient)
    killed = gevent.spawn(channel.request, "gate", "wait", timeout=30)
    assert timed_out.wait(WAIT)
    wait_until(lambda: channel.servers()[0].in_flight == 2)
    killed.kill(block=True, timeout=WAIT)
    gate.set()
    wait_until(lambda: channel.servers()[0].in_flight == 0)
    assert after.get(WAIT) is False and waiting.join(WAIT) is None
    assert channel.stats["replies"] == 2 and channel._core.pending == 0  # noqa: SLF001
    assert channel.request("echo", "echo", 1) == 1


@pytest.mark.usefixtures("native_path")
def test_callers_answered_by_one_batch_get_their_own_answers(loop: Loopback) -> None:
    """Callers answered by one batch are switched to in turn, each handing on to the next
    when it waits again: every caller gets its own answer or error, also a caller that
    waits for something else in between, or whose answer is an error, or who waits on an
    ``AsyncResult``."""
    channel = loop.channel()
    server = loop.server(channel)

    @server.handler("bad", "reply", raw=True, inline=True)
    def bad_reply(data: bytes) -> bytes:
        return b"\xc1"   # (not msgpack: the caller's answer is a ServiceError)

    assert channel.wait_for("bad", timeout=WAIT)
    got: dict[int, list[Any]] = {}

    def caller(n: int) -> None:
        mine = got.setdefault(n, [])
        for i in range(20):
            if (n + i) % 7 == 0:
                with pytest.raises(ServiceError):
                    channel.request("bad", "reply")
                mine.append("error")
            elif n % 3 == 1:   # (an AsyncResult answered with the others)
                mine.append(channel.request_async("echo", "echo", [n, i]).get(timeout=WAIT))
            else:
                mine.append(channel.request("echo", "echo", [n, i]))
            if n % 5 == 0:
                gevent.sleep(0)   # (waits on the hub, not in a request)

    callers = [gevent.spawn(caller, n) for n in range(40)]
    gevent.joinall(callers, timeout=WAIT * 4, raise_error=True)
    assert all(c.successful() for c in callers)
    assert got == {n: ["error" if (n + i) % 7 == 0 else [n, i] for i in range(20)]
                   for n in range(40)}
    assert channel._core.pending == 0 and not channel._ready  # noqa: SLF001


def test_request_from_the_hub_itself_is_refused(loop: Loopback) -> None:
    channel = loop.channel()
    result = gevent.event.AsyncResult()

    def on_hub() -> None:
        try:
            channel.request("echo", "echo", 1)
        except BaseException as exc:
            result.set(exc)

    gevent.get_hub().loop.run_callback(on_hub)
    assert isinstance(result.get(WAIT), gevent.exceptions.BlockingSwitchOutError)
    assert channel._core.pending == 0  # noqa: SLF001


def test_handlers_may_block_in_their_own_greenlet(loop: Loopback) -> None:
    channel, gate = _gated(loop)
    held = [channel.request_async("gate", "wait") for _ in range(3)]
    assert channel.request("echo", "echo", 1) == 1   # the server still serves others
    gevent.sleep(PING * 2)                             # and answers PINGs: not suspect
    assert not channel.servers()[0].suspect
    gate.set()
    assert [r.get(WAIT) for r in held] == ["opened"] * 3


@pytest.mark.usefixtures("native_path")
def test_max_concurrent_answers_503_and_the_channel_goes_elsewhere(loop: Loopback) -> None:
    channel = loop.channel()
    gate = gevent.event.Event()
    busy = Service("svc", "1.0")
    busy.add("run", lambda _: gate.wait() and "busy")
    spare = Service("svc", "1.0")
    spare.add("run", lambda _: "spare")
    loop.server(channel, services=[busy], max_concurrent=1)
    assert channel.wait_for("svc", timeout=WAIT)
    first = channel.request_async("svc", "run")
    wait_until(lambda: channel.servers()[0].in_flight == 1)
    with pytest.raises(ServiceError) as info:
        channel.request("svc", "run", server=channel.servers()[0].id)
    assert info.value.status == 503 and "busy" in info.value.message
    loop.server(channel, services=[spare])
    assert channel.wait_for("svc", count=2, timeout=WAIT)
    # whichever server is chosen, a 503 is re-sent to the other one
    assert {channel.request("svc", "run") for _ in range(5)} == {"spare"}
    gate.set()
    assert first.get(WAIT) == "busy"


def test_channel_stop_fails_waiting_requests(loop: Loopback) -> None:
    channel = loop.channel()
    pending = channel.request_async("nothing", "here", timeout=30)
    channel.stop()
    with pytest.raises(ChannelClosed):
        pending.get(WAIT)
    with pytest.raises(ChannelClosed):
        channel.request("echo", "echo")


# --------------------------------------------------------------------------
# Catalogs: INTR, re-INTR, RINTR


def test_catalog_change_is_reintroduced(loop: Loopback) -> None:
    channel = loop.channel()
    server = loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    before = channel.stats["intr"]
    server.add_service(Service("extra", "3.1")).add("ping", lambda _: "pong")
    assert channel.wait_for("extra", "3", timeout=WAIT)
    assert channel.request("extra", "ping", version="3.0") == "pong"
    server.remove_service("echo", "1.0")
    assert channel.wait_until(lambda ch: "echo" not in ch.services(), WAIT)
    assert channel.stats["intr"] >= before + 2
    assert channel.offers("extra") == 1 and channel.offers("echo") == 0


def test_server_speaks_plain_spec_frames(loop: Loopback, raw: Any, free_tcp_port: int) -> None:
    """A hand-made channel (a bare ROUTER whose identity is its endpoint) talks to a Server."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    channel = raw(endpoint.encode()).bind(endpoint)
    server = Server(channels=[endpoint], services=[echo_service("x")]).start()
    try:
        intr = channel.expect(b"INTR")
        identity = intr[0]
        assert intr[1:] == [b"", b"SADA1", b"INTR", b"echo", b"1.0"]
        channel.send(identity, b"", b"SADA1", b"RINTR")
        assert channel.expect(b"INTR")[1:] == intr[1:]
        channel.send(identity, b"", b"SADA1", b"PING")
        assert channel.expect(b"PONG") == [identity, b"", b"SADA1", b"PONG"]
        channel.send(identity, b"", b"SADA1", b"REQ", b"12345678", b"echo", b"1", b"",
                     b"echo", b"\xa2hi")
        assert channel.expect(b"REP") == [identity, b"", b"SADA1", b"REP", b"12345678",
                                          b"200", b"\xa2hi"]
        channel.send(identity, b"", b"SADA1", b"REQ", b"r2", b"echo", b"1", b"", b"nope",
                     b"\xc0")
        rep = channel.expect(b"REP")
        assert rep[4:6] == [b"r2", b"405"] and b"nope" in rep[6]
        # the catalog changes: a fresh INTR without being asked
        server.add_service(Service("more", "1"))
        assert channel.expect(b"INTR")[4:] == [b"echo", b"1.0", b"more", b"1"]
    finally:
        server.stop(0)


def test_server_follows_catalog_changes_for_requests_it_knows(loop: Loopback, raw: Any,
                                                              free_tcp_port: int) -> None:
    """REQs like ones answered before (the server's fast path) see actions, versions
    and services come and go."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    channel = raw(endpoint.encode()).bind(endpoint)
    calc = Service("calc", "1.2")
    calc.add("add", sum, category="math")
    server = Server(channels=[endpoint], services=[calc]).start()
    try:
        identity = channel.expect(b"INTR")[0]

        def ask(rid: bytes) -> tuple[bytes, bytes]:
            channel.send(identity, b"", b"SADA1", b"REQ", rid, b"calc", b"1", b"math", b"add",
                         pack([1, 2]))
            rep = channel.expect(b"REP")
            assert rep[4] == rid
            return rep[5], rep[6]

        assert ask(b"1") == ask(b"2") == (b"200", pack(3))
        calc.remove("add", "math")
        assert ask(b"3")[0] == b"405"
        calc.add("add", lambda numbers: -sum(numbers), category="math")
        assert ask(b"4") == (b"200", pack(-3))
        server.add_service(Service("calc", "1.5"))   # "1" now means 1.5, which has no add
        assert ask(b"5")[0] == b"405"
        server.remove_service("calc", "1.5")
        assert ask(b"6") == (b"200", pack(-3))
        server.remove_service("calc", "1.2")
        assert ask(b"7")[0] == b"404"
    finally:
        server.stop(0)


def test_channel_sends_rintr_to_an_unknown_server(loop: Loopback, raw: Any) -> None:
    """A server the channel does not know (it restarted) gets RINTR and is then served."""
    channel = loop.channel()
    server = raw().connect(channel.endpoint)
    server.send(channel.endpoint.encode(), b"", b"SADA1", b"PONG")     # speaks before INTR
    rintr = server.expect(b"RINTR")
    assert rintr == [channel.endpoint.encode(), b"", b"SADA1", b"RINTR"]
    assert channel.stats["rintr_sent"] == 1
    server.send(channel.endpoint.encode(), b"", b"SADA1", b"INTR", b"plain", b"1.0")
    assert channel.wait_for("plain", timeout=WAIT)
    result = channel.request_async("plain", "act", {"x": 1})
    req = server.expect(b"REQ")
    assert req[4:9] == [channel.id.encode() + b"-1", b"plain", b"1.0", b"", b"act"]
    server.send(req[0], b"", b"SADA1", b"REP", req[4], b"200", b"\x81\xa1x\x01")
    assert result.get(WAIT) == {"x": 1}


def test_channel_restart_gets_fresh_intrs(loop: Loopback, free_tcp_port: int) -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    first = Channel(endpoint=endpoint, ping_interval=PING).start()
    slow = Service("slow", "1.0")
    slow.add("run", lambda ms: gevent.sleep(ms / 1000.0) or "late")
    server = loop.server(first, services=[echo_service("s"), slow])
    try:
        assert first.wait_for("slow", timeout=WAIT)
        held = first.request_async("slow", "run", 300, timeout=5)
        wait_until(lambda: server.stats["requests"] == 1)
        first.stop()
        with pytest.raises(ChannelClosed):
            held.get(WAIT)
        second = loop.channel(endpoint=endpoint, address=None)
        assert second.endpoint == endpoint
        # reconnection makes the server INTR again (monitor: handshake succeeded)
        assert second.wait_for("echo", timeout=WAIT)
        assert second.request("echo", "echo", "again") == "again"
        # the late REP for the old channel's request comes from a server the new
        # channel knows: dropped, nothing else happens
        wait_until(lambda: server.stats["replies"] >= 2)
    finally:
        first.stop()


# --------------------------------------------------------------------------
# Liveness and failover


@pytest.mark.usefixtures("native_path")
def test_hung_server_is_avoided_then_dropped_and_its_requests_fail_over(
        loop: Loopback, raw: Any) -> None:
    channel = loop.channel()
    hung = raw().connect(channel.endpoint)
    hung.send(channel.endpoint.encode(), b"", b"SADA1", b"INTR", b"echo", b"1.0")
    assert channel.wait_for("echo", timeout=WAIT)
    (hung_info,) = channel.servers()
    retried = [channel.request_async("echo", "echo", i, retries=1, timeout=5) for i in range(3)]
    lost = channel.request_async("echo", "echo", "x", retries=0, timeout=5)
    loop.server(channel, label="good")
    assert channel.wait_for("echo", count=2, timeout=WAIT)
    # PINGed on silence; unanswered, the hung server becomes suspect: new requests avoid it
    wait_until(lambda: any(s.suspect for s in channel.servers()), 3 * PING + 1)
    assert [channel.request("echo", "info")["server"] for _ in range(5)] == ["good"] * 5
    started = time.monotonic()
    assert [r.get(WAIT) for r in retried] == [0, 1, 2]        # failed over once it was dead
    with pytest.raises(ServerLost) as info:
        lost.get(WAIT)
    assert info.value.server == hung_info.id and "no retries" in str(info.value)
    assert time.monotonic() - started < channel.dead_after * PING + 1
    assert hung_info.id not in {s.id for s in channel.servers()}
    assert channel.stats["failovers"] == 3 and channel.stats["servers_dropped"] == 1
    assert len(hung.expect(b"PING")) == 4


def test_closed_server_connection_is_dropped_at_once(loop: Loopback, raw: Any) -> None:
    channel = loop.channel(ping_interval=30.0)   # only the disconnect can explain a quick drop
    gone = raw().connect(channel.endpoint)
    gone.send(channel.endpoint.encode(), b"", b"SADA1", b"INTR", b"echo", b"1.0")
    assert channel.wait_for("echo", timeout=WAIT)
    result = channel.request_async("echo", "echo", 1, retries=0, timeout=20)
    gone.expect(b"REQ")
    started = time.monotonic()
    gone.close()
    with pytest.raises(ServerLost):
        result.get(WAIT)
    assert time.monotonic() - started < 1.0
    assert channel.servers() == []


def test_stopping_server_drains_and_channels_move_on(loop: Loopback) -> None:
    channel = loop.channel()
    gate = gevent.event.Event()
    work = Service("work", "1.0")
    work.add("run", lambda _: gate.wait(WAIT) and "done")
    leaving = loop.server(channel, services=[work])
    assert channel.wait_for("work", timeout=WAIT)
    held = channel.request_async("work", "run")
    wait_until(lambda: leaving.stats["requests"] == 1)
    stopper = gevent.spawn(leaving.stop, 2.0)
    # the empty INTR takes it out of the catalog while its request runs on
    assert channel.wait_until(lambda ch: ch.offers("work") == 0, WAIT)
    gate.set()
    assert held.get(WAIT) == "done"
    stopper.join(WAIT)
    assert channel.wait_until(lambda ch: not ch.servers(), WAIT)


# --------------------------------------------------------------------------
# Hostile input


GARBAGE = [
    [b"hello"],
    [b"", b"SADA1"],
    [b"", b"SADA2", b"REP", b"x", b"200", b""],
    [b"", b"ZRE\x01", b"PING"],
    [b"", b"SADA1", b"REP", b"id", b"2000", b""],
    [b"", b"SADA1", b"REP", b"id", b"200"],
    [b"", b"SADA1", b"INTR", b"odd"],
    [b"", b"SADA1", b"INTR", b"\xff\xfe", b"1"],
    [b"", b"SADA1", b"REQ", b"1", b"echo", b"1.0", b"", b"echo", b"\xc0"],
    [b"", b"SADA1", b"RINTR"],
    [b"", b"SADA1", b"BOGUS"],
    [b"x"] * 500,
    [b"", b"SADA1", b"REP", b"not-pending", b"200", b"\xc0"],
]


@pytest.mark.usefixtures("native_path")
def test_hostile_frames_at_the_channel_do_no_harm(loop: Loopback, raw: Any) -> None:
    channel = loop.channel()
    loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    attacker = raw().connect(channel.endpoint)
    flood = gevent.spawn(_flood, attacker, channel.endpoint.encode(), 300)
    results = [channel.request_async("echo", "echo", i) for i in range(300)]
    assert [r.get(WAIT) for r in results] == list(range(300))
    flood.join(WAIT)
    assert flood.successful()
    wait_until(lambda: channel.stats["dropped"] >= 100)
    assert [s.services for s in channel.servers()] == [channel.servers()[0].services]
    assert channel.request("echo", "echo", "ok") == "ok"


def test_hostile_frames_at_the_server_do_no_harm(loop: Loopback, raw: Any,
                                                 free_tcp_port: int) -> None:
    good = loop.channel()
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    evil = raw(endpoint.encode()).bind(endpoint)
    server = loop.server(good)
    server.connect(endpoint)
    identity = evil.expect(b"INTR")[0]
    assert good.wait_for("echo", timeout=WAIT)
    flood = gevent.spawn(_flood, evil, identity, 300)
    results = [good.request_async("echo", "echo", i) for i in range(300)]
    assert [r.get(WAIT) for r in results] == list(range(300))
    flood.join(WAIT)
    assert flood.successful()
    wait_until(lambda: server.stats["dropped"] >= 100)
    # a REQ with a bad payload still gets one clear answer ('info' decodes it; 'echo' is raw)
    evil.send(identity, b"", b"SADA1", b"REQ", b"bad", b"echo", b"1.0", b"", b"info", b"\xc1")
    rep = evil.expect(b"REP")
    while rep[4] != b"bad":                  # answers to the flood's valid REQs come first
        rep = evil.expect(b"REP")
    assert rep[5] == b"400" and rep[6].startswith(b"payload is not msgpack")


def _flood(peer: RawPeer, identity: bytes, count: int) -> None:
    rng = random.Random(4)
    for i in range(count):
        if i % 3:
            frames = rng.choice(GARBAGE)
        else:
            frames = [rng.randbytes(rng.randrange(0, 12)) for _ in range(rng.randrange(1, 12))]
        peer.send(identity, *frames)
        if i % 50 == 0:
            gevent.sleep(0)


# --------------------------------------------------------------------------
# On the mesh


def test_servers_find_channels_on_the_mesh(free_udp_port: int) -> None:
    timing = dict(interface="lo", port=free_udp_port, interval=0.05, evasive=0.3, silent=0.4,
                  expired=0.6)
    front = Node("front", **timing)
    channel = Channel(front, ping_interval=PING)
    back = Node("back", **timing)
    server = Server(back, services=[echo_service("back")])
    both = Node("both", **timing)
    own_channel = Channel(both, ping_interval=PING)
    own_server = Server(both, services=[echo_service("both")])
    assert front.headers == {"X-PM-SADA-CHANNEL": channel.endpoint, "X-PM-ROLES": "sada-channel"}
    assert both.headers["X-PM-ROLES"] == "sada-channel,sada-server"
    started = [front, back, both]
    try:
        for node in started:
            node.start()
        own_server.start()   # before channel.start(): the channel's socket queues the INTR
        for part in (channel, server, own_channel):
            part.start()
        assert channel.wait_for("echo", count=2, timeout=WAIT)
        assert own_channel.wait_for("echo", count=2, timeout=WAIT)   # itself and 'back'
        assert {channel.request("echo", "info", server=s.id)["server"]
                for s in channel.servers()} == {"back", "both"}
        assert sorted(server.channels()) == sorted([channel.endpoint, own_channel.endpoint])
        back.stop()          # the node leaves; its server's connections go with it later
        server.stop(0)
        assert channel.wait_until(lambda ch: len(ch.servers()) == 1, WAIT)
        assert channel.request("echo", "info")["server"] == "both"
    finally:
        for part in (own_server, server, channel, own_channel):
            part.stop()
        for node in started:
            node.stop()


def test_threaded_channel_and_server(free_udp_port: int) -> None:
    timing = dict(interface="lo", port=free_udp_port, interval=0.05)
    channel = ThreadedChannel(interface="lo", ping_interval=PING)
    server = ThreadedServer(services=[echo_service("t")])

    @server.handler("calc", "add", version="1.2")
    def add(numbers: list[int]) -> int:
        return sum(numbers)

    with ThreadedNode("driver", headers=channel.headers, **timing) as driver, \
            ThreadedNode("worker", headers=server.headers, **timing) as worker:
        channel.start(driver)
        server.start(worker)
        try:
            assert channel.wait_for("calc", "1", timeout=WAIT)
            assert channel.request("calc", "add", [1, 2, 3], version="1.0") == 6
            futures = [channel.request_async("echo", "echo", i) for i in range(50)]
            assert [f.result(WAIT) for f in futures] == list(range(50))
            answers: list[Any] = []
            threads = [threading.Thread(target=lambda i=i: answers.append(
                channel.request("echo", "echo", i))) for i in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT)
            assert sorted(answers) == list(range(6))
            with pytest.raises(ServiceError):
                channel.request("echo", "fail")
            server.add_service(Service("late", "1.0"))
            assert channel.wait_for("late", timeout=WAIT)
            assert channel.stats["replies"] >= 57
        finally:
            channel.stop()
            server.stop(0)


def test_channel_leaving_and_returning_on_the_mesh(free_udp_port: int,
                                                   free_tcp_port: int) -> None:
    """A channel that left is forgotten after ``forget_after``; back at the same
    endpoint, it is connected again (under a fresh local routing id)."""
    timing = dict(interface="lo", port=free_udp_port, interval=0.05, evasive=0.3, silent=0.4,
                  expired=0.6)
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    back = Node("back", **timing)
    server = Server(back, services=[echo_service("back")], forget_after=0.1)
    nodes = [back]
    try:
        back.start()
        server.start()
        for round_ in range(3):
            front = Node(f"front{round_}", **timing)
            nodes.append(front)
            channel = Channel(front, endpoint=endpoint, ping_interval=PING)
            front.start()
            channel.start()
            try:
                assert channel.wait_for("echo", timeout=WAIT)
                assert channel.request("echo", "echo", round_) == round_
                assert server.channels() == [endpoint]
            finally:
                channel.stop()
                front.stop()
            if round_ == 0:
                # forgotten once its node has left for forget_after
                wait_until(lambda: server.channels() == [], WAIT)
        assert server._generations[endpoint] >= 2    # noqa: SLF001 - reconnected afresh
    finally:
        server.stop(0)
        for node in nodes:
            node.stop()


def test_request_to_an_unknown_server_fails_at_once(loop: Loopback) -> None:
    channel = loop.channel()
    started = time.monotonic()
    with pytest.raises(NoServerError) as info:
        channel.request("echo", "echo", server="00deadbeef", timeout=5)
    assert "no server 00deadbeef" in info.value.message
    assert time.monotonic() - started < 1
    with pytest.raises(ValueError):
        channel.request("echo", "echo", server="not hex")


def test_a_servers_address_is_that_of_its_connection(loop: Loopback) -> None:
    """Read once, for the server's first message (no message is read with metadata)."""
    channel = loop.channel()
    loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    assert [s.address for s in channel.servers()] == ["127.0.0.1"]
    assert channel.request("echo", "echo", "x") == "x"
    assert channel._guard is not None and channel._guard.keep is not None
