#!/usr/bin/env python3
"""Benchmark Safir-Darbaan request/reply against raw pyzmq, in one run.

Everything stays on loopback (127.0.0.1); no node beacons: servers are
pointed at the channel's endpoint directly. This process is the client (a
``Channel`` on its gevent hub, or a raw DEALER); servers run in child
processes (this file with ``--role``). Payload: a small msgpack'd dict
(``{"i": n, "pad": 64 bytes}``) for both.

1. sequential round trips, one client and one server: raw DEALER->ROUTER echo
   (plain blocking pyzmq, the ceiling), the same raw echo with a SADA REQ's
   nine frames (what the spec's frame layout costs pyzmq itself), channel ->
   server (``echo``, an inline handler), and the same with the handler in its
   own greenlet (the default for handlers);
2. pipelined (a window of requests in flight): raw vs channel with 1 and with
   4 server processes;
3. failover: 3 servers under pipelined load with ``retries=1``; one is
   SIGKILLed; how long until the channel dropped it, until every request it
   held was answered by the others, the longest gap between replies, and
   whether any request failed.

Cases 1 and 2 run in interleaved rounds (every case once per round), so load
from other work on the machine hits all cases alike; rates are the median of
the rounds. Prints a table with ratios against the targets of issue 4
(sequential >= 60% of raw, p99 <= 1 ms, failover within 2 x ping interval);
``--json`` prints one JSON object instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

LOOPBACK = "127.0.0.1"
PAD = b"x" * 64
TARGETS = {"sequential_ratio": 0.60, "p99_ms": 1.0, "failover_intervals": 2.0}
_T0 = time.perf_counter()


def progress(text: str) -> None:
    print(f"[{time.perf_counter() - _T0:6.1f}s] {text}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a sorted list."""
    if not values:
        return float("nan")
    k = math.ceil(q / 100.0 * len(values)) - 1
    return values[max(0, min(len(values) - 1, k))]


def latency_stats(samples: list[float], wall: float) -> dict[str, Any]:
    us = sorted(s * 1e6 for s in samples)
    return {"round_trips": len(us), "per_s": len(us) / wall, "p50_us": percentile(us, 50),
            "p99_us": percentile(us, 99), "mean_us": statistics.fmean(us)}


# ---------------------------------------------------------------------------
# child roles (run as `bench_sada.py --role ROLE ENDPOINT`)


def role_raw_echo(endpoint: str) -> None:
    """A plain blocking ROUTER that echoes every message (bound at ``endpoint``)."""
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    print("READY", flush=True)
    recv, send, more = sock.recv, sock.send, zmq.SNDMORE
    while True:
        identity = recv()
        frames = [identity]
        while sock.getsockopt(zmq.RCVMORE):
            frames.append(recv())
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            send(frame, more if i < last else 0)


def role_sada_server(endpoint: str) -> None:
    """A peermesh Server with the demo echo service, connected to ``endpoint``."""
    import gevent

    from peermesh.sada import Server, echo_service
    server = Server(channels=[endpoint], services=[echo_service()])

    @server.handler("bench", "spawned")
    def spawned(payload: Any) -> Any:
        return payload

    server.start()
    print("READY", flush=True)
    gevent.wait()


ROLES = {"raw-echo": role_raw_echo, "sada-server": role_sada_server}


