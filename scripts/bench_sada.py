#!/usr/bin/env python3
"""Benchmark Safir-Darbaan request/reply against raw pyzmq, in one run.

Everything stays on 127.0.0.1; no node beacons: servers are pointed at the
channel's endpoint directly. Every client and server is a child process
(this file with ``--role``); this process only tells the clients when to
run, so it takes no CPU from them. Payload: a small msgpack'd dict
(``{"i": n, "pad": 64 bytes}``), packed and unpacked by every client.

1. sequential round trips, one client and one server: the raw pyzmq echo
   (a DEALER sends one frame, a blocking ROUTER echoes it: the baseline of
   issue 4), the same raw pyzmq round trip with a SADA REQ's nine frames
   answered by a REP's six (what the spec's frame layout costs a plain pyzmq
   program, a frame per call), channel -> server with the demo
   ``echo`` (an inline handler) and with a handler in its own greenlet (the
   default for handlers);
2. pipelined (a window of requests in flight; for the channel, as many
   greenlets each calling ``request``): raw (one frame, and a REQ's and a
   REP's frames as in 1.) vs channel with 1 and with 4
   server processes, all with the echo handler (the channel is the
   bottleneck: its core saturates with one server already);
3. server-bound, pipelined: the channel -> 1, 2 and 4 servers whose handler
   has a fixed service time that burns no CPU and serves one request at a
   time per server (an inline handler that blocks its whole process in
   ``time.sleep(--service-ms)``, so a server answers at most ~1,000/s at
   1 ms): throughput should scale with the servers until the channel
   saturates; the ratios 2/1 and 4/1 and how requests spread over the servers
   are reported;
4. failover: 3 servers under pipelined load with ``retries=1``; one is
   SIGKILLed; how long until the channel dropped it, until every request it
   held was answered by the others, the longest gap between replies, and
   whether any request failed.

Cases 1-3 run in interleaved rounds (every case once per round), so load
from other work on the machine hits all cases alike; rates are the median of
the rounds. For every case the CPU used during its runs is reported as % of
one core (CPU seconds / wall seconds): the channel's (or raw client's) whole
process and its hub thread (``getrusage`` and ``time.thread_time`` in that
child), its servers' (``/proc/PID/stat``) and the rest of the machine's
(``/proc/stat`` minus those: other work, e.g. other benchmarks), with the
share of replies each server gave. ``--baseline REV`` adds the channel cases
once more with the peermesh of an older commit (or of a directory holding a
peermesh package), interleaved with the rest.
Prints a table with ratios against the targets of issue 4 (sequential >= 60%
of raw, p99 <= 1 ms, pipelined throughput scaling with servers until the
channel's core saturates, failover within 2 x ping interval); ``--json``
prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time
from typing import Any, Callable, Optional

import harness
from harness import (LOOPBACK, Child, Children, Parent, cpu, dump_json, free_tcp_endpoint,
                     interleaved, machine_cpu, percentile, proc_cpu, progress, table, trees)

PAD = b"x" * 64
SADA_HEAD = [b"", b"SADA1", b"REQ", b"0123456789abcdef-1", b"echo", b"1.0", b"", b"echo"]
TARGETS = {"sequential_ratio": 0.60, "p99_ms": 1.0, "failover_intervals": 2.0,
           # k servers scale when they reach this share of k x one server's rate ...
           "scaling_efficiency": 0.80,
           # ... or when the channel's process is this busy, of one core (it is saturated)
           "channel_saturated": 0.90}


# ---------------------------------------------------------------------------
# roles: each runs in a child process of its own (harness.Children.start)


def role_raw_echo(parent: Parent, endpoint: str) -> None:
    """A plain blocking ROUTER (bound at ``endpoint``) that echoes every message, but
    answers a SADA REQ's frames with a REP's (request id, status 200, the payload)."""
    import zmq
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    parent.send("ready")
    recv, send, more = sock.recv, sock.send, zmq.SNDMORE
    while True:
        frames = [recv(copy=False)]
        while frames[-1].more:
            frames.append(recv(copy=False))
        if len(frames) == 10:
            frames = [frames[0], b"", b"SADA1", b"REP", frames[4], b"200", frames[9]]
        for frame in frames[:-1]:
            send(frame, more)
        send(frames[-1])


def role_sada_server(parent: Parent, endpoint: str, service_s: float) -> None:
    """A peermesh Server with the demo echo service, connected to ``endpoint``.

    ``bench/spawned`` echoes in a greenlet of its own; ``bench/service`` is the
    server-bound handler: inline, it blocks the whole process in ``time.sleep``
    for ``service_s`` seconds (no CPU burnt, one request at a time), then echoes.
    """
    import gevent

    from peermesh.sada import Server, echo_service
    server = Server(channels=[endpoint], services=[echo_service()])

    @server.handler("bench", "spawned")
    def spawned(payload: Any) -> Any:
        return payload

    @server.handler("bench", "service", raw=True, inline=True)
    def service(payload: bytes, sleep: Any = time.sleep, seconds: float = service_s) -> bytes:
        sleep(seconds)      # not gevent's: nothing else in this process runs meanwhile
        return payload

    server.start()
    parent.send("ready")
    gevent.wait()


def _cpu() -> tuple[float, float]:
    """CPU seconds used so far by this whole process and by its current thread."""
    return cpu(), time.thread_time()


def _cpu_used(before: tuple[float, float]) -> dict[str, float]:
    """CPU seconds used since ``before`` (an earlier ``_cpu()``), process and thread."""
    now = _cpu()
    return {"cpu": now[0] - before[0], "hub_cpu": now[1] - before[1]}


def role_raw_client(parent: Parent, endpoint: str) -> dict[str, Any]:
    """A raw DEALER client of a ``raw-echo`` at ``endpoint``, run on command."""
    import msgpack
    import zmq
    sock = zmq.Context().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    more = zmq.SNDMORE
    clock = time.perf_counter

    def run(cmd: dict[str, Any]) -> dict[str, Any]:
        """``n`` round trips, ``window`` in flight (1 = sequential). ``sada_frames``:
        send a SADA REQ's nine frames instead of one (and get a REP's six back)."""
        n, window = cmd["n"], cmd["window"]
        if cmd.get("sada_frames"):
            def send(payload: bytes) -> None:
                for frame in SADA_HEAD:
                    sock.send(frame, more)
                sock.send(payload)

            def recv() -> bytes:
                frame = sock.recv(copy=False)
                while frame.more:
                    frame = sock.recv(copy=False)
                return frame.bytes
        else:
            send, recv = sock.send, sock.recv
        samples: list[float] = []
        cpu = _cpu()
        start = clock()
        if window == 1:
            for i in range(n):
                t = clock()
                send(msgpack.packb({"i": i, "pad": PAD}))
                msgpack.unpackb(recv())
                samples.append(clock() - t)
        else:
            sent_at: list[float] = []
            sent = received = 0
            while received < n:
                while sent < n and sent - received < window:
                    sent_at.append(clock())
                    send(msgpack.packb({"i": sent, "pad": PAD}))
                    sent += 1
                reply = msgpack.unpackb(recv())
                samples.append(clock() - sent_at[reply["i"]])
                received += 1
        wall = clock() - start
        return {"samples": samples, "wall": wall, **_cpu_used(cpu)}

    parent.send("ready")
    parent.serve(run)
    return {}


def role_sada_client(parent: Parent) -> dict[str, Any]:
    """A ``Channel`` on 127.0.0.1 (its endpoint follows READY), run on command.

    Pipelined: ``window`` greenlets, each sending its next request when its
    last one is answered (the way a gevent program keeps requests in flight).
    """
    import gevent

    from peermesh.sada import Channel
    channel = Channel(address=LOOPBACK, ping_interval=1.0).start()
    clock = time.perf_counter

    def run(cmd: dict[str, Any]) -> dict[str, Any]:
        if cmd["op"] == "wait":
            return {"ok": channel.wait_for("echo", count=cmd["count"], timeout=10)}
        n, window, action = cmd["n"], cmd["window"], cmd["action"]
        service = "echo" if action == "echo" else "bench"
        samples: list[float] = []
        replies = {s.id: s.replies for s in channel.servers()}
        cpu = _cpu()
        start = clock()
        if window == 1:
            request = channel.request
            for i in range(n):
                t = clock()
                request(service, action, {"i": i, "pad": PAD})
                samples.append(clock() - t)
        else:
            numbers = iter(range(n))

            def sender() -> None:
                for i in numbers:
                    t = clock()
                    channel.request(service, action, {"i": i, "pad": PAD})
                    samples.append(clock() - t)

            gevent.joinall([gevent.spawn(sender) for _ in range(min(window, n))],
                           raise_error=True)
        wall = clock() - start
        used = _cpu_used(cpu)
        served = {s.id: s.replies - replies.get(s.id, 0) for s in channel.servers()}
        return {"samples": samples, "wall": wall, **used, "served": served}

    parent.send("ready", channel.endpoint)
    parent.serve(run, green=True)
    return {}


# ---------------------------------------------------------------------------
# the parent: set-ups, interleaved rounds, failover


class Setup:
    """A client child and the server children it talks to."""

    def __init__(self, client: Child, servers: list[Child]) -> None:
        self.client, self.servers = client, servers


def raw_setup(children: Children) -> Setup:
    """A raw echo child and a raw client child of it."""
    endpoint = free_tcp_endpoint()
    echo = children.start("bench_sada", "raw_echo", endpoint=endpoint)
    echo.expect("ready", 30)
    client = children.start("bench_sada", "raw_client", endpoint=endpoint)
    client.expect("ready", 30)
    return Setup(client, [echo])


def sada_setup(children: Children, servers: int, code: str, service_s: float) -> Setup:
    """A channel child and ``servers`` server children, peermesh from ``code``."""
    client = children.start("bench_sada", "sada_client", code)
    endpoint = client.expect("ready", 30)
    procs = [children.start("bench_sada", "sada_server", code, endpoint=endpoint,
                            service_s=service_s) for _ in range(servers)]
    for proc in procs:
        proc.expect("ready", 30)
    if not client.ask(op="wait", count=servers)["ok"]:
        raise RuntimeError("servers did not introduce themselves")
    return Setup(client, procs)


def run_case(setup: Setup, cmd: dict[str, Any]) -> dict[str, Any]:
    """One run of a case; adds the CPU its servers and the whole machine used meanwhile."""
    servers = setup.servers
    before = [proc_cpu(p.pid) for p in servers], machine_cpu(), time.perf_counter()
    part = setup.client.ask(op="run", **cmd)
    wall = time.perf_counter() - before[2]
    part["servers_cpu"] = sum(proc_cpu(p.pid) for p in servers) - sum(before[0])
    part["machine_cpu"] = machine_cpu() - before[1]
    part["outer_wall"] = wall
    return part


def rounds_of(cases: dict[str, tuple[Setup, dict[str, Any]]], n: int,
              rounds: int) -> dict[str, dict[str, Any]]:
    """Run every case ``rounds`` times, interleaved, after one warm-up run each.

    Per case: ``per_s`` is the median of the rounds' rates, percentiles come
    from all samples together, CPU shares (of one core: CPU seconds / wall
    seconds) from all rounds together. A case's ``cmd`` may set its own ``n``.
    """
    for setup, cmd in cases.values():      # warm-up round, not counted
        setup.client.ask(op="run", **{**cmd, "n": min(500, cmd.get("n", n))})
    def case(setup: Setup, cmd: dict[str, Any]) -> Callable[[int], dict[str, Any]]:
        return lambda _: run_case(setup, {"n": n, **cmd})
    runs = interleaved({name: case(*c) for name, c in cases.items()}, rounds)
    result = {}
    for name, parts in runs.items():
        us = sorted(s * 1e6 for part in parts for s in part["samples"])
        wall = sum(p["wall"] for p in parts)
        outer = sum(p["outer_wall"] for p in parts)
        ours = sum(p["cpu"] + p["servers_cpu"] for p in parts)
        machine = sum(p["machine_cpu"] for p in parts)
        result[name] = {
            "round_trips": len(us),
            "per_s": statistics.median(len(p["samples"]) / p["wall"] for p in parts),
            "p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
            "mean_us": statistics.fmean(us),
            # % of one core; the client's own from its child (getrusage), the rest from /proc
            "cpu_pct": {"client": 100 * sum(p["cpu"] for p in parts) / wall,
                        "client_hub": 100 * sum(p["hub_cpu"] for p in parts) / wall,
                        "servers": 100 * sum(p["servers_cpu"] for p in parts) / outer,
                        "other": 100 * max(0.0, machine - ours) / outer,
                        "machine": 100 * machine / outer}}
        # CPU per round trip (µs): steadier than rates on a loaded machine
        result[name]["cpu_us"] = {"client": 1e6 * sum(p["cpu"] for p in parts) / len(us),
                                  "servers": 1e6 * sum(p["servers_cpu"] for p in parts) / len(us)}
        # ... and per round, to pair with another case's of the same round
        result[name]["rounds"] = [{"client": 1e6 * p["cpu"] / len(p["samples"]),
                                   "servers": 1e6 * p["servers_cpu"] / len(p["samples"]),
                                   "per_s": len(p["samples"]) / p["wall"]} for p in parts]
        if "served" in parts[0]:
            served: dict[str, int] = {}
            for part in parts:
                for server, count in part["served"].items():
                    served[server] = served.get(server, 0) + count
            result[name]["served_per_server"] = sorted(served.values(), reverse=True)
    return result


def bench_failover(servers: int, window: int, ping_interval: float, seconds: float,
                   service_s: float) -> dict[str, Any]:
    """Pipelined load on ``servers`` servers; SIGKILL one halfway; measure recovery."""
    import gevent

    from peermesh.sada import Channel
    channel = Channel(address=LOOPBACK, ping_interval=ping_interval).start()
    try:
        with Children() as children:
            procs = [children.start("bench_sada", "sada_server", endpoint=channel.endpoint,
                                    service_s=service_s) for _ in range(servers)]
            for proc in procs:
                proc.expect("ready", 30)
            if not channel.wait_for("echo", count=servers, timeout=10):
                raise RuntimeError("servers did not introduce themselves")
            clock = time.perf_counter
            replies: list[float] = []          # times of replies
            failures: list[str] = []
            outstanding: dict[int, Any] = {}
            state = {"next": 0, "stop": False}

            def send_one() -> None:
                i = state["next"]
                state["next"] += 1
                # a 2 ms handler, so that every server holds requests when one is killed
                result = channel.request_async("echo", "sleep", {"seconds": 0.002, "value": i},
                                               retries=1, timeout=10)
                outstanding[i] = result
                result.rawlink(lambda r, i=i: on_reply(r, i))

            def on_reply(result: Any, i: int) -> None:
                del outstanding[i]
                if result.successful():
                    if result.value != i:
                        failures.append(f"request {i} answered with {result.value!r}")
                    replies.append(clock())
                else:
                    failures.append(f"request {i}: {result.exception!r}")
                if not state["stop"]:
                    send_one()

            for _ in range(window):
                send_one()
            gevent.sleep(seconds / 2)
            victim = procs[0]
            before = len(channel.servers())
            killed_at = clock()
            os.kill(victim.pid, signal.SIGKILL)
            deadline = killed_at + 10
            before_kill = set(outstanding)      # every request in flight at the kill
            while len(channel.servers()) >= before and clock() < deadline:
                gevent.sleep(0.001)
            dropped_at = clock()
            while before_kill & set(outstanding) and clock() < deadline:
                gevent.sleep(0.001)
            recovered_at = clock()
            victim.process.wait(5)
            gevent.sleep(seconds / 2)
            state["stop"] = True
            gevent.wait([*outstanding.values()], timeout=15)
            gaps = [b - a for a, b in zip(replies, replies[1:]) if a >= killed_at - 1]
            return {"servers": servers, "window": window, "ping_interval_s": ping_interval,
                    "held_by_victim_at_kill": channel.stats["failovers"],
                    "dropped_after_ms": (dropped_at - killed_at) * 1000,
                    "recovered_after_ms": (recovered_at - killed_at) * 1000,
                    "longest_reply_gap_ms": max(gaps) * 1000 if gaps else float("nan"),
                    "requests": state["next"], "failed": len(failures),
                    "failures": failures[:5], "unanswered": len(outstanding)}
    finally:
        channel.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    versions = {"": trees(None)["peermesh"]}
    for i, rev in enumerate(args.baseline or []):
        versions[baseline_tag(i)] = trees(rev)["baseline"]
    service_s = args.service_ms / 1000
    with Children(grace=0) as children:
        raw = raw_setup(children)
        setups = {k: {tag: sada_setup(children, k, tree, service_s)
                      for tag, tree in versions.items()}
                  for k in ((1,) if args.pipelined_only else (1, 2, 4))}
        one = setups[1]
        if args.pipelined_only:
            w = args.window
            pipelined_1: dict[str, tuple[Setup, dict[str, Any]]] = {
                "raw_pipe": (raw, {"window": w}),
                "raw_pipe_sada_frames": (raw, {"window": w, "sada_frames": True})}
            for tag in versions:
                pipelined_1[f"sada_pipe_1{tag}"] = (one[tag], {"window": w, "action": "echo"})
            progress(f"pipelined, 1 server (window {w}): {args.rounds} interleaved rounds")
            results.update(rounds_of(pipelined_1, args.n * 2, args.rounds))
            results["ratios"] = {f"pipelined_1_vs_raw{tag}": results[f"sada_pipe_1{tag}"]["per_s"]
                                 / results["raw_pipe"]["per_s"] for tag in versions}
            results["ratios"]["raw_pipe_sada_frames_vs_raw"] = frames_ceiling(results)
            results["baselines"] = dict(zip(list(versions)[1:], args.baseline or []))
            for tag in results["baselines"]:
                results["ratios"][f"sada_pipe_1_vs{tag}"] = (
                    results["sada_pipe_1"]["per_s"] / results[f"sada_pipe_1{tag}"]["per_s"])
                results["ratios"][f"paired{tag}"] = paired(results["sada_pipe_1"],
                                                           results[f"sada_pipe_1{tag}"])
            results["load_average"] = os.getloadavg()
            return results
        four = setups[4]
        progress(f"sequential: {args.rounds} interleaved rounds of {args.n} round trips")
        sequential: dict[str, tuple[Setup, dict[str, Any]]] = {
                      "raw_seq": (raw, {"window": 1}),
                      "raw_seq_sada_frames": (raw, {"window": 1, "sada_frames": True})}
        for tag in versions:
            sequential[f"sada_seq{tag}"] = (one[tag], {"window": 1, "action": "echo"})
            sequential[f"sada_seq_spawned{tag}"] = (one[tag], {"window": 1, "action": "spawned"})
        results.update(rounds_of(sequential, args.n, args.rounds))
        progress(f"pipelined (window {args.window}): {args.rounds} interleaved rounds")
        w = args.window
        pipelined: dict[str, tuple[Setup, dict[str, Any]]] = {
            "raw_pipe": (raw, {"window": w}),
            "raw_pipe_sada_frames": (raw, {"window": w, "sada_frames": True})}
        for tag in versions:
            pipelined[f"sada_pipe_1{tag}"] = (one[tag], {"window": w, "action": "echo"})
            pipelined[f"sada_pipe_4{tag}"] = (four[tag], {"window": w, "action": "echo"})
        results.update(rounds_of(pipelined, args.n * 2, args.rounds))
        progress(f"server-bound (handler blocks {args.service_ms:g} ms; window {w}): "
                 f"{args.rounds} interleaved rounds")
        bound = {}
        for tag in versions:
            for k, setup in setups.items():
                bound[f"sada_bound_{k}{tag}"] = (setup[tag], {"window": w, "action": "service",
                                                              "n": args.bound_n * k})
        results.update(rounds_of(bound, args.bound_n, args.rounds))
    progress("failover: SIGKILL one of 3 servers under load")
    results["failover"] = bench_failover(3, args.window, args.ping_interval, args.failover_s,
                                         service_s)
    raw_seq = results["raw_seq"]["per_s"]
    ratios = results["ratios"] = {}
    for tag in versions:
        ratios[f"sequential_vs_raw{tag}"] = results[f"sada_seq{tag}"]["per_s"] / raw_seq
        ratios[f"sequential_spawned_vs_raw{tag}"] = (results[f"sada_seq_spawned{tag}"]["per_s"]
                                                     / raw_seq)
        ratios[f"pipelined_1_vs_raw{tag}"] = (results[f"sada_pipe_1{tag}"]["per_s"]
                                              / results["raw_pipe"]["per_s"])
        ratios[f"pipelined_4_vs_1{tag}"] = (results[f"sada_pipe_4{tag}"]["per_s"]
                                            / results[f"sada_pipe_1{tag}"]["per_s"])
        for k in (2, 4):
            ratios[f"bound_{k}_vs_1{tag}"] = (results[f"sada_bound_{k}{tag}"]["per_s"]
                                             / results[f"sada_bound_1{tag}"]["per_s"])
    ratios["raw_sada_frames_vs_raw"] = results["raw_seq_sada_frames"]["per_s"] / raw_seq
    ratios["raw_pipe_sada_frames_vs_raw"] = frames_ceiling(results)
    results["baselines"] = {}
    for i, rev in enumerate(args.baseline or []):
        tag = baseline_tag(i)
        results["baselines"][tag] = f"{rev} ({versions[tag]})"
        for key in NAMES:
            if key.startswith("sada"):
                ratios[f"{key}_vs{tag}"] = results[key]["per_s"] / results[key + tag]["per_s"]
    results["service_ms"] = args.service_ms
    results["cores"] = os.cpu_count()
    for tag in versions:
        results["scaling" + tag] = scaling(results, tag)
    results["load_average"] = os.getloadavg()
    return results


NAMES = {"raw_seq": "raw pyzmq echo (1 frame), sequential",
         "raw_seq_sada_frames": "raw pyzmq, SADA REQ/REP frames, sequential",
         "sada_seq": "channel->1 server, sequential (inline)",
         "sada_seq_spawned": "channel->1 server, sequential (greenlet)",
         "raw_pipe": "raw pyzmq echo, pipelined",
         "raw_pipe_sada_frames": "raw pyzmq, SADA REQ/REP frames, pipelined",
         "sada_pipe_1": "channel->1 server, pipelined",
         "sada_pipe_4": "channel->4 servers, pipelined",
         "sada_bound_1": "channel->1 server, server-bound",
         "sada_bound_2": "channel->2 servers, server-bound",
         "sada_bound_4": "channel->4 servers, server-bound"}
PIPELINED = [key for key in NAMES if "pipe" in key or "bound" in key]


def frames_ceiling(results: dict[str, Any]) -> float:
    """Pipelined, raw pyzmq with a REQ's and a REP's frames (a frame per call, as a plain
    pyzmq program sends and reads them) over the one-frame echo: the median of the rounds'
    ratios."""
    return paired(results["raw_pipe_sada_frames"], results["raw_pipe"])["per_s"]


def paired(now: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """The median over the rounds of this checkout's CPU per round trip (channel, servers)
    and rate over the baseline's in the same round: load that comes and goes between
    rounds cancels out."""
    return {key: statistics.median(a[key] / b[key] for a, b in zip(now["rounds"], base["rounds"]))
            for key in ("client", "servers", "per_s")}


def baseline_tag(i: int) -> str:
    """The suffix of the results of the ``i``-th ``--baseline`` (from 0)."""
    return "_before" if i == 0 else f"_before{i + 1}"


def tag_label(tag: str) -> str:
    """How a result's tag reads in the report: nothing, or which baseline."""
    return "" if not tag else " [baseline]" if tag == "_before" else \
        f" [baseline {tag[len('_before'):]}]"


