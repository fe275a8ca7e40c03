"""The connection policy of every listener: a bounded flood of idle connections is shed,
a real client is still answered, and the connections of a revoked key are closed."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import gevent
import gevent.socket
import pytest
import zmq

from peermesh.counters import Counters
from peermesh.io import HubSocket, bind_ephemeral, make_socket
from peermesh.io import connections
from peermesh.io.connections import COUNTERS, ConnectionPolicy, GuardedListener
from peermesh.io.curve import Curve
from peermesh.io.socket import KEY_AND_FD
from flooding import CAP, FLOOD, flood, wait_shed
from waiting import poll_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402

WAIT = 5.0


def counters() -> Counters:
    return Counters(logging.getLogger(__name__), "test listener", COUNTERS)


def echo(listener: GuardedListener) -> gevent.Greenlet:
    def on_message(identity: bytes, frames: list[bytes]) -> None:
        listener.try_send([identity, b"echo", *frames])

    return gevent.spawn(listener.serve, on_message)


def ask(dealer: HubSocket, text: bytes) -> list[bytes]:
    assert dealer.try_send([text])
    assert dealer.wait_readable(WAIT), f"no answer to {text!r}"
    ((first, rest),) = dealer.recv_batch(1)
    return [first, *rest]


def test_a_flood_of_idle_connections_is_shed_and_a_client_still_answered() -> None:
    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    shed = counters()
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), shed,
                               ConnectionPolicy(max_connections=CAP))
    server = echo(listener)
    dealer = HubSocket(make_socket(zmq.DEALER))
    try:
        with flood(listener.port):
            wait_shed(shed, sleep=gevent.sleep)
            assert listener.connections <= CAP
            dealer.socket.connect(endpoint)
            assert ask(dealer, b"hello") == [b"echo", b"hello"]
        poll_until(lambda: listener.connections <= 1, WAIT, "the flood's connections forgotten",
                   sleep=gevent.sleep)
        assert shed.get("connections_shed") >= FLOOD - CAP
    finally:
        dealer.close()
        listener.close()
        server.kill()


@pytest.mark.skipif(connections._malloc_trim() is None, reason="no malloc_trim (not glibc)")
def test_the_heap_is_trimmed_once_many_connections_have_closed() -> None:
    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), counters())
    try:
        with flood(listener.port, connections.TRIM_AFTER + 44):
            poll_until(lambda: listener.connections >= connections.TRIM_AFTER, WAIT,
                       "the connections accepted", sleep=gevent.sleep)
            assert listener.trims == 0
        poll_until(lambda: listener.trims == 1, WAIT, "the heap trimmed", sleep=gevent.sleep)
    finally:
        listener.close()


def test_the_connections_of_a_revoked_key_are_closed_and_its_messages_dropped(
        tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "a", "b")
    server_curve = Curve.load(ring.secret("server"), allowed)
    router = make_socket(zmq.ROUTER, curve=server_curve)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    seen = counters()
    revoked: list[frozenset[str]] = []
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), seen,
                               allowlist=server_curve.allowlist, on_revoked=revoked.append)
    server = echo(listener)
    dealers = {}
    for name in ("a", "b"):
        curve = Curve.load(ring.secret(name))
        dealers[name] = HubSocket(make_socket(zmq.DEALER, curve=curve,
                                              server_key=server_curve.public))
        dealers[name].socket.connect(endpoint)
    monitor = dealers["b"].socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        for name, dealer in dealers.items():
            assert ask(dealer, name.encode()) == [b"echo", name.encode()]
        os.remove(Path(allowed) / "b.key")
        poll_until(lambda: seen.get("connections_revoked") >= 1, WAIT, "b's connection closed",
                   sleep=gevent.sleep)
        assert monitor.poll(int(WAIT * 1000)), "b's client never saw its connection end"
        assert revoked == [frozenset({ring.public("b").decode()})]
        assert ask(dealers["a"], b"still") == [b"echo", b"still"]
        assert not dealers["b"].wait_readable(0.3)  # refused by ZAP now: never answered
    finally:
        monitor.close()
        dealers["b"].socket.disable_monitor()
        for dealer in dealers.values():
            dealer.close()
        listener.close()
        server.kill()
        server_curve.release(router.context)


def test_a_message_of_a_key_revoked_before_it_was_read_is_not_served(tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "b")
    server_curve = Curve.load(ring.secret("server"), allowed)
    router = make_socket(zmq.ROUTER, curve=server_curve)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    seen = counters()
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), seen,
                               allowlist=server_curve.allowlist)
    dealer = HubSocket(make_socket(zmq.DEALER, curve=Curve.load(ring.secret("b")),
                                   server_key=server_curve.public))
    dealer.socket.connect(endpoint)
    try:
        assert dealer.try_send([b"queued"])
        assert listener.listener.wait_readable(WAIT)  # waiting, unread
        poll_until(lambda: listener.connections == 1, WAIT, "the connection seen",
                   sleep=gevent.sleep)
        os.remove(Path(allowed) / "b.key")
        server_curve.allowlist.reload()
        assert listener.recv_batch(16) == []
        assert seen.get("messages_revoked") == 1 and seen.get("connections_revoked") == 1
    finally:
        dealer.close()
        listener.close()
        server_curve.release(router.context)


def test_policies_out_of_range_are_refused() -> None:
    for bad in ({"max_connections": 0}, {"max_per_address": 0}, {"revoke_check": 2.0},
                {"accept_pause": 0}):
        with pytest.raises(ValueError):
            ConnectionPolicy(**bad)  # type: ignore[arg-type]


def test_out_of_descriptors_the_listener_pauses_instead_of_spinning() -> None:
    """A process with every descriptor taken: accept fails (EMFILE), the listener stops
    listening a while instead of letting libzmq retry for ever, and serves again once
    descriptors are free."""
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("emfilechild.py"))],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert child.stdin is not None and child.stdout is not None

    def stats() -> dict:
        child.stdin.write(b"stats\n")  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        return json.loads(child.stdout.readline())  # type: ignore[union-attr]

    try:
        port = json.loads(child.stdout.readline())["port"]
        with flood(port, 20):
            poll_until(lambda: stats()["accept_paused"] >= 1, WAIT, "the listener paused")
            # libzmq retries a failed accept at once: spinning, it reports failures by
            # the hundred thousand a second for as long as the flood waits; paused, only
            # those before the pause took effect (the flood's connections are refused)
            counts: list[int] = []

            def steady() -> bool:
                counts.append(stats()["failures"])
                return counts[-2:-1] == counts[-1:]

            poll_until(steady, WAIT, "no more failed accepts")
        assert counts[-1] < 50_000
        child.stdin.write(b"free\n")
        child.stdin.flush()
        with zmq.Context() as context, context.socket(zmq.DEALER) as dealer:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"back")
            assert dealer.poll(int(WAIT * 1000)), "not listening again"
            assert dealer.recv() == b"back"
    finally:
        child.stdin.close()
        child.wait(WAIT)


def test_a_message_is_read_with_its_key_descriptor_and_address(tmp_path: Path) -> None:
    """``KEY_AND_FD``, through the C extension (when built) and through pyzmq alike."""
    ring = KeyRing(tmp_path)
    server_curve = Curve.load(ring.secret("server"), ring.allow("allowed", "a"))
    router = HubSocket(make_socket(zmq.ROUTER, curve=server_curve))
    endpoint = bind_ephemeral(router.socket, "127.0.0.1")
    dealer = make_socket(zmq.DEALER, curve=Curve.load(ring.secret("a")),
                         server_key=server_curve.public)
    dealer.connect(endpoint)
    try:
        got = []
        for read in (router._batch, router._pyzmq_batch):  # (the same one without the extension)
            dealer.send(b"x")
            assert router.wait_readable(WAIT)
            ((first, rest, value),) = read(1, 1 << 20, -1, KEY_AND_FD)
            got.append(value)
        key, fd, address = got[0]
        assert got[0] == got[1] and rest == [b"x"]
        assert key == ring.public("a").decode() and address == "127.0.0.1"
        with socket.socket(fileno=os.dup(fd)) as connection:
            assert connection.getsockname()[1] == int(endpoint.split(":")[-1])
    finally:
        dealer.close(0)
        router.close()
        server_curve.release(router.socket.context)


@pytest.mark.usefixtures("zmq_path")
def test_a_known_senders_connection_is_never_shed_and_the_unknown_ones_are_bounded() -> None:
    # Past its cap the listener shed the connections that sent the fewest octets: a
    # sender the owner knew went before newer connections that sent more.
    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    shed = counters()
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), shed,
                               ConnectionPolicy(max_connections=CAP, max_unknown=8),
                               keep=lambda identity: identity == b"\x01known")
    server = echo(listener)
    known = HubSocket(make_socket(zmq.DEALER, {zmq.IDENTITY: b"\x01known"}))
    loud = [HubSocket(make_socket(zmq.DEALER, {zmq.IDENTITY: b"\x01loud%d" % i}))
            for i in range(CAP)]
    try:
        known.socket.connect(endpoint)
        assert ask(known, b"hello") == [b"echo", b"hello"]
        (fd,) = [fd for fd, route in listener.routes.items() if route == b"\x01known"]
        since = listener.accepted[fd]
        for dealer in loud:  # each sends more than the known sender did
            dealer.socket.connect(endpoint)
            assert dealer.try_send([b"x" * 4096])
        wait_shed(shed, CAP - 8, sleep=gevent.sleep)
        # the listener holds its accepts meanwhile: the flood gets in in waves (see below)
        with flood(listener.port, wait=False):
            wait_shed(shed, CAP - 8 + FLOOD // 4, sleep=gevent.sleep)
            assert listener.accepted.get(fd) == since, "the known sender's connection was shed"
            assert listener.routes.get(fd) == b"\x01known"
            assert ask(known, b"still") == [b"echo", b"still"]
    finally:
        for dealer in [known, *loud]:
            dealer.close()
        listener.close()
        server.kill()


def begin_connect(port: int) -> socket.socket:
    """A TCP connection to ``port`` on loopback, begun (not waited for)."""
    sock = socket.socket()
    sock.setblocking(False)
    sock.connect_ex(("127.0.0.1", port))
    return sock


def connected(sock: socket.socket, seconds: float) -> bool:
    """Whether ``sock``'s connection is established within ``seconds`` (gevent's wait)."""
    try:
        gevent.socket.wait_write(sock.fileno(), timeout=seconds)
    except gevent.socket.timeout:
        return False
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0


def held_listener(pause: float) -> tuple[GuardedListener, Counters, HubSocket]:
    """A listener keeping at most 8 connections of senders it does not know (it knows only
    ``\\x01known``), holding its accepts for ``pause`` seconds once over it; and the known
    sender, connected and answered."""
    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, "127.0.0.1")
    shed = counters()
    listener = GuardedListener(HubSocket(router, endpoint=endpoint), shed,
                               ConnectionPolicy(max_connections=CAP, max_unknown=8,
                                                accept_pause=pause),
                               keep=lambda identity: identity == b"\x01known")
    known = HubSocket(make_socket(zmq.DEALER, {zmq.IDENTITY: b"\x01known"}))
    known.socket.connect(endpoint)
    return listener, shed, known


def test_over_max_unknown_the_listener_holds_new_connections_and_serves_the_known() -> None:
    # A shed client connects again at once (a DEALER 0.1 s later, for ever): shedding
    # alone turned a flood into a storm of connections accepted and shed again.
    listener, shed, known = held_listener(pause=1.0)
    server = echo(listener)
    late: list[socket.socket] = []
    try:
        assert ask(known, b"hello") == [b"echo", b"hello"]
        with flood(listener.port, 20, wait=False):
            poll_until(lambda: shed.get("accept_held") >= 1, WAIT, "the accepts held",
                       sleep=gevent.sleep)
            poll_until(lambda: listener.connections - 1 <= 8, WAIT, "at most 8 unknown",
                       sleep=gevent.sleep)
            # held: a new connection's SYN is dropped (the kernel sends it again in 1 s)
            late.append(begin_connect(listener.port))
            assert listener._held is not None
            assert not connected(late[0], 0.3), "a connection got in while accepts were held"
            assert ask(known, b"held") == [b"echo", b"held"]  # the known sender served
            # ... and accepted again after accept_pause
            assert connected(late[0], WAIT), "no connection got in after the hold"
        assert shed.get("connections_shed") >= 20 - 8
    finally:
        for sock in late:
            sock.close()
        known.close()
        listener.close()
        server.kill()


def test_a_listener_stopped_while_holding_accepts_again() -> None:
    listener, shed, known = held_listener(pause=60.0)
    late: list[socket.socket] = []
    try:
        with flood(listener.port, 20, wait=False):
            poll_until(lambda: shed.get("accept_held") >= 1, WAIT, "the accepts held",
                       sleep=gevent.sleep)
            late.append(begin_connect(listener.port))
            assert not connected(late[0], 0.3), "a connection got in while accepts were held"
            listener.stop()  # a guard stopped (the socket stays open) holds nothing back
            assert connected(late[0], WAIT), "the connection held after stop()"
    finally:
        for sock in late:
            sock.close()
        known.close()
        listener.close()
