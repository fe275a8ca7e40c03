#!/usr/bin/env python3
"""Benchmark peermesh against raw pyzmq (and pyre, when installed), in one run.

Every figure comes from processes started by this run, on loopback only
(127.0.0.1, beacons to 127.255.255.255 on a free, non-default UDP port that
each test picks afresh), with 100-byte payloads:

1. one-way throughput, two processes: raw pyzmq DEALER->ROUTER (one frame)
   vs peermesh WHISPER (gevent ``Node`` -> ``Node``, every message a ZRE
   WHISPER delivered as its own event) vs pyre -> pyre; plus ``ThreadedNode``
   (whispering from a plain thread) -> ``Node``;
2. round-trip latency, two processes: raw DEALER<->ROUTER echo vs peermesh
   whisper / whisper-back vs pyre;
3. start -> first ENTER with a peer already running in another process;
4. ``import peermesh`` in a fresh interpreter, and the CPU and RSS of an idle
   node with one peer.

The raw and peermesh tests run ``--repeat`` interleaved rounds; medians are
shown and each ratio is the median of the per-round ratios. ``--baseline REV``
adds an older commit's peermesh to those rounds (and to the ThreadedNode row).
Processes, CPU readers and the table come from ``harness.py``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time
from typing import Any, Callable, Optional

import harness
from harness import (INTERFACE, LO_BROADCAST, LOOPBACK, REPO, Children, Parent, busy_pct,
                     c_extension, cpu, dump_json, fmt, free_udp_port, interleaved, median_run,
                     percentile, progress, ratio, round_ratios, rss_mb, table, trees, verdict)

PAYLOAD = 100
_PACK = struct.Struct(">Q")
_TAIL = b"x" * (PAYLOAD - _PACK.size)
now = time.perf_counter

TARGETS = {
    "throughput_ratio": 0.60,   # peermesh / raw, at least
    "latency_p50_ratio": 1.5,   # peermesh / raw, at most
    "enter_ms": 5.0,            # at most
    "import_ms": 150.0,         # at most
    "idle_cpu_pct": 0.1,        # at most
    "idle_rss_mb": 25.0,        # at most
    "metrics_ratio": 0.97,      # throughput with --metrics / without, at least
}


def _payload(i: int) -> bytes:
    return _PACK.pack(i) + _TAIL


def _check_last(last: bytes, n: int, what: str) -> None:
    if len(last) != PAYLOAD or _PACK.unpack_from(last)[0] != n - 1:
        raise RuntimeError(f"{what}: last message is not message {n - 1} of 100 bytes "
                           f"(got {len(last)} bytes, counter {_PACK.unpack_from(last)[0]})")


def _latency_stats(samples_ns: list[int], cpu_s: float) -> dict[str, float]:
    us = sorted(s / 1000.0 for s in samples_ns)
    return {"round_trips": len(us), "ping_cpu_us": cpu_s / len(us) * 1e6,
            "p50_us": percentile(us, 50), "p90_us": percentile(us, 90),
            "p99_us": percentile(us, 99), "min_us": us[0], "mean_us": statistics.fmean(us),
            "round_trips_per_s": 1e6 / statistics.fmean(us)}


def _proc_net_bound(kind: str, port: int) -> list[str]:
    """Local IPv4 addresses of sockets bound to ``port`` in /proc/net/{udp,tcp}."""
    out = []
    with open(f"/proc/net/{kind}") as f:
        next(f)
        for line in f:
            local = line.split()[1]
            ip_hex, port_hex = local.split(":")
            if int(port_hex, 16) == port:
                out.append(socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16))))
    return out


# ---------------------------------------------------------------------------
# backends: one adapter each (raw pyzmq, peermesh, pyre); the roles below are written once

#: every wait in a role is bounded by this (seconds)
WAIT = 15.0


class Stalled(RuntimeError):
    """No message within ``WAIT``, or the peer left."""


class Backend:
    """How one implementation joins, meets its peer, and moves 100-byte messages.

    ``receive()`` returns the next message (waiting at most ``WAIT``, else
    ``Stalled``), ``payload(message)`` its bytes, ``echo(message)`` sends it
    back to its sender and ``sender(peer)`` is a send of one argument.
    ``ready`` is what the role's "ready" carries, ``report`` what its result
    adds; ``green``: the parent's waits let the gevent hub run (a gevent node
    keeps sending meanwhile).
    """

    label = ""
    green = False
    ready: Any = None
    report: dict[str, Any] = {}

    def meet(self) -> Any:
        """Wait until the peer is there (before "ready"); the peer to send to."""

    def begin(self) -> None:
        """What comes after "ready" and before the first message that counts."""

    def sender(self, peer: Any) -> Callable[[bytes], Any]:
        raise NotImplementedError

    def receive(self) -> Any:
        raise NotImplementedError

    def payload(self, message: Any) -> bytes:
        raise NotImplementedError

    def echo(self, message: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RawBackend(Backend):
    """Raw pyzmq: a ROUTER that binds (sink, echo: ``ready`` is its port) or a DEALER
    connected to ``port`` (source, ping). ``each_way``: answers go on a connection of
    their own (ZRE's shape), to the endpoint the pinger's first message names."""

    label = "raw"

    def __init__(self, role: str, port: Optional[int] = None, each_way: bool = False) -> None:
        import zmq
        self._zmq = zmq
        self._ctx = zmq.Context()
        self._sockets: list[Any] = []
        self._each_way = each_way
        self._reply: Any = None
        if port is None:
            self._sock = self._socket(zmq.ROUTER)
            self.ready = self._sock.bind_to_random_port(f"tcp://{LOOPBACK}")
        else:
            self._sock = self._socket(zmq.DEALER)
            self._sock.connect(f"tcp://{LOOPBACK}:{port}")
        self.receive = self._receiver(self._sock)  # type: ignore[method-assign]

    def _socket(self, kind: int) -> Any:
        zmq = self._zmq
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, int(WAIT * 1000))  # every wait bounded: zmq.Again
        sock.setsockopt(zmq.SNDTIMEO, int(WAIT * 1000))
        self._sockets.append(sock)
        return sock

    def _receiver(self, sock: Any) -> Callable[[], Any]:
        """``receive`` on ``sock``: (first frame, last frame) of the next message."""
        recv, again = sock.recv, self._zmq.Again

        def receive() -> Any:   # (RCVTIMEO bounds each wait)
            try:
                first = frame = recv(copy=False)
                while frame.more:
                    frame = recv(copy=False)
            except again:
                raise Stalled(f"nothing for {WAIT:g} s") from None
            return first, frame
        return receive

    def meet(self) -> Any:
        if self._each_way and self.ready is None:   # the pinger: answers come to a ROUTER
            inbox = self._socket(self._zmq.ROUTER)
            port = inbox.bind_to_random_port(f"tcp://{LOOPBACK}")
            self._sock.send(f"tcp://{LOOPBACK}:{port}".encode())
            self.receive = self._receiver(inbox)  # type: ignore[method-assign]
        return None

    def begin(self) -> None:
        if self._each_way and self.ready is not None:   # the echo: where answers go
            self._reply = self._socket(self._zmq.DEALER)
            self._reply.connect(self.payload(self.receive()).decode())

    def sender(self, peer: Any) -> Callable[[bytes], Any]:
        return self._sock.send

    def payload(self, message: Any) -> bytes:
        return bytes(message[1].bytes)

    def echo(self, message: Any) -> None:
        if self._reply is not None:
            self._reply.send(message[1], copy=False)
        else:
            self._sock.send(message[0], self._zmq.SNDMORE, copy=False)
            self._sock.send(message[1], copy=False)

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def _pm_node(name: str, beacon_port: int, threaded: bool = False) -> Any:
    from peermesh import Node, ThreadedNode
    cls = ThreadedNode if threaded else Node
    return cls(name, interface=INTERFACE, port=beacon_port).start()


#: what scrapes a node's metrics once a second in ``--metrics`` runs: a process of its own,
#: as a Prometheus server on the same host would be
_SCRAPER = """
import sys, time, urllib.request
while True:
    time.sleep(1.0)
    with urllib.request.urlopen(sys.argv[1], timeout=30) as answer:
        answer.read()
"""


def _serve_metrics(node: Any) -> Callable[[], None]:
    """Serve ``node``'s Prometheus metrics on loopback, scraped once a second by another
    process (``--metrics``); returns what stops both."""
    from peermesh.metrics import MetricsServer

    server = MetricsServer(node).start("127.0.0.1:0")
    scraper = subprocess.Popen([sys.executable, "-c", _SCRAPER, server.url],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def stop() -> None:
        scraper.kill()
        scraper.wait()
        server.close()
    return stop


def _pm_wait_enter(node: Any, timeout: float) -> Any:
    from peermesh import EventType
    deadline = now() + timeout
    while True:
        remaining = deadline - now()
        if remaining <= 0:
            raise TimeoutError(f"no ENTER within {timeout} s")
        event = node.recv(remaining)
        if event is not None and event.type is EventType.ENTER:
            return event


class PeermeshBackend(Backend):
    """A peermesh ``Node`` (``threaded``: a ``ThreadedNode``, used from this thread) on
    beacon port ``beacon_port``; ``metrics``: it serves Prometheus metrics, scraped every
    second. A message is a WHISPER event."""

    label = "peermesh"

    def __init__(self, role: str, beacon_port: int, threaded: bool = False,
                 metrics: bool = False) -> None:
        from peermesh import EventType
        self._whisper_type, self._exit_type = EventType.WHISPER, EventType.EXIT
        self.node = _pm_node(f"bench-{role}", beacon_port, threaded)
        self.green = not threaded
        self._stop_metrics = _serve_metrics(self.node) if metrics else None

    def meet(self) -> Any:
        return _pm_wait_enter(self.node, WAIT).peer

    def sender(self, peer: Any) -> Callable[[bytes], Any]:
        return functools.partial(self.node.whisper, peer)

    def receive(self) -> Any:
        recv, whisper, exit_ = self.node.recv, self._whisper_type, self._exit_type
        while True:
            event = recv(WAIT)
            if event is None:
                raise Stalled(f"no event for {WAIT:g} s")
            if event.type is whisper:
                return event
            if event.type is exit_:
                raise Stalled(f"the peer exited: {event.reason}")

    def payload(self, message: Any) -> bytes:
        if len(message.frames) != 1:
            raise RuntimeError(f"a WHISPER event carried {len(message.frames)} frames, not 1")
        return bytes(message.frames[0])

    def echo(self, message: Any) -> None:
        self.node.whisper(message.peer, *message.frames)

    def close(self) -> None:
        if self._stop_metrics is not None:
            self._stop_metrics()
        self.node.stop(0.5)


# --- pyre ------------------------------------------------------------------

def _pyre_on_loopback() -> None:
    """Confine zeromq-pyre 0.3.4 to loopback.

    pyre ignores ``set_interface`` (a no-op in 0.3.4) and ZSYS_INTERFACE; its
    ZBeacon._prepare_socket takes the first non-loopback interface, and the
    node binds its mailbox to ``tcp://*``. Here, in this benchmark child only,
    the beacon is given 127.0.0.1 / 127.255.255.255 (on Linux it then binds
    its UDP socket to 127.255.255.255:port and sends there) and the mailbox
    bind is narrowed to 127.0.0.1.
    """
    import ipaddress
    import zmq
    from pyre import zbeacon

    def _prepare_socket(self: Any) -> None:
        self.address = ipaddress.IPv4Address(LOOPBACK)
        self.network_address = ipaddress.IPv4Address("127.0.0.0")
        self.broadcast_address = ipaddress.IPv4Address(LO_BROADCAST)
        self.interface_name = "lo"

    zbeacon.ZBeacon._prepare_socket = _prepare_socket
    original = zmq.Socket.bind_to_random_port

    def bind_to_random_port(self: Any, addr: str, *args: Any, **kwargs: Any) -> int:
        if addr == "tcp://*":
            addr = f"tcp://{LOOPBACK}"
        return original(self, addr, *args, **kwargs)

    zmq.Socket.bind_to_random_port = bind_to_random_port  # type: ignore[method-assign]


def _pyre_node(name: str, beacon_port: int) -> Any:
    _pyre_on_loopback()
    from pyre import Pyre
    node = Pyre(name)
    node.set_port(str(beacon_port).encode())
    node.start()
    endpoint = node.endpoint()
    if not endpoint.startswith(f"tcp://{LOOPBACK}:"):
        raise RuntimeError(f"pyre is not on loopback: endpoint {endpoint}")
    udp = set(_proc_net_bound("udp", beacon_port))
    if udp - {LO_BROADCAST, "0.0.0.0"}:
        raise RuntimeError(f"pyre beacon bound to {udp}")
    return node


class PyreBackend(Backend):
    """A pyre node, confined to loopback (``_pyre_on_loopback``); ``ready`` and ``report``
    show where it is bound. A message is a WHISPER's parts."""

    label = "pyre"

    def __init__(self, role: str, beacon_port: int) -> None:
        self.node = _pyre_node(f"pyre-{role}", beacon_port)
        self._beacon_port = beacon_port

    def meet(self) -> Any:
        import uuid
        deadline = now() + WAIT
        poll, recv = self.node.socket().poll, self.node.recv
        while True:
            remaining = deadline - now()
            if remaining <= 0:
                raise TimeoutError(f"pyre: no ENTER within {WAIT:g} s")
            parts = recv() if poll(int(remaining * 1000)) else None
            if parts and parts[0] == b"ENTER":
                break
        self.ready = {"endpoint": self.node.endpoint(),
                      "udp_bound": sorted(set(_proc_net_bound("udp", self._beacon_port)))}
        self.report = {"loopback": self.ready}
        return uuid.UUID(bytes=parts[1])

    def sender(self, peer: Any) -> Callable[[bytes], Any]:
        return functools.partial(self.node.whisper, peer)

    def receive(self) -> Any:
        poll, recv = self.node.socket().poll, self.node.recv
        while True:
            if not poll(int(WAIT * 1000)):
                raise Stalled(f"pyre: no event for {WAIT:g} s (its sender drops the link "
                              "when its 3,000-message queue fills)")
            parts = recv()
            if parts[0] == b"WHISPER":
                return parts
            if parts[0] == b"EXIT":
                raise Stalled("pyre: the peer exited")

    def payload(self, message: Any) -> bytes:
        return bytes(message[3])

    def echo(self, message: Any) -> None:
        import uuid
        self.node.whisper(uuid.UUID(bytes=message[1]), message[3])


BACKENDS: dict[str, Callable[..., Backend]] = {
    "raw": RawBackend, "pm": PeermeshBackend, "pyre": PyreBackend}


# ---------------------------------------------------------------------------
# roles: each runs in a child process of its own (harness.Children.start), on the backend
# named ``backend`` (raw, pm, pyre), made with ``where`` (see its adapter)

def role_sink(parent: Parent, backend: str, n: int, **where: Any) -> dict[str, Any]:
    """Receive ``n`` messages; the rate from the first to the last."""
    with BACKENDS[backend]("sink", **where) as mesh:
        mesh.meet()
        parent.send("ready", mesh.ready)
        mesh.begin()
        receive = mesh.receive
        count = 0
        try:
            message = receive()
            t0, c0 = now(), cpu()
            for count in range(1, n):
                message = receive()
        except Stalled as exc:
            raise RuntimeError(f"{mesh.label} sink: {exc} after {count} of {n} WHISPERs")
        t1, c1 = now(), cpu()
        _check_last(mesh.payload(message), n, f"{mesh.label} sink")
        return {"messages": n, "seconds": t1 - t0, "rate": (n - 1) / (t1 - t0),
                "rx_cpu_us": (c1 - c0) / (n - 1) * 1e6, **mesh.report}


def _send_numbered(send: Callable[[bytes], Any], n: int,
                   until_stop: Callable[[], None]) -> dict[str, Any]:
    """Send ``n`` numbered payloads, then wait for "stop": send time and CPU per message."""
    pack, tail = _PACK.pack, _TAIL
    t0, c0 = now(), cpu()
    for i in range(n):
        send(pack(i) + tail)
    t1 = now()
    until_stop()
    return {"send_seconds": t1 - t0, "tx_cpu_us": (cpu() - c0) / n * 1e6}


def role_source(parent: Parent, backend: str, n: int, **where: Any) -> dict[str, Any]:
    """Send ``n`` messages on "go" (a gevent node flushes its backlog until "stop")."""
    with BACKENDS[backend]("source", **where) as mesh:
        send = mesh.sender(mesh.meet())
        parent.send("ready", mesh.ready)
        mesh.begin()
        parent.expect("go", 60, green=mesh.green)
        return _send_numbered(send, n, lambda: parent.expect("stop", 600, green=mesh.green))


def role_echo(parent: Parent, backend: str, total: int, **where: Any) -> dict[str, Any]:
    """Send each of ``total`` messages back to its sender."""
    with BACKENDS[backend]("echo", **where) as mesh:
        mesh.meet()
        parent.send("ready", mesh.ready)
        mesh.begin()
        receive, echo = mesh.receive, mesh.echo
        c0 = 0.0
        count = 0
        try:
            for count in range(total):
                message = receive()
                if count == 0:
                    c0 = cpu()
                echo(message)
        except Stalled as exc:
            raise RuntimeError(f"{mesh.label} echo: {exc} after {count} echoes")
        c1 = cpu()
        parent.expect("stop", 60, green=mesh.green)
        return {"echo_cpu_us": (c1 - c0) / max(1, total - 1) * 1e6}


def role_ping(parent: Parent, backend: str, n: int, warmup: int,
              **where: Any) -> dict[str, Any]:
    """On "go", ``warmup`` then ``n`` measured round trips: send, wait for the echo."""
    with BACKENDS[backend]("ping", **where) as mesh:
        send = mesh.sender(mesh.meet())
        parent.send("ready", mesh.ready)
        mesh.begin()
        parent.expect("go", 60, green=mesh.green)
        receive, clock = mesh.receive, time.perf_counter_ns
        samples = []
        message = None
        c0 = cpu()
        for i in range(warmup + n):
            payload = _payload(i)
            t = clock()
            send(payload)
            try:
                message = receive()
            except Stalled as exc:
                raise RuntimeError(f"{mesh.label} ping: {exc} (round trip {i})")
            dt = clock() - t
            if i >= warmup:
                samples.append(dt)
            elif i == warmup - 1:
                c0 = cpu()
        _check_last(mesh.payload(message), warmup + n, f"{mesh.label} ping")
        return _latency_stats(samples, cpu() - c0)


def role_peer(parent: Parent, backend: str, **where: Any) -> dict[str, Any]:
    """A peer that just stays up (and idle) until told to stop; reports its idle cost."""
    with BACKENDS[backend]("peer", **where) as mesh:
        parent.send("ready")
        t0, c0 = now(), cpu()
        parent.expect("stop", 600, green=mesh.green)
        t1, c1 = now(), cpu()
        return {"cpu_pct": (c1 - c0) / (t1 - t0) * 100.0, "rss_mb": rss_mb()}


#: the roles above, also as ``role_<backend>_<role>`` (``raw_ping``, ``pm_peer``, ...)
ROLES: dict[str, Callable[..., dict[str, Any]]] = {
    "sink": role_sink, "source": role_source, "echo": role_echo, "ping": role_ping,
    "peer": role_peer}


def __getattr__(name: str) -> Any:
    backend, _, role = name.removeprefix("role_").partition("_")
    if name.startswith("role_") and backend in BACKENDS and role in ROLES:
        return functools.partial(ROLES[role], backend=backend)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def role_pm_enter_probe(parent: Parent, beacon_port: int, tries: int) -> dict[str, Any]:
    """Start fresh nodes next to a running peer; time start() and start()->first ENTER."""
    import gevent
    from peermesh import Node, ThreadedNode
    out: dict[str, Any] = {}
    for label, cls in (("node", Node), ("threaded", ThreadedNode)):
        start_ms, enter_ms = [], []
        for k in range(tries):
            node = cls(f"probe-{label}-{k}", interface=INTERFACE, port=beacon_port)
            a = now()
            node.start()
            b = now()
            try:
                _pm_wait_enter(node, 5)
                c = now()
            finally:
                node.stop(0.2)
            start_ms.append((b - a) * 1e3)
            enter_ms.append((c - b) * 1e3)
            gevent.sleep(0.15)  # let the peer see our port-0 beacon before the next try
        out[label] = {"enter_ms": enter_ms, "start_ms": start_ms,
                      "enter_ms_median": statistics.median(enter_ms),
                      "start_ms_median": statistics.median(start_ms)}
    return out


# ---------------------------------------------------------------------------
# tests: each starts its processes and ends them all

def _result_timeout(n: int) -> float:
    return 30.0 + n / 2000.0  # even at 2,000 msg/s a run ends in time


def _profile(profile_dir: Optional[str], name: str) -> dict[str, str]:
    return {"_profile": os.path.join(profile_dir, f"{name}.prof")} if profile_dir else {}


def bench_throughput(kind: str, n: int, code: Optional[str] = None,
                     profile_dir: Optional[str] = None, metrics: bool = False) -> dict[str, Any]:
    """``kind``: raw, peermesh, threaded or pyre; peermesh from ``code``; ``metrics``: both
    peermesh nodes serve Prometheus metrics, scraped every second."""
    backend, source_where = {"raw": ("raw", {}), "peermesh": ("pm", {}),
                             "threaded": ("pm", {"threaded": True}),
                             "pyre": ("pyre", {})}[kind]
    with Children() as kids:
        if kind == "raw":
            sink = kids.start("bench_mesh", "sink", backend=backend, n=n)
            source = kids.start("bench_mesh", "source", backend=backend,
                                port=sink.expect("ready", 30), n=n)
            extra: dict[str, Any] = {}
        else:
            bp = free_udp_port()
            served = {"metrics": True} if metrics else {}
            sink = kids.start("bench_mesh", "sink", code, backend=backend, beacon_port=bp, n=n,
                              **served, **_profile(profile_dir, "sink"))
            source = kids.start("bench_mesh", "source", code, backend=backend, beacon_port=bp,
                                n=n, **source_where, **served, **_profile(profile_dir, "source"))
            extra = {"beacon_port": bp}
            check = sink.expect("ready", 30)
            if check:
                extra["pyre_loopback"] = check
        source.expect("ready", 30)
        source.send("go")
        rx = sink.expect("result", _result_timeout(n))
        source.send("stop")
        tx = source.expect("result", 30)
    progress(f"  {rx['rate']:,.0f} msg/s (rx {rx['rx_cpu_us']:.1f} us CPU/msg, "
             f"tx {tx['tx_cpu_us']:.1f} us CPU/msg)")
    return {**rx, **tx, **extra}


def bench_latency(kind: str, n: int, warmup: int, code: Optional[str] = None,
                  profile_dir: Optional[str] = None) -> dict[str, Any]:
    """``kind``: raw, raw_each_way, peermesh or pyre; peermesh from ``code``."""
    total = n + warmup
    with Children() as kids:
        if kind in ("raw", "raw_each_way"):
            each_way = kind == "raw_each_way"
            echo = kids.start("bench_mesh", "echo", backend="raw", total=total,
                              each_way=each_way)
            port = echo.expect("ready", 30)
            ping = kids.start("bench_mesh", "ping", backend="raw", port=port, n=n,
                              warmup=warmup, each_way=each_way)
        else:
            bp = free_udp_port()
            backend = "pm" if kind == "peermesh" else "pyre"
            echo = kids.start("bench_mesh", "echo", code, backend=backend, beacon_port=bp,
                              total=total, **_profile(profile_dir, "echo"))
            ping = kids.start("bench_mesh", "ping", code, backend=backend, beacon_port=bp, n=n,
                              warmup=warmup, **_profile(profile_dir, "ping"))
            echo.expect("ready", 30)
        ping.expect("ready", 30)
        other = busy_pct(0.3)  # both processes wait for "go": any CPU use is other work
        ping.send("go")
        result = ping.expect("result", 30 + total / 200.0)
        echo.send("stop")
        result.update(echo.expect("result", 15), other_cpu_pct=other)
    progress(f"  p50 {result['p50_us']:.0f} us, p99 {result['p99_us']:.0f} us (CPU per round "
             f"trip: ping {result['ping_cpu_us']:.0f} us, echo {result['echo_cpu_us']:.0f} us)")
    return result


def bench_enter(tries: int) -> dict[str, Any]:
    bp = free_udp_port()
    with Children() as kids:
        kids.start("bench_mesh", "peer", backend="pm", beacon_port=bp).expect("ready", 30)
        time.sleep(0.3)  # the peer is up and beaconing
        probe = kids.start("bench_mesh", "pm_enter_probe", beacon_port=bp, tries=tries)
        return probe.expect("result", 30 + tries * 12)


def _bare_env() -> dict[str, str]:
    """No PYTHON* variables but the path to this checkout's peermesh."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return {**env, "PYTHONPATH": REPO}


def bench_import(runs: int) -> dict[str, Any]:
    # peermesh imports its names lazily, so time what a program needs to
    # make a node: the package plus Node (gevent, pyzmq, msgpack, the node)
    code = ("import time; t = time.perf_counter(); from peermesh import Node; "
            "print(time.perf_counter() - t)")
    times = []
    env = _bare_env()
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60, env=env, check=True)
        times.append(float(out.stdout.strip()) * 1e3)
    # where the time goes: the first import of each top-level package outside
    # peermesh carries its whole cost (cumulative), from one -X importtime run
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "from peermesh import Node"],
                         capture_output=True, text=True, timeout=60, env=env, check=True)
    top = []
    for line in out.stderr.splitlines():
        fields = line.split("|")
        if len(fields) != 3 or not line.startswith("import time:"):
            continue
        name = fields[2].strip()
        try:
            cumulative_ms = int(fields[1]) / 1e3
        except ValueError:
            continue
        if "." not in name and not name.startswith("peermesh"):
            top.append((cumulative_ms, name))
    top.sort(reverse=True)
    return {"import_ms": times, "import_ms_median": statistics.median(times),
            "heaviest_packages_ms": [[round(ms, 1), name] for ms, name in top[:8]]}
# The idle node runs in a minimal interpreter (not a harness child, whose
# own imports would inflate RSS): just the library, one node, one peer elsewhere.
_IDLE_SCRIPT = r"""
import glob, json, os, resource, sys, time
from typing import Any
kind, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
LOOPBACK, LO_BROADCAST = "127.0.0.1", "127.255.255.255"

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0

def wakeups():  # voluntary context switches of every thread: each is one sleep -> wake
    total = 0
    for path in glob.glob("/proc/self/task/*/status"):
        with open(path) as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total

rss_bare = rss()
deadline = time.monotonic() + 15
if kind == "peermesh":
    import gevent
    from peermesh import EventType, Node
    rss_import = rss()
    node = Node("bench-idle", interface="lo", port=port).start()
    while True:
        ev = node.recv(max(0.01, deadline - time.monotonic()))
        if ev is not None and ev.type is EventType.ENTER:
            break
        if time.monotonic() > deadline:
            raise SystemExit("no ENTER within 15 s")
    sleep = gevent.sleep
else:
%(pyre_patch)s
    _pyre_on_loopback()
    from pyre import Pyre
    rss_import = rss()
    node = Pyre("pyre-idle")
    node.set_port(str(port).encode())
    node.start()
    while True:
        if node.socket().poll(100) and node.recv()[0] == b"ENTER":
            break
        if time.monotonic() > deadline:
            raise SystemExit("no ENTER within 15 s")
    sleep = time.sleep
sleep(1.0)  # settle: HELLO, first beacons
c0, w0, t0 = cpu(), wakeups(), time.perf_counter()
sleep(seconds)
c1, w1, t1 = cpu(), wakeups(), time.perf_counter()
print(json.dumps({"cpu_pct": (c1 - c0) / (t1 - t0) * 100.0, "cpu_ms": (c1 - c0) * 1e3,
                  "seconds": t1 - t0, "wakeups_per_s": (w1 - w0) / (t1 - t0),
                  "cpu_us_per_wakeup": (c1 - c0) / max(1, w1 - w0) * 1e6,
                  "rss_mb": rss(), "rss_interpreter_mb": rss_bare,
                  "rss_after_import_mb": rss_import}))
sys.stdout.flush()
os._exit(0)
"""


def _idle_script() -> str:
    import inspect
    import textwrap
    patch = textwrap.indent(inspect.getsource(_pyre_on_loopback), "    ")
    return _IDLE_SCRIPT % {"pyre_patch": patch}


def _run_idle(kids: Children, kind: str, beacon_port: int, seconds: float, base: dict[str, str],
              no_site: bool = False) -> "subprocess.Popen[str]":
    """The idle child, in environment ``base``; ``no_site``: ``python -S`` (no ``.pth``
    files run) with the same path."""
    flags, env = [], dict(base)
    if no_site:
        import peermesh
        import site
        root = os.path.dirname(os.path.dirname(os.path.abspath(peermesh.__file__)))
        flags, env = ["-S"], dict(base, PYTHONPATH=os.pathsep.join([root, *site.getsitepackages()]))
    return kids.popen([sys.executable, *flags, "-c", _idle_script(), kind, str(beacon_port),
                       str(seconds)], env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True).process


def _compile_package() -> None:
    """Compile peermesh's modules (into their ``__pycache__``), as installing it does.

    The library's dependencies come with their bytecode; a checkout run with
    ``PYTHONDONTWRITEBYTECODE`` would compile peermesh at every start, and the
    compiler's memory would count as the node's."""
    import peermesh
    subprocess.run([sys.executable, "-m", "compileall", "-q",
                    os.path.dirname(os.path.abspath(peermesh.__file__))],
                   check=True, timeout=120, stdout=subprocess.DEVNULL)


def _finish_idle(proc: "subprocess.Popen[str]", timeout: float) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"idle node failed (exit {proc.returncode}): {err.strip()[-800:]}")
    return json.loads(out.strip().splitlines()[-1])


def bench_idle(seconds: float, with_pyre: bool) -> dict[str, Any]:
    """An idle node with one peer, in a minimal interpreter; pyre alongside (both idle)."""
    _compile_package()
    base = dict(os.environ)
    with Children() as kids:
        bp = free_udp_port()
        kids.start("bench_mesh", "peer", backend="pm", beacon_port=bp).expect("ready", 30)
        procs = [("peermesh", _run_idle(kids, "peermesh", bp, seconds, base))]
        # Site .pth files run in every interpreter (on this VM one loads certifi,
        # ~4 MB): the same node without them shows what peermesh itself costs.
        bp3 = free_udp_port()
        kids.start("bench_mesh", "peer", backend="pm", beacon_port=bp3).expect("ready", 30)
        procs.append(("peermesh_no_site", _run_idle(kids, "peermesh", bp3, seconds, base, True)))
        if with_pyre:  # idle processes: measuring both at once disturbs neither
            bp2 = free_udp_port()
            kids.start("bench_mesh", "peer", backend="pyre", beacon_port=bp2).expect("ready", 30)
            procs.append(("pyre", _run_idle(kids, "pyre", bp2, seconds, base)))
        result: dict[str, Any] = {}
        for kind, proc in procs:
            try:
                result[kind] = _finish_idle(proc, seconds + 40)
            except Exception as exc:
                if kind == "peermesh":
                    raise
                result[kind] = {"error": str(exc)}
        return result


def pyre_available() -> tuple[bool, str]:
    try:
        from importlib.metadata import version
        v = version("zeromq-pyre")
    except Exception:
        return False, "zeromq-pyre is not installed"
    return True, f"zeromq-pyre {v}"


# ---------------------------------------------------------------------------
# report

def _get(results: dict[str, Any], *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def render(r: dict[str, Any]) -> str:
    base = "baseline" in r["meta"]
    head = ["measure", "raw pyzmq", "peermesh", *(["baseline"] if base else []), "pyre",
            "pm/raw", "target", "pm/pyre", *(["pm/base"] if base else [])]
    rows: list[list[Any]] = []

    def row(label: str, raw: Any, pm: Any, pyre: Any, pm_raw: Any = None, target: str = "",
            pm_pyre: Any = None, baseline: Any = None, pm_base: Any = None) -> None:
        if raw is None and pm is None and pyre is None:
            return  # that test was not run (or failed: see the errors below)
        cells = [label, raw, pm, *([baseline] if base else []), pyre,
                 "" if pm_raw is None else pm_raw, target, "" if pm_pyre is None else pm_pyre,
                 *(["" if pm_base is None else pm_base] if base else [])]
        rows.append(cells)

    def three(section: str, key: str) -> list[Any]:
        return [_get(r, section, k, key) for k in ("raw", "peermesh", "pyre")]

    def vs_base(section: str, key: str, median_ratio: str = "") -> dict[str, Any]:
        value = _get(r, section, "baseline", key)
        pm_base = _get(r, section, median_ratio) if median_ratio else None
        return {"baseline": value,
                "pm_base": pm_base if pm_base is not None
                else ratio(_get(r, section, "peermesh", key), value)}

    tr, tp, ty = three("throughput", "rate")
    pm_raw = _get(r, "throughput", "ratio_peermesh_raw") or ratio(tp, tr)
    row("one-way throughput, msg/s", tr, tp, ty, pm_raw,
        verdict(pm_raw, TARGETS["throughput_ratio"], True), ratio(tp, ty),
        **vs_base("throughput", "rate", "ratio_peermesh_baseline"))
    row("  receiver CPU, us/msg", *three("throughput", "rx_cpu_us"),
        **vs_base("throughput", "rx_cpu_us"))
    row("  sender CPU, us/msg", *three("throughput", "tx_cpu_us"),
        **vs_base("throughput", "tx_cpu_us"))
    tm = _get(r, "throughput", "metrics", "rate")
    if tm is not None:
        m_pm = _get(r, "throughput", "ratio_metrics_peermesh") or ratio(tm, tp)
        row("  with --metrics (scraped 1/s), msg/s", None, tm, None,
            target=f"{m_pm:.3f}x peermesh {verdict(m_pm, TARGETS['metrics_ratio'], True)}"
            if m_pm is not None else "")
        row("    receiver / sender CPU, us/msg", None,
            f"{fmt(_get(r, 'throughput', 'metrics', 'rx_cpu_us'))} / "
            f"{fmt(_get(r, 'throughput', 'metrics', 'tx_cpu_us'))}", None)
    tt = _get(r, "throughput", "threaded", "rate")
    tb = _get(r, "throughput", "threaded_baseline", "rate")
    row("ThreadedNode->Node, msg/s", None, tt, None, ratio(tt, tr), baseline=tb,
        pm_base=ratio(tt, tb))
    row("  ThreadedNode sender CPU, us/msg", None,
        _get(r, "throughput", "threaded", "tx_cpu_us"), None,
        baseline=_get(r, "throughput", "threaded_baseline", "tx_cpu_us"))
    lr, lp, ly = three("latency", "p50_us")
    pm_raw = _get(r, "latency", "ratio_p50_peermesh_raw") or ratio(lp, lr)
    row("round trip p50, us", lr, lp, ly, pm_raw,
        verdict(pm_raw, TARGETS["latency_p50_ratio"], False), ratio(lp, ly),
        **vs_base("latency", "p50_us", "ratio_p50_peermesh_baseline"))
    row("  raw with a connection each way (ZRE's shape), p50 us",
        _get(r, "latency", "raw_each_way", "p50_us"), lp, None,
        _get(r, "latency", "ratio_p50_peermesh_raw_each_way"))
    lr9, lp9, ly9 = three("latency", "p99_us")
    row("round trip p99, us", lr9, lp9, ly9, ratio(lp9, lr9), "", ratio(lp9, ly9),
        **vs_base("latency", "p99_us"))
    c1, c2, c3 = three("latency", "ping_cpu_us")
    row("  CPU per round trip (pinger), us", c1, c2, c3, ratio(c2, c1), "", ratio(c2, c3),
        **vs_base("latency", "ping_cpu_us"))
    o1, o2, o3 = three("latency", "other_cpu_pct")
    row("  other work on the machine, % of a core", o1, o2, o3,
        baseline=_get(r, "latency", "baseline", "other_cpu_pct"))
    em = _get(r, "enter", "node", "enter_ms_median")
    row("start->first ENTER, ms (median)", None, em, None, None,
        verdict(em, TARGETS["enter_ms"], False))
    row("  ThreadedNode start->ENTER, ms", None, _get(r, "enter", "threaded", "enter_ms_median"),
        None)
    row("  start() itself, ms (median)", None, _get(r, "enter", "node", "start_ms_median"), None)
    im = _get(r, "import", "import_ms_median")
    row("import peermesh (with Node), ms", None, im, None, None,
        verdict(im, TARGETS["import_ms"], False))
    ic, yc = _get(r, "idle", "peermesh", "cpu_pct"), _get(r, "idle", "pyre", "cpu_pct")
    row("idle node + 1 peer, CPU %", None, ic, yc, None,
        verdict(ic, TARGETS["idle_cpu_pct"], False))
    for label, key in (("  wakeups per second", "wakeups_per_s"),
                       ("  CPU per wakeup, us", "cpu_us_per_wakeup")):
        row(label, None, _get(r, "idle", "peermesh", key), _get(r, "idle", "pyre", key))
    irss, yrss = _get(r, "idle", "peermesh", "rss_mb"), _get(r, "idle", "pyre", "rss_mb")
    row("idle node + 1 peer, RSS MB", None, irss, yrss, None,
        verdict(irss, TARGETS["idle_rss_mb"], False))
    for label, key in (("  interpreter alone, RSS MB", "rss_interpreter_mb"),
                       ("  after import, RSS MB", "rss_after_import_mb")):
        row(label, None, _get(r, "idle", "peermesh", key), _get(r, "idle", "pyre", key))
    row("  without site .pth files (-S), RSS MB", None,
        _get(r, "idle", "peermesh_no_site", "rss_mb"), None)
    row("    interpreter alone (-S), RSS MB", None,
        _get(r, "idle", "peermesh_no_site", "rss_interpreter_mb"), None)

    meta = r["meta"]
    lines = [
        f"peermesh benchmark: {PAYLOAD}-byte payloads, loopback only; one way "
        f"{meta['messages']:,} messages (pyre {meta['pyre_messages']:,}, ThreadedNode "
        f"{meta['threaded_messages']:,}); {meta['round_trips']:,} round trips after "
        f"{meta['warmup']:,} warm-up",
        f"raw and peermesh{' and baseline' if base else ''}: median of {meta['repeat']} "
        "interleaved rounds, pm/raw (and pm/base) = median of the per-round ratios; pyre and "
        "ThreadedNode: one round",
        f"python {meta['python']}, pyzmq {meta['pyzmq']} (libzmq {meta['libzmq']}), "
        f"gevent {meta['gevent']}, {meta['pyre']}, {meta['cpus']} CPUs, load {meta['loadavg']}",
        f"peermesh's C extension (batched ZeroMQ I/O): {meta['c_extension']}"]
    if base:
        lines.append(f"baseline: {meta['baseline']} (C extension: {meta['baseline_c_extension']})")
    lines.append("")
    if rows:
        lines += table(head, rows)
    errors = r.get("errors") or {}
    if errors:
        lines.append("")
        for name, err in errors.items():
            text = err.strip().splitlines()
            lines.append(f"error in {name}: {text[-1] if text else err}")
    if meta.get("pyre_note"):
        lines.append(f"pyre: {meta['pyre_note']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------

SECTIONS = ("throughput", "threaded", "latency", "enter", "import", "idle")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_mesh.py",
        description="Measure peermesh against raw pyzmq (and pyre if installed) in one run, "
                    "on loopback only, and print a table with ratios against the targets "
                    "of issue 2 (throughput >= 0.60x raw, round-trip p50 <= 1.5x raw, "
                    "start->ENTER <= 5 ms, import <= 150 ms, idle <= 0.1% CPU and 25 MB).",
        epilog="Every test runs in fresh processes on 127.0.0.1; each picks its own "
               "free UDP beacon port (never 5670) and beacons go to 127.255.255.255. pyre is "
               "patched, in its benchmark processes only, onto loopback. Progress lines go "
               "to stderr. See scripts/README.md for what each row means.")
    p.add_argument("--messages", "-n", type=int, default=100_000, metavar="N",
                   help="one-way messages per throughput test (default: %(default)s)")
    p.add_argument("--pyre-messages", type=int, metavar="N",
                   help="messages for pyre (default: min(N, 30000); pyre breaks the link "
                        "after 65,534 messages)")
    p.add_argument("--threaded-messages", type=int, metavar="N",
                   help="messages for the ThreadedNode row (default: min(N, 30000))")
    p.add_argument("--repeat", type=int, default=3, metavar="R",
                   help="rounds of the raw and peermesh throughput and latency tests, "
                        "interleaved; medians are reported and each ratio is the median of "
                        "the per-round ratios (default: %(default)s)")
    p.add_argument("--round-trips", type=int, default=5000, metavar="N",
                   help="measured round trips per latency test (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=500, metavar="N",
                   help="round trips before measuring (default: %(default)s)")
    p.add_argument("--enter-tries", type=int, default=7, metavar="N",
                   help="start->ENTER tries, median reported (default: %(default)s)")
    p.add_argument("--import-runs", type=int, default=5, metavar="N",
                   help="fresh interpreters timing `import peermesh` (default: %(default)s)")
    p.add_argument("--idle-seconds", type=float, default=10.0, metavar="S",
                   help="how long the idle node is watched (default: %(default)s)")
    p.add_argument("--no-pyre", action="store_true", help="skip the pyre comparison")
    p.add_argument("--metrics", action="store_true",
                   help="add throughput rounds where both nodes serve Prometheus metrics, "
                        "scraped every second by another process, and print their ratio to "
                        "plain peermesh")
    p.add_argument("--only", metavar="LIST",
                   help=f"comma-separated subset of: {', '.join(SECTIONS)}")
    p.add_argument("--baseline", metavar="REV",
                   help="also measure the peermesh of REV (a commit, or a directory holding a "
                        "peermesh package) in the throughput, ThreadedNode and latency "
                        "rounds, interleaved, and print peermesh/baseline ratios")
    p.add_argument("--profile", metavar="DIR",
                   help="run the peermesh processes of the throughput and latency tests under "
                        "cProfile; write sink.prof, source.prof, ping.prof and echo.prof to DIR "
                        "and print the top functions to stderr (profiling slows them down)")
    p.add_argument("--json", action="store_true",
                   help="print all results as one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.messages < 2 or args.round_trips < 1 or args.repeat < 1:
        p.error("--messages must be at least 2, --round-trips and --repeat at least 1")
    args.pyre_messages = args.pyre_messages or min(args.messages, 30_000)
    args.threaded_messages = args.threaded_messages or min(args.messages, 30_000)
    if args.pyre_messages >= 65_535:
        p.error("--pyre-messages must stay below 65,535 (pyre's sequence wrap bug)")
    sections = set(SECTIONS)
    if args.only:
        sections = {s.strip() for s in args.only.split(",") if s.strip()}
        unknown = sections - set(SECTIONS)
        if unknown:
            p.error(f"unknown section(s) for --only: {', '.join(sorted(unknown))}")
    args.sections = sections
    return args


def _print_profiles(profile_dir: Optional[str], parts: tuple[str, ...]) -> None:
    import io
    import pstats
    if not profile_dir:
        return
    for part in parts:
        path = os.path.join(profile_dir, f"{part}.prof")
        if os.path.exists(path):
            progress(f"profile of the peermesh {part} ({path}), by own time:")
            buf = io.StringIO()
            pstats.Stats(path, stream=buf).strip_dirs().sort_stats("tottime").print_stats(25)
            print(buf.getvalue(), file=sys.stderr)


def _rounds(section: str, cases: dict[str, Callable[[int], Any]], rounds: int,
            results: dict[str, Any], key: str, ratio_names: dict[str, tuple[str, str]]) -> None:
    """Interleaved rounds of ``cases``; the median run of each and the median of the
    per-round ratios ``ratio_names[name] = (top, bottom)``."""
    errors: dict[str, str] = {}
    runs = interleaved(cases, rounds, errors)
    results["errors"].update({f"{section}/{name}": text for name, text in errors.items()})
    out = results[section]
    for kind, done in runs.items():
        ok = [x for x in done if x]
        if ok:
            out[kind] = median_run(ok, key)
    for name, (top, bottom) in ratio_names.items():
        if top in runs and bottom in runs:
            values = round_ratios(runs[top], runs[bottom], key)
            if values:
                out[name] = statistics.median(values)
                if name.endswith("_raw"):
                    out["ratios"] = values


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    import zmq
    with_pyre, pyre_note = (False, "skipped (--no-pyre)") if args.no_pyre else pyre_available()
    code = trees(args.baseline)
    meta = {
        "messages": args.messages, "pyre_messages": args.pyre_messages,
        "threaded_messages": args.threaded_messages, "round_trips": args.round_trips,
        "repeat": args.repeat,
        "warmup": args.warmup, "payload": PAYLOAD, "python": sys.version.split()[0],
        "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
        "gevent": _dist_version("gevent"), "pyre": pyre_note if with_pyre else "no pyre",
        "cpus": os.cpu_count(), "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "c_extension": c_extension(),
    }
    if "baseline" in code:
        meta["baseline"] = f"{args.baseline} ({code['baseline']})"
        meta["baseline_c_extension"] = c_extension(code["baseline"])
    if not with_pyre:
        meta["pyre_note"] = pyre_note
    results: dict[str, Any] = {"meta": meta, "throughput": {}, "latency": {}, "errors": {},
                               "targets": TARGETS}

    def once(name: str, fn: Callable[[], Any]) -> Any:
        return interleaved({name: lambda _: fn()}, 1, results["errors"])[name][0]

    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    s, n, rounds = args.sections, args.messages, args.repeat

    def profiled(r: int) -> Optional[str]:
        return args.profile if r == 0 else None
    if "throughput" in s:
        cases: dict[str, Callable[[int], Any]] = {
            "raw": lambda r: bench_throughput("raw", n),
            "peermesh": lambda r: bench_throughput("peermesh", n, code["peermesh"],
                                                   profiled(r))}
        if args.metrics:  # right after plain peermesh in each round
            cases["metrics"] = lambda r: bench_throughput("peermesh", n, code["peermesh"],
                                                          metrics=True)
        if "baseline" in code:
            cases["baseline"] = lambda r: bench_throughput("peermesh", n, code["baseline"])
        progress(f"throughput: {n:,} messages one way")
        _rounds("throughput", cases, rounds, results, "rate",
                {"ratio_peermesh_raw": ("peermesh", "raw"),
                 "ratio_peermesh_baseline": ("peermesh", "baseline"),
                 "ratio_metrics_peermesh": ("metrics", "peermesh")})
        if with_pyre:
            progress(f"throughput: pyre, {args.pyre_messages:,} messages")
            res = once("throughput/pyre", lambda: bench_throughput("pyre", args.pyre_messages))
            if res:
                results["throughput"]["pyre"] = res
        _print_profiles(args.profile, ("sink", "source"))
    if "threaded" in s:
        tn = args.threaded_messages
        progress(f"throughput: ThreadedNode -> Node, {tn:,} messages")
        for label, tree in code.items():
            key = "threaded" if label == "peermesh" else "threaded_baseline"
            res = once(f"throughput/{key}", lambda: bench_throughput("threaded", tn, tree))
            if res:
                results["throughput"][key] = res
    if "latency" in s:
        rt, warm = args.round_trips, args.warmup
        progress(f"latency: {rt:,} round trips after {warm:,}")
        cases = {"raw": lambda r: bench_latency("raw", rt, warm),
                 "raw_each_way": lambda r: bench_latency("raw_each_way", rt, warm),
                 "peermesh": lambda r: bench_latency("peermesh", rt, warm, code["peermesh"],
                                                     profiled(r))}
        if "baseline" in code:
            cases["baseline"] = lambda r: bench_latency("peermesh", rt, warm, code["baseline"])
        _rounds("latency", cases, rounds, results, "p50_us",
                {"ratio_p50_peermesh_raw": ("peermesh", "raw"),
                 "ratio_p50_peermesh_raw_each_way": ("peermesh", "raw_each_way"),
                 "ratio_p50_peermesh_baseline": ("peermesh", "baseline")})
        if with_pyre:
            res = once("latency/pyre", lambda: bench_latency("pyre", rt, warm))
            if res:
                results["latency"]["pyre"] = res
        _print_profiles(args.profile, ("ping", "echo"))
    if "enter" in s:
        progress(f"start->ENTER: {args.enter_tries} tries (Node, then ThreadedNode)")
        res = once("enter", lambda: bench_enter(args.enter_tries))
        if res:
            results["enter"] = res
            progress(f"  median {res['node']['enter_ms_median']:.2f} ms "
                     f"(tries: {', '.join(f'{x:.2f}' for x in res['node']['enter_ms'])})")
    if "import" in s:
        progress(f"import peermesh: {args.import_runs} fresh interpreters")
        res = once("import", lambda: bench_import(args.import_runs))
        if res:
            results["import"] = res
            progress(f"  median {res['import_ms_median']:.0f} ms")
    if "idle" in s:
        progress(f"idle: a node with one peer, watched for {args.idle_seconds:g} s")
        res = once("idle", lambda: bench_idle(args.idle_seconds, with_pyre))
        if res:
            results["idle"] = res
            if "error" in res.get("pyre", {}):
                results["errors"]["idle/pyre"] = res["pyre"]["error"]
            pm = res["peermesh"]
            progress(f"  {pm['cpu_pct']:.3f} % CPU ({pm['wakeups_per_s']:.1f} wakeups/s, "
                     f"{pm['cpu_us_per_wakeup']:.0f} us CPU each), {pm['rss_mb']:.1f} MB RSS "
                     f"(interpreter alone {pm['rss_interpreter_mb']:.1f} MB, after import "
                     f"{pm['rss_after_import_mb']:.1f} MB)")
    progress("done")
    print(dump_json(results) if args.json else render(results))
    return 1 if results["errors"] else 0


def _dist_version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "?"


if __name__ == "__main__":
    harness.run(main)