def scaling(r: dict[str, Any], tag: str = "") -> dict[str, Any]:
    """Issue 4's scaling target judged on the server-bound cases (and the echo ones).

    k servers scale when they reach ``scaling_efficiency`` x k x one server's
    rate, or are excused when the channel's process uses ``channel_saturated``
    of a core (its hub thread plus ZeroMQ's I/O thread: the channel is
    saturated, more servers cannot help). The echo case with one server says
    whether the channel saturates there already.
    """
    one = r[f"sada_bound_1{tag}"]["per_s"]
    verdicts = {}
    for k in (2, 4):
        case = r[f"sada_bound_{k}{tag}"]
        channel = case["cpu_pct"]["client"] / 100
        ratio = case["per_s"] / one
        verdicts[k] = {"ratio": ratio, "efficiency": ratio / k, "channel_cpu": channel,
                       "hub_cpu": case["cpu_pct"]["client_hub"] / 100,
                       "scaled": ratio >= TARGETS["scaling_efficiency"] * k,
                       "saturated": channel >= TARGETS["channel_saturated"]}
    echo = r[f"sada_pipe_1{tag}"]["cpu_pct"]
    cores = r["cores"] or 1
    return {"servers": verdicts, "met": all(v["scaled"] or v["saturated"]
                                            for v in verdicts.values()),
            "echo_channel_1": echo["client"] / 100, "echo_hub_1": echo["client_hub"] / 100,
            "echo_machine_1": echo["machine"] / 100 / cores,
            "echo_channel_saturated": echo["client"] / 100 >= TARGETS["channel_saturated"],
            "echo_machine_saturated":
                echo["machine"] / 100 / cores >= TARGETS["channel_saturated"]}


