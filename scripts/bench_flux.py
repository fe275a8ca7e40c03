#!/usr/bin/env python3
"""Flux overlay: RPC latency against raw pyzmq, ping all, event fan-out, 1,000 ranks.

    python scripts/bench_flux.py                          # every section (~3 min idle)
    python scripts/bench_flux.py --only latency --rounds 5
    python scripts/bench_flux.py --only pingall,events --ranks 512
    python scripts/bench_flux.py --only sim --sim-sizes 100,1000,10000
    python scripts/bench_flux.py --only latency,pingall --baseline flux   # next to a branch
    python scripts/bench_flux.py --only fluxcore --rounds 3 -n 500 --fluxcore-sizes 16,64
    python scripts/bench_flux.py --only fluxcore-pingall --fluxcore-rounds 3 --baseline REV

Sections:

* ``latency``: p50 of a ``broker.ping`` RPC (100-byte payload) one hop away
  (rank 1 pings rank 0, two processes) and three hops away (a kary:1 chain
  of four processes, rank 3 pings rank 0), next to two ceilings of plain
  pyzmq in the same round: a DEALER<->ROUTER echo of the same payload (two
  processes, one hop) and a chain of the same shape as the three hops (four
  processes: the pinger's DEALER, two forwarders that each push the
  sender's identity on the way in and route by it on the way back, a
  ROUTER that echoes). Targets: one hop <= 1.5x the echo, three hops <= 3x
  the echo (median of per-round ratios); three hops against the raw chain
  compares like with like. A third row is the floor of Flux on peermesh's
  socket driver: the same echo with both ends on the gevent hub
  (``HubSocket``), without Flux. ``--baseline REV`` runs the Flux cases a second
  time with an older commit's code, in the same rounds.
* ``pingall``: ``--ranks`` ranks on real sockets in ONE process (kary:2 and
  kary:32): time to start and converge, then ``broker.ping`` to every rank
  at once from rank 0 (as ``flux ping all``): mean and max round trip of
  the responses (each from its own request, as ``flux ping`` times them;
  "all": from the first request to the last response; "CPU": the process's,
  libzmq's I/O thread included, for one ping all), against
  flux-core's published mean of 21 ms for 480 ranks
  (flux-core PR 689, 30 nodes with 16 brokers each: here every broker shares
  one Python process and one core); descriptors used. Next to it, in the same
  run (``--pingall-rounds`` runs of each, in turn), two plain-pyzmq ceilings of
  the same tree in one process (``role_raw_tree``): the thinnest forwarding
  (two frames a message), and the same carrying RFC 3's route stack as Flux's
  messages do; the CPU of one ping all by thread (Python's, libzmq's I/O
  thread) for each, the Python thread's per hop traversal (a request down one
  hop or a response up one: 7,190 of them at kary:2, 1,980 at kary:32, for 512
  ranks) and its ratio to the thinnest tree's in the same round (CPU is steadier
  than times on a loaded machine).
* ``events``: the same process publishes events and measures the CPU per
  delivered event (every rank subscribed).
* ``sim``: one event's fan-out at ``--sim-sizes`` simulated ranks (kary:32, 1 ms
  links): the tree's depth in hops, virtual time (the publisher's request up
  to rank 0, then down every branch) and wall time until every rank has it,
  and the memory used.
* ``thousand``: 1,000 real-socket ranks in one process start, converge and
  answer ping all.
* ``fluxcore`` (not in the default set; needs flux-core's ``flux`` on PATH): the
  ping of one rank one hop away, interleaved in rounds: a peermesh
  ``FluxClient`` of a flux-core broker (``flux start --test-size=2``, its local
  connector) pinging rank 1, flux-core's own ``flux ping -i 0.002`` of the same
  rank, and peermesh -> peermesh (the ``latency`` one hop); then ping all
  (``fluxcore-pingall`` alone): one ``broker.ping`` per rank, all in flight at
  once, with flux's JSON body (what ``flux ping`` and ``peermesh flux ping``
  send; flux-core has no broadcast request, and ``flux exec -r all`` also sends
  one request per rank), from a client of rank 0. flux-core instances of
  ``--fluxcore-sizes`` brokers (``--fluxcore-topologies``, a process per broker)
  are pinged by flux-core's own client (its Python bindings over libflux, run by
  ``flux python``) and by a peermesh ``FluxClient`` on the local connector;
  peermesh ranks of the same size and topology, all in one process, by the same
  ``FluxClient`` in a process of its own (over TCP to rank 0) and by rank 0's
  own handle. Each case in each of ``--fluxcore-rounds`` rounds (a new instance
  each): the median of 5 after a warm-up, with the CPU per ping all of the
  instance's processes and of the client. ``--baseline REV`` adds the peermesh
  cases with an older commit's code, in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable, Optional

import harness
from harness import (LOOPBACK, Children, Parent, cpu, dump_json, interleaved, median_run,
                     percentile, progress, round_ratios, rss_mb, table, verdict)

PAYLOAD = b"x" * 100
TARGET_ONE_HOP = 1.5
TARGET_THREE_HOPS = 3.0
FLUX_CORE_PING_ALL_MS = 21.0


# --- child roles --------------------------------------------------------------

def _settings() -> Any:
    from peermesh.flux import FluxSettings
    return FluxSettings(heartbeat=1.0, torpid=5.0, lost=10.0, hello_timeout=2.0)


def role_raw_forward(parent: Parent, port: int) -> dict[str, Any]:
    """One hop of the raw chain: a ROUTER for the previous process, a DEALER to the next
    (at ``port``); requests go on with the sender's identity pushed, answers go back
    to the identity on top (plain pyzmq, frame by frame)."""
    import zmq
    ctx = zmq.Context()
    front, back = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock in (front, back):
        sock.setsockopt(zmq.LINGER, 0)
    back.connect(f"tcp://{LOOPBACK}:{port}")
    parent.send("ready", front.bind_to_random_port(f"tcp://{LOOPBACK}"))
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    poller.register(0, zmq.POLLIN)   # the parent's "stop" (or its end)
    more, nowait = zmq.SNDMORE, zmq.NOBLOCK
    while True:
        for sock, _ in poller.poll(60_000):
            if sock == 0:
                return {}
            other = back if sock is front else front
            while True:
                try:
                    frame = sock.recv(nowait, copy=False)
                except zmq.Again:
                    break
                while frame.more:
                    other.send(frame, more, copy=False)
                    frame = sock.recv(copy=False)
                other.send(frame, copy=False)


def role_raw_chain_echo(parent: Parent) -> dict[str, Any]:
    """The end of the raw chain: a ROUTER that sends every message back as it came."""
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    parent.send("ready", sock.bind_to_random_port(f"tcp://{LOOPBACK}"))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(0, zmq.POLLIN)
    while True:
        for ready, _ in poller.poll(60_000):
            if ready == 0:
                return {}
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                sock.send_multipart(frames, copy=False)


def role_hub_echo(parent: Parent) -> dict[str, Any]:
    """peermesh's socket driver alone (no Flux): a ROUTER on the gevent hub that sends
    every message back as it came."""
    import gevent
    from peermesh.io.transport import ZmqTransport
    router = ZmqTransport().bind_mailbox(LOOPBACK, 1 << 20)
    send = router.try_send

    def echo(first: bytes, rest: list[bytes]) -> None:
        rest.insert(0, first)
        send(rest)

    gevent.spawn(router.serve, echo)
    parent.send("ready", router.port)
    parent.expect("stop", None, green=True)
    router.close()
    return {}


def role_hub_ping(parent: Parent, port: int, n: int, warmup: int) -> dict[str, Any]:
    """peermesh's socket driver alone: a DEALER on the hub; each ping waits for its echo
    on a ``Waiter`` that the reader switches to (what an RPC future does)."""
    import gevent
    from gevent.hub import Waiter
    from peermesh.io.transport import ZmqTransport
    link = ZmqTransport().connect(os.urandom(16), f"tcp://{LOOPBACK}:{port}", 1000)
    waiting: list[Any] = []

    def answer(first: bytes, rest: list[bytes]) -> None:
        waiting.pop().switch(first)

    def ping() -> None:
        waiter = Waiter()
        waiting.append(waiter)
        link.try_send([PAYLOAD])
        if waiter.get() != PAYLOAD:
            raise RuntimeError("the echo came back changed")

    gevent.spawn(link.serve, answer)
    parent.send("ready")
    parent.expect("go", 60, green=True)
    stats = _round_trips(ping, n, warmup)
    link.close()
    return stats


def _round_trips(ping: Callable[[], None], n: int, warmup: int) -> dict[str, Any]:
    """Time ``n`` calls of ``ping`` (one round trip each) after ``warmup`` untimed ones:
    p50, p99 and mean in µs, and the CPU of this process per round trip."""
    clock = time.perf_counter_ns
    for _ in range(warmup):
        ping()
    samples = []
    c0 = cpu()
    for _ in range(n):
        t = clock()
        ping()
        samples.append(clock() - t)
    used = cpu() - c0
    us = sorted(s / 1000 for s in samples)
    return {"p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
            "mean_us": statistics.fmean(us), "ping_cpu_us": used / n * 1e6}


def role_flux_node(parent: Parent, topology: str, root: bool = False,
                   parents: Optional[list[str]] = None) -> dict[str, Any]:
    """One rank of a chain or tree; serves until told to stop."""
    from peermesh.flux import FluxOverlay
    flux = FluxOverlay(root=root, parents=parents or (), topology=topology,
                       settings=_settings(), address=LOOPBACK).start()
    if not flux.wait_online(30):
        raise RuntimeError(f"not online after 30 s: {flux.info()}")
    parent.send("ready", {"endpoint": flux.endpoint, "rank": flux.rank})
    parent.expect("stop", None, green=True)
    flux.stop()
    return {}


def role_flux_ping(parent: Parent, topology: str, parents: list[str], target: int, n: int,
                   warmup: int) -> dict[str, Any]:
    """Join, then ``broker.ping`` rank ``target`` ``n`` times, one at a time."""
    from peermesh.flux import FluxOverlay
    flux = FluxOverlay(parents=parents, topology=topology, settings=_settings(),
                       address=LOOPBACK).start()
    if not flux.wait_online(30):
        raise RuntimeError(f"not online after 30 s: {flux.info()}")
    def ping() -> None:
        if flux.rpc("broker.ping", PAYLOAD, target).get(10) != PAYLOAD:
            raise RuntimeError("the ping came back changed")

    parent.send("ready", {"rank": flux.rank})
    parent.expect("go", 60, green=True)
    stats = _round_trips(ping, n, warmup)
    flux.stop()
    return stats


def _ping_all(root: Any, n: int, body: Optional[Callable[[int], bytes]] = None
              ) -> dict[str, float]:
    """``broker.ping`` to every rank at once (``body(rank)``: its payload, empty without):
    each round trip from its own request to its response (as ``flux ping`` times them),
    and the time until the last answer."""
    import gevent.event
    clock = time.perf_counter
    sent, took = [0.0] * n, [0.0] * n
    left, failed = [n], []
    everyone = gevent.event.Event()

    def answered(rank: int) -> Any:
        def on_response(response: Any) -> None:
            took[rank] = clock() - sent[rank]
            if response.errnum:
                failed.append((rank, response.errnum, bytes(response.payload or b"")[:80]))
            left[0] -= 1
            if not left[0]:
                everyone.set()
        return on_response

    began, c0, t0 = clock(), cpu(), harness.threads_cpu(os.getpid())
    for rank in range(n):
        sent[rank] = clock()
        root.rpc("broker.ping", body(rank) if body else b"", rank).on_response(answered(rank))
    if not everyone.wait(60):
        raise RuntimeError(f"{left[0]} of {n} ranks did not answer in 60 s")
    if failed:
        raise RuntimeError(f"ranks {failed[:3]} answered the ping with an error")
    t1 = harness.threads_cpu(os.getpid())
    return {"mean_ms": statistics.fmean(took) * 1000, "max_ms": max(took) * 1000,
            "all_ms": (clock() - began) * 1000, "cpu_ms": (cpu() - c0) * 1000,
            "main_ms": (t1["main"] - t0["main"]) * 1000, "zmq_ms": (t1["zmq"] - t0["zmq"]) * 1000}


def role_raw_tree(parent: Parent, n: int, k: int, rounds: int = 5,
                  routes: bool = False) -> dict[str, Any]:
    """The ceiling of ping all: ``n`` ranks of a k-ary tree in this one process in plain
    pyzmq, each a ROUTER for its children and a DEALER (identity: its rank) to its
    parent, on one ZeroMQ context (one I/O thread), driven from the gevent hub as
    peermesh's sockets are: a watcher per socket's ``zmq.FD`` whose callback reads
    until the socket is empty, and a socket sent on is looked at again (a send may take
    in the edge of a message waiting). The thinnest forwarding there is: a request is
    ``[topic, PROTO]``, its target rank read from the PROTO's nodeid; it goes down
    the ROUTER to the child on its path (computed from the ranks), or is sent back up
    as it came at its target; a response from a child goes up the DEALER as it came.
    No route stack, nothing tracked in flight, no timers. With ``routes`` the messages
    carry RFC 3's route stack as Flux's do: ``[routes, "", topic, PROTO]``, a route
    pushed on every hop down (``^``) and popped on every hop up, so that each carries
    as many frames as Flux's. Rank 0 pings every rank at once and times each answer
    from its own request, as ``_ping_all`` does. (A ``zmq.Poller`` loop over the
    same sockets measured slower: each poll passes every socket.)"""
    import struct
    import gevent
    import zmq
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 4 * n + 64)
    routers, ports = [], []
    for _ in range(n):
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        ports.append(sock.bind_to_random_port(f"tcp://{LOOPBACK}"))
        routers.append(sock)
    identity = [rank.to_bytes(4, "big") for rank in range(n)]
    dealers: list[Any] = [None]
    for rank in range(1, n):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, identity[rank])
        sock.connect(f"tcp://{LOOPBACK}:{ports[(rank - 1) // k]}")
        dealers.append(sock)
    # the child of ``me`` on the path to ``rank`` (what a forwarder works out per request)
    def toward(me: int, rank: int) -> bytes:
        while (rank - 1) // k != me:
            rank = (rank - 1) // k
        return identity[rank]

    backend = zmq.Socket.__mro__[1]   # the Cython socket: no Python layer per call
    r_recv = [backend.recv.__get__(s) for s in routers]
    r_send = [backend.send.__get__(s) for s in routers]
    d_recv = [None] + [backend.recv.__get__(s) for s in dealers[1:]]
    d_send = [None] + [backend.send.__get__(s) for s in dealers[1:]]
    rcvmore = int(zmq.RCVMORE)
    r_more = [partial(backend.get, s, rcvmore) for s in routers]
    d_more = [None] + [partial(backend.get, s, rcvmore) for s in dealers[1:]]
    nodeid = struct.Struct(">I").unpack_from
    nowait, more_flags = int(zmq.NOBLOCK), int(zmq.NOBLOCK | zmq.SNDMORE)
    clock = time.perf_counter
    sent, took = [0.0] * n, [0.0] * n
    left, hellos = [0], [0]
    topic = b"broker.ping"
    protos = [struct.pack(">BBBBIIII", 0x8E, 1, 1, 0x0B, 0xFFFFFFFF, 0, rank, rank + 1)
              for rank in range(n)]

    def from_parent(me: int) -> Any:
        """One request from the parent: the socket sent on, False when none waits."""
        try:
            head = d_recv[me](nowait)
        except zmq.Again:
            return False
        proto = d_recv[me](0)
        target = nodeid(proto, 12)[0]
        if target == me:
            send = d_send[me]
            send(head, more_flags)
            send(proto, nowait)
            return dealers[me]
        send = r_send[me]
        send(toward(me, target), more_flags)
        send(head, more_flags)
        send(proto, nowait)
        return routers[me]

    def from_parent_routed(me: int) -> Any:
        """``from_parent`` of a message with a route stack: a route pushed on the way down."""
        try:
            frames = [d_recv[me](nowait)]
        except zmq.Again:
            return False
        more = d_more[me]
        while more():
            frames.append(d_recv[me](0))
        target = nodeid(frames[-1], 12)[0]
        if target == me:
            sock, send = dealers[me], d_send[me]
        else:
            sock, send = routers[me], r_send[me]
            send(toward(me, target), more_flags)
            send(b"^", more_flags)
        for frame in frames[:-1]:
            send(frame, more_flags)
        send(frames[-1], nowait)
        return sock

    def from_child_routed(me: int) -> Any:
        """``from_child`` of a message with a route stack: the top route popped on the way up."""
        recv = r_recv[me]
        try:
            recv(nowait)   # the child's identity
        except zmq.Again:
            return False
        frames = [recv(0)]
        more = r_more[me]
        while more():
            frames.append(recv(0))
        if frames[0] == b"hello":
            hellos[0] += 1
            return None
        if me == 0:
            target = nodeid(frames[-1], 12)[0]
            took[target] = clock() - sent[target]
            left[0] -= 1
            return None
        send = d_send[me]
        for frame in frames[1:-1]:
            send(frame, more_flags)
        send(frames[-1], nowait)
        return dealers[me]

    def from_child(me: int) -> Any:
        """One response (or hello) from a child: the socket sent on, None, or False."""
        recv = r_recv[me]
        try:
            recv(nowait)   # the child's identity
        except zmq.Again:
            return False
        head = recv(0)
        if head == b"hello":
            hellos[0] += 1
            return None
        proto = recv(0)
        if me == 0:
            target = nodeid(proto, 12)[0]
            took[target] = clock() - sent[target]
            left[0] -= 1
            return None
        send = d_send[me]
        send(head, more_flags)
        send(proto, nowait)
        return dealers[me]

    loop = gevent.get_hub().loop
    down, up = (from_parent_routed, from_child_routed) if routes else (from_parent, from_child)
    handlers = {s: (up, rank) for rank, s in enumerate(routers)}
    handlers.update({s: (down, rank) for rank, s in enumerate(dealers) if s})
    prefix = [b"@1", b""] if routes else []   # rank 0's own route entry and the delimiter
    events, pollin = int(zmq.EVENTS), int(zmq.POLLIN)

    def drain(handler: Any, me: int) -> None:
        while True:
            used = handler(me)
            if used is False:
                return
            if used is not None and used.get(events) & pollin:
                loop.run_callback(drain, *handlers[used])

    watchers = []
    for sock, (handler, me) in handlers.items():
        watcher = loop.io(sock.getsockopt(zmq.FD), 1)
        watcher.start(drain, handler, me)
        watchers.append(watcher)
        loop.run_callback(drain, handler, me)

    def wait_until(done: Callable[[], bool], what: str) -> None:
        deadline = clock() + 60
        while not done():
            if clock() > deadline:
                raise RuntimeError(f"raw tree: {what} not done in 60 s")
            gevent.sleep(0.001)

    for rank in range(1, n):
        dealers[rank].send(b"hello")
    wait_until(lambda: hellos[0] == n - 1, "hellos")
    pings = []
    for i in range(rounds + 1):   # the first is a warm-up
        left[0] = n - 1
        began, c0, t0 = clock(), cpu(), harness.threads_cpu(os.getpid())
        send = r_send[0]
        for target in range(1, n):
            sent[target] = clock()
            send(toward(0, target), more_flags)
            for frame in prefix:
                send(frame, more_flags)
            send(topic, more_flags)
            send(protos[target], nowait)
        wait_until(lambda: not left[0], "ping all")
        if i:
            t1 = harness.threads_cpu(os.getpid())
            pings.append({"mean_ms": statistics.fmean(took) * 1000,
                          "max_ms": max(took) * 1000, "all_ms": (clock() - began) * 1000,
                          "cpu_ms": (cpu() - c0) * 1000,
                          "main_ms": (t1["main"] - t0["main"]) * 1000,
                          "zmq_ms": (t1["zmq"] - t0["zmq"]) * 1000})
    for watcher in watchers:
        watcher.close()
    context.destroy(linger=0)
    return _summary(pings, {"ranks": n, "topology": f"kary:{k}",
                            "code": "raw pyzmq, routes" if routes else "raw pyzmq"})


def _settled(root: Any, n: int, body: Optional[Callable[[int], bytes]] = None,
             tries: int = 10) -> None:
    """Warm-up ping alls until one is answered without an error (under load, joins that
    timed out may still be re-attaching when every rank is first online)."""
    for attempt in range(tries):
        try:
            _ping_all(root, n, body)
            return
        except RuntimeError as exc:
            if attempt == tries - 1:
                raise
            import gevent
            import peermesh
            print(f"warm-up ({peermesh.__file__}): {exc}; again", file=sys.stderr, flush=True)
            gevent.sleep(1.0)


def tree_hops(nodes: list[Any]) -> int:
    """Hop traversals of one ping all over the tree ``nodes`` formed (a rank that
    attached while its formula parent could not answer sits higher up: fewer hops)."""
    parent = {node.rank: node.info()["parent"] for node in nodes}
    total = 0
    for rank in parent:
        seen = 0
        while rank and seen <= len(parent):
            rank, seen = parent.get(rank), seen + 1
            total += 2
    return total


def hops(n: int, topology: str) -> int:
    """Hop traversals of one ping all over ``n`` ranks of ``topology`` (``kary:K``): each
    request goes down its rank's depth and its response back up."""
    k, total = int(topology.split(":")[1]), 0
    for rank in range(1, n):
        while rank > 0:
            rank = (rank - 1) // k if k else 0
            total += 2
    return total