class Children:
    """Child processes, all killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, role: str, endpoint: str) -> "subprocess.Popen[str]":
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                                 endpoint], stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(f"{role} child did not start: {line!r}")
        return proc

    def kill(self, proc: "subprocess.Popen[str]") -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            self.kill(proc)


def free_tcp_endpoint() -> str:
    import socket
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return f"tcp://{LOOPBACK}:{s.getsockname()[1]}"


# ---------------------------------------------------------------------------
# the measured cases: each set up once, then measured in interleaved rounds


class RawEcho:
    """A raw DEALER client (this process) and a raw ROUTER echo (child process)."""

    def __init__(self, children: Children) -> None:
        import zmq
        endpoint = free_tcp_endpoint()
        children.start("raw-echo", endpoint)
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.more = zmq.SNDMORE

    def measure(self, n: int, window: int, sada_frames: bool = False) -> dict[str, Any]:
        """``n`` round trips, ``window`` in flight (1 = sequential).

        ``sada_frames``: send and echo the frames a SADA REQ has (delimiter,
        signature, command, request id, service, version, category, action,
        payload) instead of delimiter + payload, which shows what the spec's
        frame layout itself costs at the raw pyzmq level.
        """
        import msgpack
        sock, more = self.sock, self.more
        head = [b"SADA1", b"REQ", b"0123456789abcdef-1", b"echo", b"1.0", b"", b"echo"] \
            if sada_frames else []

        def send(payload: bytes) -> None:
            sock.send(b"", more)
            for frame in head:
                sock.send(frame, more)
            sock.send(payload)

        def recv() -> bytes:
            frame = sock.recv(copy=False)
            while frame.more:
                frame = sock.recv(copy=False)
            return frame.bytes

        samples: list[float] = []
        clock = time.perf_counter
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
        return {"samples": samples, "wall": clock() - start}


class SadaSetup:
    """A ``Channel`` (this process) and ``servers`` server processes."""

    def __init__(self, children: Children, servers: int) -> None:
        from peermesh.sada import Channel
        self.channel = Channel(address=LOOPBACK, ping_interval=1.0).start()
        for _ in range(servers):
            children.start("sada-server", self.channel.endpoint)
        if not self.channel.wait_for("echo", count=servers, timeout=10):
            raise RuntimeError("servers did not introduce themselves")

    def measure(self, n: int, window: int, action: str = "echo") -> dict[str, Any]:
        """``n`` requests (``echo``/echo inline, or a handler in its own greenlet)."""
        import gevent.event
        channel = self.channel
        service = "echo" if action == "echo" else "bench"
        samples: list[float] = []
        clock = time.perf_counter
        start = clock()
        if window == 1:
            request = channel.request
            for i in range(n):
                t = clock()
                request(service, action, {"i": i, "pad": PAD})
                samples.append(clock() - t)
        else:
            done = gevent.event.Event()
            state = {"sent": 0, "received": 0}
            request_async = channel.request_async

            def send_one() -> None:
                t = clock()
                result = request_async(service, action, {"i": state["sent"], "pad": PAD})
                state["sent"] += 1
                result.rawlink(lambda r, t=t: on_reply(r, t))

            def on_reply(result: Any, t: float) -> None:
                samples.append(clock() - t)
                result.get()
                state["received"] += 1
                if state["received"] >= n:
                    done.set()
                elif state["sent"] < n:
                    send_one()

            for _ in range(min(window, n)):
                send_one()
            done.wait()
        return {"samples": samples, "wall": clock() - start}

    def close(self) -> None:
        self.channel.stop()


def interleaved(cases: dict[str, Callable[[int], dict[str, Any]]], n: int,
                rounds: int) -> dict[str, dict[str, Any]]:
    """Run every case ``rounds`` times, round-robin (load from elsewhere hits all alike).

    Per case: ``per_s`` is the median of the rounds' rates, percentiles come
    from all samples together.
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for name, case in cases.items():      # warm-up round, not counted
        case(min(500, n))
    for _ in range(rounds):
        for name, case in cases.items():
            runs[name].append(case(n))
    result = {}
    for name, parts in runs.items():
        samples = [s for part in parts for s in part["samples"]]
        stats = latency_stats(samples, sum(p["wall"] for p in parts))
        stats["per_s"] = statistics.median(len(p["samples"]) / p["wall"] for p in parts)
        result[name] = stats
    return result


def bench_failover(servers: int, window: int, ping_interval: float,
                   seconds: float) -> dict[str, Any]:
    """Pipelined load on ``servers`` servers; SIGKILL one halfway; measure recovery."""
    import gevent

    from peermesh.sada import Channel
    channel = Channel(address=LOOPBACK, ping_interval=ping_interval).start()
    try:
        with Children() as children:
            procs = [children.start("sada-server", channel.endpoint) for _ in range(servers)]
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
            victim.wait(5)
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


# ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with Children() as children:
        raw = RawEcho(children)
        one = SadaSetup(children, 1)
        four = SadaSetup(children, 4)
        try:
            progress(f"sequential: {args.rounds} interleaved rounds of {args.n} round trips")
            results.update(interleaved({
                "raw_seq": lambda n: raw.measure(n, 1),
                "raw_seq_sada_frames": lambda n: raw.measure(n, 1, sada_frames=True),
                "sada_seq": lambda n: one.measure(n, 1),
                "sada_seq_spawned": lambda n: one.measure(n, 1, action="spawned"),
            }, args.n, args.rounds))
            progress(f"pipelined (window {args.window}): {args.rounds} interleaved rounds")
            w = args.window
            results.update(interleaved({
                "raw_pipe": lambda n: raw.measure(n, w),
                "sada_pipe_1": lambda n: one.measure(n, w),
                "sada_pipe_4": lambda n: four.measure(n, w),
            }, args.n * 2, args.rounds))
            results["replies_per_server_4"] = sorted(s.replies for s in four.channel.servers())
        finally:
            one.close()
            four.close()
    progress("failover: SIGKILL one of 3 servers under load")
    results["failover"] = bench_failover(3, args.window, args.ping_interval, args.failover_s)
    raw_seq = results["raw_seq"]["per_s"]
    results["ratios"] = {
        "sequential_vs_raw": results["sada_seq"]["per_s"] / raw_seq,
        "sequential_spawned_vs_raw": results["sada_seq_spawned"]["per_s"] / raw_seq,
        "raw_sada_frames_vs_raw": results["raw_seq_sada_frames"]["per_s"] / raw_seq,
        "sequential_vs_raw_sada_frames": (results["sada_seq"]["per_s"]
                                          / results["raw_seq_sada_frames"]["per_s"]),
        "pipelined_1_vs_raw": results["sada_pipe_1"]["per_s"] / results["raw_pipe"]["per_s"],
        "pipelined_4_vs_1": results["sada_pipe_4"]["per_s"] / results["sada_pipe_1"]["per_s"],
    }
    results["load_average"] = os.getloadavg()
    return results


def table(r: dict[str, Any]) -> str:
    lines = [f"{'case':44} {'round trips/s':>14} {'p50 µs':>9} {'p99 µs':>9}"]
    names = {"raw_seq": "raw pyzmq echo, sequential",
             "raw_seq_sada_frames": "raw pyzmq echo, SADA-shaped, sequential",
             "sada_seq": "channel->1 server, sequential (inline)",
             "sada_seq_spawned": "channel->1 server, sequential (greenlet)",
             "raw_pipe": "raw pyzmq echo, pipelined",
             "sada_pipe_1": "channel->1 server, pipelined",
             "sada_pipe_4": "channel->4 servers, pipelined"}
    for key, name in names.items():
        x = r[key]
        lines.append(f"{name:44} {x['per_s']:14.0f} {x['p50_us']:9.0f} {x['p99_us']:9.0f}")
    ratios = r["ratios"]
    seq = ratios["sequential_vs_raw"]
    p99 = r["sada_seq"]["p99_us"] / 1000
    fo = r["failover"]
    limit = TARGETS["failover_intervals"] * fo["ping_interval_s"] * 1000
    lines += [
        "",
        f"sequential / raw:            {seq:5.2f}  (target >= {TARGETS['sequential_ratio']:.2f}:"
        f" {'met' if seq >= TARGETS['sequential_ratio'] else 'MISSED'})",
        f"sequential (greenlet) / raw: {ratios['sequential_spawned_vs_raw']:5.2f}",
        f"raw SADA-shaped / raw:       {ratios['raw_sada_frames_vs_raw']:5.2f}  "
        "(what 9-10 frames per message cost pyzmq itself)",
        f"sequential / raw SADA-shaped:{ratios['sequential_vs_raw_sada_frames']:5.2f}",
        f"sequential p99:              {p99:5.2f} ms (target <= {TARGETS['p99_ms']} ms: "
        f"{'met' if p99 <= TARGETS['p99_ms'] else 'MISSED'})",
        f"pipelined 1 server / raw:    {ratios['pipelined_1_vs_raw']:5.2f}",
        f"pipelined 4 servers / 1:     {ratios['pipelined_4_vs_1']:5.2f}  "
        f"({os.cpu_count()} cores: the channel's core saturates)",
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
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("endpoint", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=3000,
                        help="round trips per sequential case and round (pipelined: 2n)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case")
    parser.add_argument("--window", type=int, default=64, help="requests in flight when pipelined")
    parser.add_argument("--ping-interval", type=float, default=1.0,
                        help="channel ping interval in the failover case (s)")
    parser.add_argument("--failover-s", type=float, default=2.0,
                        help="length of the failover run (s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.role:
        ROLES[args.role](args.endpoint)
        return 0
    results = run(args)
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