def scaling_lines(r: dict[str, Any], tag: str) -> list[str]:
    what = tag_label(tag)
    v = r["scaling" + tag]
    lines = []
    for k, x in v["servers"].items():
        reason = ("scales" if x["scaled"] else "channel saturated" if x["saturated"]
                  else "DOES NOT SCALE")
        label = f"server-bound {k} servers / 1{what}:"
        lines.append(f"{label:45}{x['ratio']:5.2f}  ({x['efficiency']:.0%} of {k}x; channel "
                     f"{x['channel_cpu']:.0%} of a core: {reason})")
    lines.append(
        f"  target: throughput scales with servers until the channel's core saturates{what}: "
        f"{'met' if v['met'] else 'MISSED'}\n"
        f"  (k servers scale: >= {TARGETS['scaling_efficiency']:.0%} of k x one server's rate, "
        f"or the channel's process >= {TARGETS['channel_saturated']:.0%} of a core)")
    if v["echo_channel_saturated"]:
        why = ("the channel is saturated with one server already (a core's worth), so more "
               f"servers cannot raise the echo rate; on {r['cores']} cores they take CPU from it")
    elif v["echo_machine_saturated"]:
        why = (f"the machine is saturated ({v['echo_machine_1']:.0%} of its cores busy): the "
               "channel's process cannot get more than the share it has")
    else:
        why = (f"below {TARGETS['channel_saturated']:.0%} of a core, and the machine below "
               f"{TARGETS['channel_saturated']:.0%} of its cores: neither counts as saturated")
    lines.append(f"  echo, 1 server{what}: channel process {v['echo_channel_1']:.0%} of a core "
                 f"(hub thread {v['echo_hub_1']:.0%}); {why}")
    return lines