def _summary(pings: list[dict[str, float]], result: dict[str, Any]) -> dict[str, Any]:
    """The median of each figure of several ping alls, into ``result``."""
    for key in pings[0]:
        result["ping_all_" + key] = statistics.median(p[key] for p in pings)
    return result


def role_ranks(parent: Parent, n: int, topology: str, events: int = 0,
               rounds: int = 5, flux_body: bool = False, serve: bool = False) -> dict[str, Any]:
    """``n`` ranks on real sockets in this one process: start, converge, ping all (with
    ``flux_body``: flux's JSON body, as ``flux ping`` and ``peermesh flux ping`` send it;
    else empty), and (``events``) CPU per delivered event. With ``serve`` the ranks
    then serve clients of rank 0 (``serving``: its endpoint) until told to stop."""
    import gevent
    from peermesh.flux import FluxOverlay, State
    fds0 = len(os.listdir("/proc/self/fd"))
    began = time.perf_counter()
    root = FluxOverlay(root=True, topology=topology, settings=_settings(),
                       address=LOOPBACK).start()
    nodes = [root] + [FluxOverlay(parents=[root.endpoint], topology=topology,
                                  settings=_settings(), address=LOOPBACK).start()
                      for _ in range(n - 1)]
    started = time.perf_counter()
    deadline = started + 120
    while not all(node.state is State.ONLINE for node in nodes):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{sum(x.state is State.ONLINE for x in nodes)} of {n} online "
                               "after 120 s")
        gevent.sleep(0.02)
    converged = time.perf_counter()
    fds = len(os.listdir("/proc/self/fd")) - fds0
    body = _flux_ping_body if flux_body else None
    _settled(root, n, body)  # warm-up
    pings = [_ping_all(root, n, body) for _ in range(rounds)]
    result = _summary(pings, {
        "ranks": n, "topology": topology, "hops": tree_hops(nodes), "start_s": started - began,
        "converge_s": converged - started, "fds": fds, "fds_per_rank": fds / n,
        "rss_mb": rss_mb()})
    if events:
        got = [0]
        for node in nodes:
            node.subscribe("bench.", lambda event: got.__setitem__(0, got[0] + 1))
        c0 = cpu()
        t0 = time.perf_counter()
        for i in range(events):
            root.publish("bench.e", PAYLOAD)
            while got[0] < (i + 1) * n:
                gevent.sleep(0.001)
        result["event_cpu_us_per_delivery"] = (cpu() - c0) / (events * n) * 1e6
        result["event_to_all_ms"] = (time.perf_counter() - t0) / events * 1000
    if serve:
        parent.send("serving", {"endpoint": root.endpoint})
        parent.expect("stop", None, green=True)
    for node in reversed(nodes):  # leaves first: no orphan dials a parent again
        node.stop(0)
    return result


