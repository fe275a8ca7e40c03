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
   answered by a REP's six (what the spec's frame layout itself costs
   pyzmq: the ceiling for any implementation), channel -> server with the demo
   ``echo`` (an inline handler) and with a handler in its own greenlet (the
   default for handlers);
2. pipelined (a window of requests in flight; for the channel, as many
   greenlets each calling ``request``): raw vs channel with 1 and with 4
   server processes;
3. failover: 3 servers under pipelined load with ``retries=1``; one is
   SIGKILLed; how long until the channel dropped it, until every request it
   held was answered by the others, the longest gap between replies, and
   whether any request failed.

Cases 1 and 2 run in interleaved rounds (every case once per round), so load
from other work on the machine hits all cases alike; rates are the median of
the rounds. ``--baseline DIR`` adds the channel cases once more with the
peermesh package found in DIR (e.g. an older commit:
``git archive HEAD peermesh | tar -x -C DIR``), interleaved with the rest.
Prints a table with ratios against the targets of issue 4 (sequential >= 60%
of raw, p99 <= 1 ms, failover within 2 x ping interval); ``--json`` prints
one JSON object instead.
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
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

LOOPBACK = "127.0.0.1"
PAD = b"x" * 64
SADA_HEAD = [b"", b"SADA1", b"REQ", b"0123456789abcdef-1", b"echo", b"1.0", b"", b"echo"]
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


# ---------------------------------------------------------------------------
# child roles (run as `bench_sada.py --role ROLE --code DIR [ENDPOINT]`)


def role_raw_echo(endpoint: str) -> None:
    """A plain blocking ROUTER (bound at ``endpoint``) that echoes every message, but
    answers a SADA REQ's frames with a REP's (request id, status 200, the payload)."""
    import zmq
    sock = zmq.Context().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    print("READY", flush=True)
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


def _commands(answer: Any) -> None:
    """Answer JSON commands from stdin, one per line, until it closes."""
    from gevent.socket import wait_read
    while True:
        wait_read(sys.stdin.fileno())   # the hub keeps running meanwhile
        line = sys.stdin.readline()
        if not line:
            return
        print(json.dumps(answer(json.loads(line))), flush=True)


def role_raw_client(endpoint: str) -> None:
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

    print("READY", flush=True)
    _commands(run)


def role_sada_client(_: Optional[str]) -> None:
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
        if cmd["op"] == "replies":
            return {"replies": sorted(s.replies for s in channel.servers())}
        n, window, action = cmd["n"], cmd["window"], cmd["action"]
        service = "echo" if action == "echo" else "bench"
        samples: list[float] = []
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
        return {"samples": samples, "wall": clock() - start}

    print("READY", channel.endpoint, flush=True)
    _commands(run)


ROLES = {"raw-echo": role_raw_echo, "sada-server": role_sada_server,
         "raw-client": role_raw_client, "sada-client": role_sada_client}


class Children:
    """Child processes, all killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, role: str, endpoint: str = "", code: str = REPO
              ) -> "subprocess.Popen[str]":
        """Start ``role`` with the peermesh package in ``code``; wait for READY."""
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", role,
                                 "--code", code, endpoint], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise RuntimeError(f"{role} child did not start: {line!r}")
        proc.ready = line[1:]  # type: ignore[attr-defined]
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


def ask(proc: "subprocess.Popen[str]", **cmd: Any) -> dict[str, Any]:
    """Send a client child one command and return its answer."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(cmd) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"client child {proc.args} died")
    return json.loads(line)


def free_tcp_endpoint() -> str:
    import socket
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return f"tcp://{LOOPBACK}:{s.getsockname()[1]}"


def raw_setup(children: Children) -> "subprocess.Popen[str]":
    """A raw echo child and a raw client child of it; returns the client."""
    endpoint = free_tcp_endpoint()
    children.start("raw-echo", endpoint)
    return children.start("raw-client", endpoint)


def sada_setup(children: Children, servers: int, code: str) -> "subprocess.Popen[str]":
    """A channel child and ``servers`` server children (code from ``code``)."""
    client = children.start("sada-client", code=code)
    endpoint = client.ready[0]  # type: ignore[attr-defined]
    for _ in range(servers):
        children.start("sada-server", endpoint, code=code)
    if not ask(client, op="wait", count=servers)["ok"]:
        raise RuntimeError("servers did not introduce themselves")
    return client