def cpu_table(r: dict[str, Any], tags: list[str]) -> list[str]:
    """CPU of the pipelined cases, % of one core, and how the requests spread."""
    rows = []
    for key in PIPELINED:
        for tag in tags if key.startswith("sada") else [""]:
            x = r[key + tag]
            cpu = x["cpu_pct"]
            served = x.get("served_per_server", [])
            total = sum(served) or 1
            spread = " ".join(f"{100 * c / total:.0f}" for c in served) if len(served) > 1 else ""
            rows.append([NAMES[key] + tag_label(tag),
                         *(f"{cpu[k]:.0f}" for k in ("client", "client_hub", "servers", "other",
                                                     "machine")), spread])
    return [f"CPU while each pipelined case ran, % of one core ({r['cores']} cores = "
            f"{100 * r['cores']} %): the channel's process (the raw client's in the raw case)",
            "and its hub thread, its servers, other work on the machine, the machine in all:",
            *table(["case", "channel", "its hub", "servers", "other", "machine",
                    "replies per server (%)"], rows)]


def report(r: dict[str, Any]) -> str:
    tags = ["", *r["baselines"]]
    ratios = r["ratios"]
    rows = []
    for key, name in NAMES.items():
        if key not in r:    # (--pipelined-only)
            continue
        for tag in tags if key.startswith("sada") else [""]:
            x = r[key + tag]
            rows.append([name + tag_label(tag), f"{x['per_s']:.0f}",
                         f"{x['p50_us']:.0f}", f"{x['p99_us']:.0f}",
                         f"{ratios[key + '_vs' + tag]:.2f}" if tag else ""])
    head = ["case", "round trips/s", "p50 µs", "p99 µs", *(["now/base"] if len(tags) > 1 else [])]
    lines = table(head, [row[:len(head)] for row in rows])
    if "sada_seq" not in r:
        lines += ["", *(f"pipelined 1 server / raw{tag_label(tag)}: "
                        f"{ratios['pipelined_1_vs_raw' + tag]:.2f}; CPU per round trip: "
                        f"channel {r['sada_pipe_1' + tag]['cpu_us']['client']:.1f} µs, server "
                        f"{r['sada_pipe_1' + tag]['cpu_us']['servers']:.1f} µs"
                        for tag in tags),
                  f"raw: client {r['raw_pipe']['cpu_us']['client']:.1f} µs, echo "
                  f"{r['raw_pipe']['cpu_us']['servers']:.1f} µs per round trip",
                  f"raw SADA frames / raw, pipelined: {ratios['raw_pipe_sada_frames_vs_raw']:.2f}"
                  " (median of the rounds: a plain pyzmq client and echo sending a REQ's and "
                  "a REP's frames)",
                  *(f"this checkout / baseline{tag_label(tag)}, median of the rounds' ratios: "
                    f"CPU per round trip channel {ratios['paired' + tag]['client']:.2f}, server "
                    f"{ratios['paired' + tag]['servers']:.2f}; round trips/s "
                    f"{ratios['paired' + tag]['per_s']:.2f}" for tag in tags[1:]),
                  "load average during the run: " + " ".join(
                      f"{x:.2f}" for x in r["load_average"]) + f" ({os.cpu_count()} cores)",
                  *(f"baseline code{tag_label(tag)}: {rev}" for tag, rev in r["baselines"].items())]
        return "\n".join(lines)
    lines.append("")
    lines += cpu_table(r, tags)
    lines.append("")
    for tag in tags:
        seq = ratios[f"sequential_vs_raw{tag}"]
        p99 = r[f"sada_seq{tag}"]["p99_us"] / 1000
        what = tag_label(tag)
        lines += [
            f"sequential / raw{what}:{' ' * (28 - len(what))}{seq:5.2f}  (target >= "
            f"{TARGETS['sequential_ratio']:.2f}: "
            f"{'met' if seq >= TARGETS['sequential_ratio'] else 'MISSED'})",
            f"sequential (greenlet) / raw{what}:{' ' * (18 - len(what))}"
            f"{ratios[f'sequential_spawned_vs_raw{tag}']:5.2f}",
            f"sequential p99{what}:{' ' * (30 - len(what))}{p99:5.2f} ms (target <= "
            f"{TARGETS['p99_ms']} ms: {'met' if p99 <= TARGETS['p99_ms'] else 'MISSED'})",
            f"pipelined 1 server / raw{what}:{' ' * (20 - len(what))}"
            f"{ratios[f'pipelined_1_vs_raw{tag}']:5.2f}",
            f"pipelined 4 servers / 1{what}:{' ' * (21 - len(what))}"
            f"{ratios[f'pipelined_4_vs_1{tag}']:5.2f}  (echo; on {r['cores']} cores)",
        ]
        lines += scaling_lines(r, tag)
    fo = r["failover"]
    limit = TARGETS["failover_intervals"] * fo["ping_interval_s"] * 1000
    lines += [
        f"raw SADA frames / raw:{' ' * 23}{ratios['raw_sada_frames_vs_raw']:5.2f}  "
        "(a plain pyzmq program with REQ/REP frames)",
        f"raw SADA frames / raw, pipelined:{' ' * 12}"
        f"{ratios['raw_pipe_sada_frames_vs_raw']:5.2f}  (the same, {fo['window']} in flight)",
        "",
        f"failover ({fo['servers']} servers, window {fo['window']}, ping interval "
        f"{fo['ping_interval_s']} s): victim held {fo['held_by_victim_at_kill']} requests",
        f"  dropped after {fo['dropped_after_ms']:.1f} ms; every request in flight at the kill "
        f"answered after {fo['recovered_after_ms']:.1f} ms; longest gap between replies "
        f"{fo['longest_reply_gap_ms']:.1f} ms",
        f"  target: within {TARGETS['failover_intervals']:g} x ping interval = "
        f"{limit:.0f} ms: {'met' if fo['recovered_after_ms'] <= limit else 'MISSED'}",
        f"  {fo['requests']} requests, {fo['failed']} failed, {fo['unanswered']} unanswered",
        "",
        "load average during the run: " + " ".join(f"{x:.2f}" for x in r["load_average"])
        + f" ({os.cpu_count()} cores)",
    ]
    lines += [f"baseline code{tag_label(tag)}: {rev}" for tag, rev in r["baselines"].items()]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=3000,
                        help="round trips per sequential case and round (pipelined: 2n)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case")
    parser.add_argument("--window", type=int, default=64, help="requests in flight when pipelined")
    parser.add_argument("--service-ms", type=float, default=1.0,
                        help="service time of the server-bound handler (ms; blocks, burns no CPU)")
    parser.add_argument("--bound-n", type=int, default=400,
                        help="requests per server per server-bound case and round")
    parser.add_argument("--baseline", metavar="REV", action="append",
                        help="also run the channel cases with the peermesh of REV (a commit, or "
                             "a directory holding a peermesh package); may be repeated")
    parser.add_argument("--pipelined-only", action="store_true",
                        help="run only raw vs channel -> 1 server, pipelined (and no failover)")
    parser.add_argument("--ping-interval", type=float, default=1.0,
                        help="channel ping interval in the failover case (s)")
    parser.add_argument("--failover-s", type=float, default=2.0,
                        help="length of the failover run (s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    results = run(args)
    print(dump_json(results) if args.json else report(results))
    return 0


if __name__ == "__main__":
    harness.run(main)