def role_sim(parent: Parent, n: int, topology: str) -> dict[str, Any]:
    """One event's fan-out to ``n`` simulated ranks, in virtual and wall time."""
    from peermesh.flux import FluxOverlay, State
    from peermesh.sim import SimNetwork
    network = SimNetwork(latency=0.001, seed=1)
    settings = _settings()
    began = time.perf_counter()
    transport = network.transport()
    root = FluxOverlay(root=True, topology=topology, settings=settings, transport=transport,
                       address=transport.address).start()
    nodes = [root]
    for _ in range(n - 1):
        transport = network.transport()
        nodes.append(FluxOverlay(parents=[root.endpoint], topology=topology, settings=settings,
                                 transport=transport, address=transport.address).start())
    network.clock.advance(5.0)
    online = sum(node.state is State.ONLINE for node in nodes)
    converged = time.perf_counter()
    got = [0]
    for node in nodes:
        node.subscribe("sim.", lambda event: got.__setitem__(0, got[0] + 1))
    v0, t0 = network.clock.now(), time.perf_counter()
    nodes[-1].publish("sim.event", PAYLOAD)
    while got[0] < n and network.clock.now() - v0 < 10:
        network.clock.advance(0.0005)
    from peermesh.flux import Topology
    return {"ranks": n, "online": online, "build_and_converge_s": converged - began,
            "depth": Topology.parse(topology).depth(n - 1),
            "event_virtual_ms": (network.clock.now() - v0) * 1000,
            "event_wall_ms": (time.perf_counter() - t0) * 1000, "reached": got[0],
            "rss_mb": rss_mb()}