def interleaved(cases: dict[str, tuple["subprocess.Popen[str]", dict[str, Any]]], n: int,
                rounds: int) -> dict[str, dict[str, Any]]:
    """Run every case ``rounds`` times, round-robin (load from elsewhere hits all alike).

    Per case: ``per_s`` is the median of the rounds' rates, percentiles come
    from all samples together.
    """
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for client, cmd in cases.values():      # warm-up round, not counted
        ask(client, op="run", **{**cmd, "n": min(500, n)})
    for _ in range(rounds):
        for name, (client, cmd) in cases.items():
            runs[name].append(ask(client, op="run", n=n, **cmd))
    result = {}
    for name, parts in runs.items():
        us = sorted(s * 1e6 for part in parts for s in part["samples"])
        result[name] = {
            "round_trips": len(us),
            "per_s": statistics.median(len(p["samples"]) / p["wall"] for p in parts),
            "p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
            "mean_us": statistics.fmean(us)}
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
    versions = {"": REPO}
    if args.baseline:
        versions["_before"] = os.path.abspath(args.baseline)
    with Children() as children:
        raw = raw_setup(children)
        one = {tag: sada_setup(children, 1, code) for tag, code in versions.items()}
        four = {tag: sada_setup(children, 4, code) for tag, code in versions.items()}
        progress(f"sequential: {args.rounds} interleaved rounds of {args.n} round trips")
        sequential = {"raw_seq": (raw, {"window": 1}),
                      "raw_seq_sada_frames": (raw, {"window": 1, "sada_frames": True})}
        for tag in versions:
            sequential[f"sada_seq{tag}"] = (one[tag], {"window": 1, "action": "echo"})
            sequential[f"sada_seq_spawned{tag}"] = (one[tag], {"window": 1, "action": "spawned"})
        results.update(interleaved(sequential, args.n, args.rounds))
        progress(f"pipelined (window {args.window}): {args.rounds} interleaved rounds")
        w = args.window
        pipelined = {"raw_pipe": (raw, {"window": w})}
        for tag in versions:
            pipelined[f"sada_pipe_1{tag}"] = (one[tag], {"window": w, "action": "echo"})
            pipelined[f"sada_pipe_4{tag}"] = (four[tag], {"window": w, "action": "echo"})
        results.update(interleaved(pipelined, args.n * 2, args.rounds))
        results["replies_per_server_4"] = ask(four[""], op="replies")["replies"]
    progress("failover: SIGKILL one of 3 servers under load")
    results["failover"] = bench_failover(3, args.window, args.ping_interval, args.failover_s)
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
    ratios["raw_sada_frames_vs_raw"] = results["raw_seq_sada_frames"]["per_s"] / raw_seq
    if args.baseline:
        results["baseline"] = versions["_before"]
    results["load_average"] = os.getloadavg()
    return results


NAMES = {"raw_seq": "raw pyzmq echo (1 frame), sequential",
         "raw_seq_sada_frames": "raw pyzmq, SADA REQ/REP frames, sequential",
         "sada_seq": "channel->1 server, sequential (inline)",
         "sada_seq_spawned": "channel->1 server, sequential (greenlet)",
         "raw_pipe": "raw pyzmq echo, pipelined",
         "sada_pipe_1": "channel->1 server, pipelined",
         "sada_pipe_4": "channel->4 servers, pipelined"}


def table(r: dict[str, Any]) -> str:
    tags = [""] + (["_before"] if "baseline" in r else [])
    lines = [f"{'case':50} {'round trips/s':>14} {'p50 µs':>9} {'p99 µs':>9}"]
    for key, name in NAMES.items():
        for tag in tags if key.startswith("sada") else [""]:
            x = r[key + tag]
            label = name + (" [baseline]" if tag else "")
            lines.append(f"{label:50} {x['per_s']:14.0f} {x['p50_us']:9.0f} {x['p99_us']:9.0f}")
    ratios = r["ratios"]
    lines.append("")
    for tag in tags:
        seq = ratios[f"sequential_vs_raw{tag}"]
        p99 = r[f"sada_seq{tag}"]["p99_us"] / 1000
        what = " [baseline]" if tag else ""
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
            f"{ratios[f'pipelined_4_vs_1{tag}']:5.2f}  (on {os.cpu_count()} cores)",
        ]
    fo = r["failover"]
    limit = TARGETS["failover_intervals"] * fo["ping_interval_s"] * 1000
    lines += [
        f"raw SADA frames / raw:{' ' * 23}{ratios['raw_sada_frames_vs_raw']:5.2f}  "
        "(what REQ/REP frames cost pyzmq itself: the ceiling)",
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
    if "baseline" in r:
        lines.append(f"baseline code: {r['baseline']}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--code", default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("endpoint", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=3000,
                        help="round trips per sequential case and round (pipelined: 2n)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case")
    parser.add_argument("--window", type=int, default=64, help="requests in flight when pipelined")
    parser.add_argument("--baseline", metavar="DIR",
                        help="also run the channel cases with the peermesh package in DIR")
    parser.add_argument("--ping-interval", type=float, default=1.0,
                        help="channel ping interval in the failover case (s)")
    parser.add_argument("--failover-s", type=float, default=2.0,
                        help="length of the failover run (s)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.baseline and not os.path.isdir(os.path.join(args.baseline, "peermesh", "sada")):
        parser.error(f"--baseline {args.baseline}: no peermesh/sada package there")
    sys.path.insert(0, os.path.abspath(args.code))
    if args.role:
        ROLES[args.role](args.endpoint)
        return 0
    results = run(args)
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