# --- the parent ------------------------------------------------------------------

def latency_case(kind: str, n: int, warmup: int, code: Optional[str] = None) -> dict[str, Any]:
    """raw, raw_chain, hub, one_hop or three_hops (with peermesh from ``code``); one run,
    with the CPU per round trip of the pinger and of the other processes (summed)."""
    with Children() as kids:
        if kind == "raw_chain":
            others = [kids.start("bench_flux", "raw_chain_echo")]
            port = others[0].expect("ready", 30)
            for _ in range(2):
                others.append(kids.start("bench_flux", "raw_forward", port=port))
                port = others[-1].expect("ready", 30)
            ping = kids.start("bench_mesh", "raw_ping", port=port, n=n, warmup=warmup)
            ping.expect("ready", 30)
            return _timed(ping, others, n + warmup, 60 + n / 100)
        if kind == "hub":
            others = [kids.start("bench_flux", "hub_echo")]
            port = others[0].expect("ready", 30)
            ping = kids.start("bench_flux", "hub_ping", port=port, n=n, warmup=warmup)
            ping.expect("ready", 30)
            return _timed(ping, others, n + warmup, 60 + n / 100)
        if kind == "raw":
            echo = kids.start("bench_mesh", "raw_echo", total=n + warmup)
            port = echo.expect("ready", 30)
            ping = kids.start("bench_mesh", "raw_ping", port=port, n=n, warmup=warmup)
            ping.expect("ready", 30)
            result = _timed(ping, [echo], n + warmup, 60 + n / 100)
            echo.send("stop")
            echo.expect("result", 15)
            return result
        hops = 1 if kind == "one_hop" else 3
        chain = [kids.start("bench_flux", "flux_node", code, topology="kary:1", root=True)]
        endpoints = [chain[0].expect("ready", 60)["endpoint"]]
        for _ in range(hops - 1):
            chain.append(kids.start("bench_flux", "flux_node", code, topology="kary:1",
                                    parents=[endpoints[-1]]))
            endpoints.append(chain[-1].expect("ready", 60)["endpoint"])
        ping = kids.start("bench_flux", "flux_ping", code, topology="kary:1",
                          parents=[endpoints[-1]], target=0, n=n, warmup=warmup)
        rank = ping.expect("ready", 60)["rank"]
        if rank != hops:
            raise RuntimeError(f"the pinger got rank {rank}, not {hops}")
        return _timed(ping, chain, n + warmup, 60 + n / 50)


def _timed(ping: Any, others: list[Any], total: int, timeout: float) -> dict[str, Any]:
    """Start ``ping``'s round trips; its result, with ``others_cpu_us``: the CPU of the
    other processes (all threads) per round trip, warm-up included."""
    before = sum(harness.proc_cpu(other.pid) for other in others)
    ping.send("go")
    result = dict(ping.expect("result", timeout))
    result["others_cpu_us"] = (sum(harness.proc_cpu(other.pid) for other in others)
                               - before) / total * 1e6
    return result


# --- flux-core next to peermesh (section fluxcore) -------------------------------

def _flux_core(size: int, topology: str) -> Any:
    """``flux start --test-size=size`` (ipc:// sockets on this host) with ``tbon.topo``;
    the process, after its first line (rank 0's FLUX_URI)."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUX_")}
    # the brokers' rc scripts run python3: this interpreter's directory first, not a
    # version manager's shim (64 brokers at once queue on its lock for a minute)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    proc = subprocess.Popen(["flux", "start", f"--test-size={size}", f"-Stbon.topo={topology}",
                             "sh", "-c", 'echo "$FLUX_URI"; exec cat'], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    proc.uri = proc.stdout.readline().strip()  # type: ignore[attr-defined]
    if not proc.uri.startswith("local://"):  # type: ignore[attr-defined]
        proc.kill()
        raise RuntimeError("flux start did not print FLUX_URI")
    return proc


def _flux_core_stop(proc: Any) -> None:
    """Stop the instance and wait (up to 120 s) until every process of it has ended,
    so that its shutdown does not load what is measured next."""
    left = _descendants(proc.pid)
    proc.stdin.close()
    proc.wait(120)
    deadline = time.monotonic() + 120
    for pid in left:  # (a pidfd turns readable when its process ends, child or not)
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([handle], [], [], max(deadline - time.monotonic(), 0))
        finally:
            os.close(handle)


def role_fluxcore_client(parent: Parent, uri: str, target: int, n: int,
                         warmup: int) -> dict[str, Any]:
    """A ``FluxClient`` of a flux-core broker (local connector): ``broker.ping`` with
    flux's body to ``target``, one at a time."""
    from peermesh.flux import FluxClient
    from peermesh.flux.bodies import ping_body
    client = FluxClient([uri]).connect(30)
    body = ping_body(0)

    def ping() -> None:
        client.rpc("broker.ping", body, target).get(10)

    parent.send("ready", {})
    parent.expect("go", 60, green=True)
    stats = _round_trips(ping, n, warmup)
    client.close()
    return stats


def _flux_ping_body(rank: int) -> bytes:
    """flux's ``broker.ping`` body (``{"seq", "pad"}``), as ``flux ping`` sends it."""
    from peermesh.flux.bodies import ping_body
    return ping_body(rank)


def role_client_ping_all(parent: Parent, uri: str, size: int, rounds: int) -> dict[str, Any]:
    """A peermesh ``FluxClient`` of rank 0 at ``uri`` (a flux-core broker's local connector,
    or a peermesh member's ``tcp://``) pings every rank at once with flux's body, as
    ``_ping_all`` times it."""
    from peermesh.flux import FluxClient
    client = FluxClient([uri]).connect(30)
    _ping_all(client, size, _flux_ping_body)  # warm-up
    parent.send("ready")
    parent.expect("go", 600, green=True)
    pings = [_ping_all(client, size, _flux_ping_body) for _ in range(rounds)]
    client.close()
    return _summary(pings, {})


#: flux-core's own client of its instance, run by ``flux python`` (flux-core's Python
#: bindings over libflux): ``broker.ping`` with flux's body to every rank at once, each
#: timed from its request to its response (as ``_ping_all``); argv: size, rounds
FLUX_CORE_PING_ALL = r"""
import json, statistics, sys, time
import flux
size, rounds = int(sys.argv[1]), int(sys.argv[2])
h = flux.Flux()
clock = time.perf_counter

def ping_all():
    sent, took, left, futures = [0.0] * size, [0.0] * size, [size], []
    def answered(future, rank):
        future.get()  # an error response raises: the run fails
        took[rank] = clock() - sent[rank]
        left[0] -= 1
        if not left[0]:
            h.reactor_stop()
    began, c0 = clock(), time.process_time()
    for rank in range(size):
        sent[rank] = clock()
        futures.append(h.rpc("broker.ping", {"seq": rank, "pad": ""}, nodeid=rank)
                       .then(answered, rank))
    h.reactor_run()
    if left[0]:
        raise SystemExit(f"{left[0]} of {size} ranks did not answer")
    return {"mean_ms": statistics.fmean(took) * 1000, "max_ms": max(took) * 1000,
            "all_ms": (clock() - began) * 1000, "cpu_ms": (time.process_time() - c0) * 1000}

ping_all()  # warm-up
print("ready", flush=True)
sys.stdin.readline()  # go
pings = [ping_all() for _ in range(rounds)]
print(json.dumps({"ping_all_" + k: statistics.median(p[k] for p in pings) for k in pings[0]}))
"""


def _flux_core_ping_all(uri: str, size: int, rounds: int, pids: list[int]) -> dict[str, Any]:
    """``FLUX_CORE_PING_ALL`` against the instance at ``uri``, with the CPU per ping all
    of the processes ``pids`` (the instance) over the timed rounds."""
    import json
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUX_")}
    env["FLUX_URI"] = uri
    with subprocess.Popen(["flux", "python", "-c", FLUX_CORE_PING_ALL, str(size), str(rounds)],
                          env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            if not _line_within(proc.stdout, 300).startswith("ready"):
                raise RuntimeError("flux python: no ready line")
            before = _cpu_of(pids)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            last = _line_within(proc.stdout, 300)
            used = _cpu_of(pids) - before
        finally:
            proc.kill()
    if not last.startswith("{"):
        raise RuntimeError(f"flux python ended without a result: {last[-200:]!r}")
    result = dict(json.loads(last))
    result["server_cpu_ms"] = used / rounds * 1000
    return result


def _line_within(stream: Any, timeout: float) -> str:
    """The next line of a child's ``stream`` ('' at its end); RuntimeError after ``timeout``."""
    import select
    if not select.select([stream], [], [], timeout)[0]:
        raise RuntimeError(f"no answer within {timeout:g} s")
    return str(stream.readline())


def _cpu_of(pids: list[int]) -> float:
    return sum(harness.proc_cpu(pid) for pid in pids)


def _flux_ping_times(uri: str, target: int, n: int) -> dict[str, Any]:
    """flux-core's own ``flux ping -c n -i 0.002 target``: its per-ping times (``-i 0``
    would send the next ping without waiting for the answer, timing a flood; 2 ms apart
    each ping is alone in flight)."""
    import re
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLUX_")}
    env["FLUX_URI"] = uri
    out = subprocess.run(["flux", "ping", "-c", str(n), "-i", "0.002", str(target)], env=env,
                         capture_output=True, text=True, timeout=120 + n * 0.01).stdout
    times = sorted(float(t) * 1000 for t in re.findall(r"time=([\d.]+) ms", out))
    if len(times) != n:
        raise RuntimeError(f"flux ping printed {len(times)} times, not {n}")
    return {"p50_us": percentile(times, 50), "mean_us": statistics.fmean(times)}


def fluxcore_section(n: int, rounds: int, sizes: list[int], topologies: list[str],
                     ping_rounds: int, code: dict[str, str], one_rank: bool = True,
                     processes: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The ping of one rank (peermesh client -> flux-core, flux ping -> flux-core,
    peermesh -> peermesh, interleaved; unless not ``one_rank``), and ping all over
    flux-core instances of ``sizes`` brokers against peermesh ranks of the same size and
    topology (``fluxcore_ping_all``)."""
    import shutil
    if shutil.which("flux") is None:
        return {}, ["", "flux-core: no `flux` on PATH (flux-core >= 0.88 not found): skipped"]
    out: dict[str, Any] = {}
    lines: list[str] = []
    if not one_rank:
        ping_all = fluxcore_ping_all(sizes, topologies, ping_rounds, code, processes)
        out["ping_all"] = ping_all
        return out, ping_all_lines(ping_all)
    instance = _flux_core(2, "kary:2")
    try:
        def client_case(r: int) -> dict[str, Any]:
            with Children() as kids:
                ping = kids.start("bench_flux", "fluxcore_client", uri=instance.uri, target=1,
                                  n=n, warmup=200)
                ping.expect("ready", 60)
                return _timed(ping, [], n + 200, 60 + n / 50)

        cases = {"peermesh client -> flux-core": client_case,
                 "flux ping -> flux-core": lambda r: _flux_ping_times(instance.uri, 1, n),
                 "peermesh -> peermesh": lambda r: latency_case("one_hop", n, 200)}
        runs = interleaved(cases, rounds)
    finally:
        _flux_core_stop(instance)
    p50 = {k: statistics.median(x["p50_us"] for x in v) for k, v in runs.items()}
    base = "flux ping -> flux-core"
    ratio = {k: statistics.median(round_ratios(v, runs[base], "p50_us")) for k, v in runs.items()}
    out["ping_one_rank"] = {"runs": runs, "p50_us": p50, "vs_flux_ping": ratio}
    lines += ["", f"ping of rank 1, one hop (p50 of {n}, median of {rounds} interleaved rounds; "
              "ratio: median of per-round ratios to flux ping):"] + table(
        ["case", "p50 us", "/ flux ping"],
        [[k, f"{p50[k]:.0f}", f"{ratio[k]:.2f}"] for k in cases])
    progress("\n".join(lines))  # (the ping all rows take minutes)
    ping_all = fluxcore_ping_all(sizes, topologies, ping_rounds, code, processes)
    out["ping_all"] = ping_all
    return out, lines + ping_all_lines(ping_all)


#: the ping-all cases of section fluxcore: (key, instance, client)
PING_ALL_CASES = (("flux_core_own", "flux-core", "flux-core's client (libflux)"),
                  ("flux_core", "flux-core", "peermesh FluxClient"),
                  ("peermesh", "peermesh", "peermesh FluxClient"),
                  ("peermesh_rank0", "peermesh", "rank 0's own handle"),
                  ("peermesh_procs", "peermesh, a process per rank", "peermesh FluxClient"))


def _peermesh_processes(size: int, topology: str, code: Optional[str]) -> dict[str, Any]:
    """Ping all of peermesh ranks each in a process of its own (as flux-core's brokers
    are) by a ``FluxClient`` of rank 0, with the CPU of the ranks' processes."""
    with Children(grace=0) as kids:
        root = kids.start("bench_flux", "flux_node", code, topology=topology, root=True)
        endpoint = root.expect("ready", 120)["endpoint"]
        nodes = [root] + [kids.start("bench_flux", "flux_node", code, topology=topology,
                                     parents=[endpoint]) for _ in range(size - 1)]
        for node in nodes[1:]:
            node.expect("ready", 600)
        return _served(endpoint, size, [n.pid for n in nodes], code)


def _descendants(pid: int) -> list[int]:
    """``pid``'s processes below it (Linux: /proc/PID/task/PID/children)."""
    found, todo = [], [pid]
    while todo:
        try:
            with open(f"/proc/{todo[-1]}/task/{todo.pop()}/children") as f:
                children = [int(x) for x in f.read().split()]
        except OSError:
            continue
        found += children
        todo += children
    return found


def _served(uri: str, size: int, pids: list[int], code: Optional[str] = None
            ) -> dict[str, Any]:
    """``role_client_ping_all`` of ``uri`` (5 ping alls after a warm-up), with
    ``server_cpu_ms``: the CPU per ping all of the processes ``pids`` (the instance) over
    the 5 (heartbeats included, the client's start not)."""
    with Children(grace=0) as kids:
        client = kids.start("bench_flux", "client_ping_all", code, uri=uri, size=size, rounds=5)
        client.expect("ready", 600)
        before = _cpu_of(pids)
        client.send("go")
        result = dict(client.expect("result", 600))
    result["server_cpu_ms"] = (_cpu_of(pids) - before) / 5 * 1000
    return result


def _failed(exc: Exception) -> dict[str, Any]:
    return {"error": str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)}


def fluxcore_ping_all(sizes: list[int], topologies: list[str], rounds: int,
                      code: dict[str, str], processes: bool = False) -> list[dict[str, Any]]:
    """A ping to every rank at once (flux's body, one request per rank, all in flight
    together), ``rounds`` rounds of each size and topology: a flux-core instance
    (``flux start --test-size``) pinged by flux-core's own client and by a peermesh
    ``FluxClient`` on rank 0's local connector; then peermesh ranks of the same size
    and topology in one process (for each tree of ``code``), pinged by a ``FluxClient``
    in a process of its own on rank 0's ROUTER and by rank 0's own handle; with
    ``processes`` also peermesh ranks each in a process of its own, as flux-core's
    brokers are. Each run: the median of 5 ping alls after a warm-up."""
    results = []
    for size in sizes:
        for topology in topologies:
            runs: dict[str, list[dict[str, Any]]] = {}
            for r in range(rounds):
                progress(f"flux-core, {size} brokers, {topology} (round {r + 1}/{rounds}) ...")
                try:
                    instance = _flux_core(size, topology)
                except Exception as exc:
                    runs.setdefault("flux_core_own", []).append(_failed(exc))
                    continue
                try:
                    brokers = [instance.pid] + _descendants(instance.pid)
                    for key, case in (("flux_core_own", lambda: _flux_core_ping_all(
                                          instance.uri, size, 5, brokers)),
                                      ("flux_core", lambda: _served(instance.uri, size,
                                                                    brokers))):
                        try:
                            runs.setdefault(key, []).append(case())
                        except (harness.ChildFailed, RuntimeError) as exc:
                            runs.setdefault(key, []).append(_failed(exc))
                finally:
                    _flux_core_stop(instance)
                trees = list(code.items())
                for label, tree in trees[r % 2:] + trees[:r % 2]:  # each first in turn
                    suffix = "" if label == "peermesh" else "@" + label
                    progress(f"peermesh{suffix}, {size} ranks, {topology} ...")
                    try:
                        with Children(grace=0) as kids:
                            ranks = kids.start("bench_flux", "ranks", tree, n=size,
                                               topology=topology, flux_body=True, serve=True)
                            endpoint = ranks.expect("serving", 900)["endpoint"]
                            client = _served(endpoint, size, [ranks.pid], tree)
                            ranks.send("stop")
                            own = dict(ranks.expect("result", 120))
                            own["server_cpu_ms"] = own.pop("ping_all_cpu_ms")  # (one process)
                        runs.setdefault("peermesh" + suffix, []).append(client)
                        runs.setdefault("peermesh_rank0" + suffix, []).append(own)
                    except harness.ChildFailed as exc:
                        runs.setdefault("peermesh" + suffix, []).append(_failed(exc))
                    if processes and label == "peermesh":  # (this checkout's alone)
                        progress(f"peermesh{suffix}, {size} ranks, {topology}, a process "
                                 "per rank ...")
                        try:
                            runs.setdefault("peermesh_procs" + suffix, []).append(
                                _peermesh_processes(size, topology, tree))
                        except harness.ChildFailed as exc:
                            runs.setdefault("peermesh_procs" + suffix, []).append(_failed(exc))
            row: dict[str, Any] = {"size": size, "topology": topology, "runs": runs}
            for key, done in runs.items():
                good = [x for x in done if "error" not in x]
                row[key] = ({k: statistics.median(x[name] for x in good)
                             for k, name in (("all_ms", "ping_all_all_ms"),
                                             ("mean_ms", "ping_all_mean_ms"),
                                             ("client_cpu_ms", "ping_all_cpu_ms"),
                                             ("server_cpu_ms", "server_cpu_ms"))
                             if all(name in x for x in good)}
                            if good else {"error": done[-1]["error"]})
            for key in [k for k in runs if k.startswith("peermesh")]:
                for base in ("flux_core_own", "flux_core"):
                    pairs = [a["ping_all_all_ms"] / b["ping_all_all_ms"]
                             for a, b in zip(runs[key], runs.get(base, []))
                             if "error" not in a and "error" not in b]
                    if pairs:
                        row.setdefault("ratios", {})[f"{key}/{base}"] = statistics.median(pairs)
            results.append(row)
            progress("\n".join(ping_all_lines([row])))
    return results


def ping_all_lines(results: list[dict[str, Any]]) -> list[str]:
    """The table of ``fluxcore_ping_all``."""
    rows = []
    for row in results:
        keys = [k for k, _, _ in PING_ALL_CASES]
        keys += sorted(k for k in row["runs"] if k not in keys)
        for key in keys:
            if key not in row:
                continue
            base = key.split("@")[0]
            names = {k: (instance, client) for k, instance, client in PING_ALL_CASES}
            instance, client = names.get(base, (key, ""))
            if "@" in key:
                instance += f" [{key.split('@')[1]}]"
            cell = row[key]
            ratios = row.get("ratios", {})
            cpu = [f"{cell[k]:.1f}" if k in cell else "" for k in ("server_cpu_ms",
                                                                      "client_cpu_ms")]
            rows.append([str(row["size"]), row["topology"], instance, client,
                         cell.get("error", f"{cell.get('mean_ms', 0):.2f}"),
                         "" if "error" in cell else f"{cell['all_ms']:.2f}", *cpu,
                         f"{ratios[key + '/flux_core_own']:.2f}"
                         if key + "/flux_core_own" in ratios else "",
                         f"{ratios[key + '/flux_core']:.2f}" if key + "/flux_core" in ratios
                         else ""])
    return ["", "a ping to every rank at once, flux's body, one request per rank (flux-core: "
            "a broker process per rank; peermesh: every rank in one process; each run the "
            "median of 5; rounds: medians, ratios: median of per-round ratios of 'all'; CPU "
            "per ping all: the instance's processes, the client's):"
            ] + table(["ranks", "topology", "instance", "client", "mean ms", "all ms",
                       "CPU ms: instance", "client", "all / flux-core's own",
                       "all / flux-core, same client"], rows)


def child_result(role: str, timeout: float, code: Optional[str] = None,
                 **kwargs: Any) -> dict[str, Any]:
    with Children(grace=0) as kids:
        return dict(kids.start("bench_flux", role, code, **kwargs).expect("result", timeout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="latency,pingall,events,sim,thousand",
                        help="sections, comma-separated (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="latency rounds (default: 3)")
    parser.add_argument("-n", type=int, default=2000, help="round trips per latency run")
    parser.add_argument("--ranks", type=int, default=512, help="real-socket ranks (512)")
    parser.add_argument("--pingall-rounds", type=int, default=1,
                        help="runs of ping all per topology (the plain-pyzmq trees and "
                             "Flux in turn)")
    parser.add_argument("--events", type=int, default=20, help="events published (20)")
    parser.add_argument("--sim-sizes", default="100,1000,10000")
    parser.add_argument("--fluxcore-sizes", default="16,64",
                        help="flux-core instance sizes of section fluxcore (16,64)")
    parser.add_argument("--fluxcore-topologies", default="kary:2,kary:32",
                        help="topologies of section fluxcore's ping all (kary:2,kary:32)")
    parser.add_argument("--fluxcore-processes", action="store_true",
                        help="section fluxcore's ping all also over peermesh ranks each in "
                             "a process of its own, as flux-core's brokers (slow to start)")
    parser.add_argument("--fluxcore-rounds", type=int, default=1,
                        help="rounds of section fluxcore's ping all (a new flux-core "
                             "instance and new peermesh ranks each; default: 1)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the Flux cases with this commit's code (or a tree)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = set(args.only.split(","))
    load = os.getloadavg()
    out: dict[str, Any] = {"loadavg": load}
    lines: list[str] = [f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"]
    code = harness.trees(args.baseline)
    if "latency" in only:
        cases = {kind: (lambda r, kind=kind: latency_case(kind, args.n, 200))
                 for kind in ("raw", "raw_chain", "hub")}
        for label, tree in code.items():
            suffix = "" if label == "peermesh" else "@base"
            for kind in ("one_hop", "three_hops"):
                cases[kind + suffix] = (lambda r, kind=kind, tree=tree:
                                        latency_case(kind, args.n, 200, tree))
        runs = interleaved(cases, args.rounds)
        p50 = {k: statistics.median(r["p50_us"] for r in v) for k, v in runs.items()}

        def vs(case: str, ceiling: str) -> float:
            return statistics.median(round_ratios(runs[case], runs[ceiling], "p50_us"))

        ratios = {case: {"raw": vs(case, "raw"), "raw_chain": vs(case, "raw_chain")}
                  for case in runs if case not in ("raw", "raw_chain")}
        out["latency"] = {"runs": runs, "ratios": ratios,
                          "one_hop_ratio": ratios["one_hop"]["raw"],
                          "three_hops_ratio": ratios["three_hops"]["raw"],
                          "three_hops_vs_chain": ratios["three_hops"]["raw_chain"]}
        # CPU per round trip (medians of rounds): the pinger's, and the other processes' summed
        ping_cpu = {k: statistics.median(r["ping_cpu_us"] for r in v) for k, v in runs.items()}
        rest_cpu = {k: statistics.median(r["others_cpu_us"] for r in v) for k, v in runs.items()}

        def row(case: str, name: str, echo: str, chain: str, judged: str) -> list[str]:
            return [name, f"{p50[case]:.0f}", echo, chain, f"{ping_cpu[case]:.0f}",
                    f"{rest_cpu[case]:.0f}", judged]

        rows_l = [row("raw", "raw DEALER<->ROUTER echo (2 processes)", "1",
                      f"{p50['raw'] / p50['raw_chain']:.2f}", ""),
                  row("raw_chain", "raw chain, 2 forwarders (4 processes)",
                      f"{p50['raw_chain'] / p50['raw']:.2f}", "1", ""),
                  row("hub", "peermesh socket driver echo, no Flux (2)",
                      f"{ratios['hub']['raw']:.2f}", f"{ratios['hub']['raw_chain']:.2f}", "")]
        for case, name, target in (("one_hop", "flux one hop", TARGET_ONE_HOP),
                                   ("three_hops", "flux three hops", TARGET_THREE_HOPS)):
            for suffix in [""] + (["@base"] if "baseline" in code else []):
                r = ratios[case + suffix]
                rows_l.append(row(case + suffix, name + (" [baseline]" if suffix else ""),
                                  f"{r['raw']:.2f}", f"{r['raw_chain']:.2f}",
                                  "" if suffix else verdict(r["raw"], target, False)))
        lines += ["", "RPC round trip p50 (median of rounds; ratios: median of per-round "
                  "ratios; CPU per round trip, us: the pinger, the other processes summed):"
                  ] + table(["case", "p50 us", "/ echo", "/ chain", "CPU ping", "CPU others",
                             "verdict"], rows_l)
        if "baseline" in code:
            lines.append(f"baseline code: {args.baseline} ({code['baseline']})")
    rows, ceilings = [], []
    for topology in ("kary:2", "kary:32"):
        if "pingall" in only:
            runs: dict[str, list[dict[str, Any]]] = {}
            for _ in range(args.pingall_rounds):  # the raw ceilings and each code, in turn
                for routes in (False, True):
                    progress(f"{args.ranks} ranks in plain pyzmq, {topology}"
                             f"{' with route stacks' if routes else ''} ...")
                    row = child_result("raw_tree", 900, n=args.ranks,
                                       k=int(topology.split(":")[1]), routes=routes)
                    runs.setdefault(row["code"], []).append(row)
                for label, tree in code.items():
                    progress(f"{args.ranks} ranks on real sockets, {topology} ({label}) ...")
                    row = child_result("ranks", 900, tree, n=args.ranks, topology=topology,
                                       events=args.events if "events" in only else 0)
                    row["code"] = label
                    runs.setdefault(label, []).append(row)
            for done in runs.values():
                for run in done:   # (the tree a run formed: its own hops)
                    run["main_us_per_hop"] = run["ping_all_main_ms"] * 1000 / run.get(
                        "hops", hops(args.ranks, topology))
            for label, done in runs.items():
                row = median_run(done, "ping_all_mean_ms")
                row["vs_raw"] = statistics.median(
                    round_ratios(done, runs["raw pyzmq"], "ping_all_mean_ms"))
                row["main_vs_raw"] = statistics.median(
                    round_ratios(done, runs["raw pyzmq"], "main_us_per_hop"))
                row["main_us_per_hop"] = statistics.median(r["main_us_per_hop"] for r in done)
                ceilings.append(row)
                if not label.startswith("raw pyzmq"):
                    rows.append(row)
        elif "events" in only and topology == "kary:32":
            for label, tree in code.items():
                progress(f"{args.ranks} ranks on real sockets, {topology} ({label}) ...")
                row = child_result("ranks", 900, tree, n=args.ranks, topology=topology,
                                   events=args.events)
                row["code"] = label
                rows.append(row)
    if "fluxcore" in only or "fluxcore-pingall" in only:
        section, more = fluxcore_section(
            args.n, args.rounds, [int(x) for x in args.fluxcore_sizes.split(",") if x],
            [x for x in args.fluxcore_topologies.split(",") if x], args.fluxcore_rounds, code,
            one_rank="fluxcore" in only, processes=args.fluxcore_processes)
        out["fluxcore"] = section
        lines += more
    if "thousand" in only:
        progress("1,000 ranks on real sockets, kary:32 ...")
        rows.append(child_result("ranks", 900, n=1000, topology="kary:32", rounds=3))
    if rows:
        out["ranks"] = rows
        lines += ["", f"ping all on real sockets, every rank in one process (flux-core: mean "
                  f"{FLUX_CORE_PING_ALL_MS:g} ms at 480 ranks on 30 nodes):"] + table(
            ["code", "ranks", "topology", "start s", "converge s", "mean ms", "max ms",
             "all ms", "CPU ms", "fds",
             "fds/rank", "event us CPU/delivery"],
            [[r.get("code", "peermesh"), str(r["ranks"]), r["topology"], f"{r['start_s']:.2f}",
              f"{r['converge_s']:.2f}",
              f"{r['ping_all_mean_ms']:.1f}", f"{r['ping_all_max_ms']:.1f}",
              f"{r['ping_all_all_ms']:.1f}", f"{r['ping_all_cpu_ms']:.1f}", str(r["fds"]),
              f"{r['fds_per_rank']:.1f}",
              f"{r['event_cpu_us_per_delivery']:.1f}" if "event_cpu_us_per_delivery" in r
              else ""] for r in rows])
    if ceilings:
        out["ping_all_vs_raw"] = ceilings
        lines += ["", f"ping all next to its plain-pyzmq ceiling ({args.ranks} ranks, one process; "
                  f"median of {args.pingall_rounds} run(s) of 5; CPU of one ping all by thread):"
                  ] + table(
            ["topology", "code", "mean ms", "all ms", "main thread ms", "I/O thread ms",
             "main us/hop", "main / raw", "mean / raw", "verdict"],
            [[r["topology"], r.get("code", "peermesh"), f"{r['ping_all_mean_ms']:.1f}",
              f"{r['ping_all_all_ms']:.1f}", f"{r['ping_all_main_ms']:.1f}",
              f"{r['ping_all_zmq_ms']:.1f}", f"{r['main_us_per_hop']:.2f}",
              f"{r['main_vs_raw']:.2f}", f"{r['vs_raw']:.2f}",
              verdict(r["ping_all_mean_ms"], FLUX_CORE_PING_ALL_MS, False)]
             for r in ceilings])
    if "sim" in only:
        sims = []
        for n in [int(x) for x in args.sim_sizes.split(",") if x]:
            progress(f"{n} simulated ranks ...")
            sims.append(child_result("sim", 1800, n=n, topology="kary:32"))
        out["sim"] = sims
        lines += ["", "one event to every simulated rank (kary:32, 1 ms links):"] + table(
            ["ranks", "online", "depth", "build+converge s", "virtual ms", "wall ms", "RSS MB"],
            [[str(s["ranks"]), str(s["online"]), str(s["depth"]),
              f"{s['build_and_converge_s']:.1f}",
              f"{s['event_virtual_ms']:.1f}", f"{s['event_wall_ms']:.0f}",
              f"{s['rss_mb']:.0f}"] for s in sims])
    print(dump_json(out) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    harness.run(main)
