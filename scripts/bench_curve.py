"""What CURVE costs: WHISPER one way and round trip, plain and with keys, next to raw pyzmq.

One run on loopback only (interface ``lo``, a free UDP beacon port), every
process started by the shared harness (``harness.py``):

* **peermesh one way**: a ``Node`` whispers ``--messages`` 100-byte messages to
  a ``Node`` that counts them; the rate is messages over the time from the
  first whisper to the last arrival (system-wide monotonic clock). Plain
  nodes, then nodes with keys and an allowlist holding both keys.
* **peermesh round trip**: the sender whispers one message and waits for the
  receiver's whisper back, ``--pings`` times; p50 and p99.
* **raw pyzmq**, the ceiling: a DEALER sending to a ROUTER (one way) and a
  DEALER-ROUTER echo (round trip), plain and with CURVE keys (a ZAP handler
  admitting the client's key runs in the receiver, as peermesh's does). Its
  messages have a WHISPER's two frames (6-octet command, 100-octet content):
  CURVE encrypts each frame on its own, so frames, not messages, set its cost.

Cases take turns for ``--rounds`` rounds; the table shows the median round
and every ratio is the median of per-round ratios. Targets: CURVE one way
at least 0.5x plain peermesh, CURVE round-trip p50 at most 1.3x plain.

    python scripts/bench_curve.py                   # 50,000 messages, 2,000 pings, 3 rounds
    python scripts/bench_curve.py --messages 20000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
from typing import Any, Optional
from uuid import UUID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

COUNTER = struct.Struct(">Q")
PAD = b"x" * 92  # 100-byte payloads
WAIT = 60.0  # seconds: bound on every wait
MODES = ("plain", "curve")


def payload(i: int) -> bytes:
    return COUNTER.pack(i) + PAD


def settings(port: int, keys: Optional[dict[str, str]], name: str) -> dict[str, Any]:
    from peermesh import NodeConfig
    extra = {} if keys is None else {"key_file": keys[name], "allowed_keys": keys["allowed"]}
    return {"config": NodeConfig(), "interface": "lo", "port": port, "interval": 0.1, **extra}


def wait_enter(node: Any, peer: str) -> None:
    from peermesh import EventType
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        event = node.recv(max(0.0, deadline - time.monotonic()))
        if event is not None and event.type is EventType.ENTER and event.peer.hex == peer:
            return
    raise TimeoutError("the other node did not enter")


# --- peermesh --------------------------------------------------------------------------

def role_sink(parent: harness.Parent, port: int, keys: Optional[dict[str, str]]) -> None:
    """Count WHISPERs (the parent says how many) or echo each one back (``echo``)."""
    from peermesh import EventType, Node
    node = Node("sink", **settings(port, keys, "sink")).start()
    try:
        parent.send("uuid", node.uuid.hex)
        for command in parent.commands(green=True):
            count, last = 0, -1
            while count < command["expect"]:
                event = node.recv(WAIT)
                if event is None:
                    break
                if event.type is EventType.WHISPER:
                    count += 1
                    if command.get("echo"):
                        node.whisper(event.peer, event.frames[0])
                    last = COUNTER.unpack_from(event.frames[0])[0]
            parent.send("counted", [count, last, time.monotonic()])
    finally:
        node.stop(0.5)


def role_sender(parent: harness.Parent, port: int, keys: Optional[dict[str, str]], peer: str,
                n: int, pings: int) -> None:
    """Whisper ``n`` messages (report when it began), then ``pings`` round trips."""
    from peermesh import EventType, Node
    with Node("sender", **settings(port, keys, "sender")) as node:
        wait_enter(node, peer)
        whisper, target = node.whisper, UUID(peer)
        started = time.monotonic()
        for i in range(n):
            whisper(target, payload(i))
        node.flush(WAIT)
        parent.send("sent", started)
        parent.expect("ping", WAIT, green=True)
        times = []
        for i in range(pings):
            begun = time.perf_counter()
            whisper(target, payload(i))
            while True:
                event = node.recv(WAIT)
                if event is None:
                    raise TimeoutError("no echo")
                if event.type is EventType.WHISPER:
                    break
            times.append(time.perf_counter() - begun)
        parent.send("rtt", times)


def peermesh_round(children: harness.Children, sinks: dict[str, Any], port: int,
                   keys: dict[str, str], mode: str, n: int, pings: int) -> dict[str, float]:
    sink, peer = sinks[mode]
    sink.send({"expect": n})
    sender = children.start("bench_curve", "sender", port=port,
                            keys=keys if mode == "curve" else None, peer=peer, n=n, pings=pings)
    started = sender.expect("sent", WAIT + 60)
    count, last, finished = sink.expect("counted", WAIT)
    if count != n or last != n - 1:
        raise RuntimeError(f"{mode}: received {count} of {n}, last {last}")
    sink.send({"expect": pings, "echo": True})
    sender.send("ping")
    times = sorted(sender.expect("rtt", WAIT + 60))
    sink.expect("counted", WAIT)
    return {"rate": n / (finished - started), "p50": harness.percentile(times, 50) * 1e6,
            "p99": harness.percentile(times, 99) * 1e6}


# --- raw pyzmq --------------------------------------------------------------------------

def raw_socket(kind: int, keys: Optional[dict[str, str]], name: str, server: Optional[bytes]
               ) -> Any:
    import zmq
    from zmq.auth.certs import load_certificate
    sock = zmq.Context.instance().socket(kind)
    sock.linger = 0
    if keys is not None:
        public, secret = load_certificate(keys[name])
        sock.curve_secretkey = secret
        if server is None:
            sock.curve_server = True
        else:
            sock.curve_publickey = public
            sock.curve_serverkey = server
    return sock


def role_raw_sink(parent: harness.Parent, keys: Optional[dict[str, str]]) -> None:
    """A ROUTER counting messages or echoing them, with a ZAP handler admitting the
    allowed keys when ``keys`` are given."""
    import zmq
    auth = None
    if keys is not None:
        from zmq.auth.thread import ThreadAuthenticator
        auth = ThreadAuthenticator(zmq.Context.instance())
        auth.start()
        auth.configure_curve(domain="*", location=keys["allowed"])
    router = raw_socket(zmq.ROUTER, keys, "sink", None)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    parent.send("endpoint", f"tcp://127.0.0.1:{port}")
    try:
        for command in parent.commands():
            for _ in range(command["expect"]):
                message = router.recv_multipart()
                if command.get("echo"):
                    router.send_multipart(message)
            parent.send("counted", time.monotonic())
    finally:
        router.close()
        if auth is not None:
            auth.stop()


def role_raw_sender(parent: harness.Parent, keys: Optional[dict[str, str]], endpoint: str,
                    server: Optional[str], n: int, pings: int) -> None:
    import zmq
    dealer = raw_socket(zmq.DEALER, keys, "sender", server.encode() if server else None)
    dealer.connect(endpoint)
    dealer.send(b"hello")  # the handshake is not measured
    dealer.recv()
    # the frames of a WHISPER: the 6-octet command frame, then the content
    header = b"\xaa\xa1\x02\x02\x00\x01"
    started = time.monotonic()
    for i in range(n):
        dealer.send_multipart([header, payload(i)])
    parent.send("sent", started)
    parent.expect("ping", WAIT)
    times = []
    for i in range(pings):
        begun = time.perf_counter()
        dealer.send_multipart([header, payload(i)])
        dealer.recv_multipart()
        times.append(time.perf_counter() - begun)
    parent.send("rtt", times)
    dealer.close()


def raw_round(children: harness.Children, sinks: dict[str, Any], keys: dict[str, str],
              server: str, mode: str, n: int, pings: int) -> dict[str, float]:
    sink, endpoint = sinks[mode]
    sink.send({"expect": 1, "echo": True})
    sender = children.start("bench_curve", "raw_sender", keys=keys if mode == "curve" else None,
                            endpoint=endpoint, server=server if mode == "curve" else None,
                            n=n, pings=pings)
    sink.expect("counted", WAIT)
    sink.send({"expect": n})
    started = sender.expect("sent", WAIT)
    finished = sink.expect("counted", WAIT)
    sink.send({"expect": pings, "echo": True})
    sender.send("ping")
    times = sorted(sender.expect("rtt", WAIT))
    sink.expect("counted", WAIT)
    return {"rate": n / (finished - started), "p50": harness.percentile(times, 50) * 1e6,
            "p99": harness.percentile(times, 99) * 1e6}


# --- the run ----------------------------------------------------------------------------

def make_keys(directory: str) -> tuple[dict[str, str], str]:
    """Keypairs of the sender and the sink, both in one allowed-keys directory."""
    from peermesh.io.keys import generate, write_keypair
    allowed = os.path.join(directory, "allowed")
    os.mkdir(allowed)
    keys = {"allowed": allowed}
    server = ""
    for name in ("sender", "sink"):
        keypair = generate()
        public, secret = write_keypair(os.path.join(directory, f"{name}.key"), keypair)
        os.link(public, os.path.join(allowed, f"{name}.key"))
        keys[name] = secret
        if name == "sink":
            server = keypair.public.decode()
    return keys, server


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=50_000, help="one way, per case and round")
    parser.add_argument("--pings", type=int, default=2_000, help="round trips per case and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    ports = {mode: harness.free_udp_port() for mode in MODES}  # plain and keyed nodes apart
    cases = [f"{kind} {mode}" for kind in ("peermesh", "raw") for mode in MODES]
    results: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory, harness.Children() as children:
        keys, server = make_keys(directory)
        pm_sinks, raw_sinks = {}, {}
        for mode in MODES:
            use = keys if mode == "curve" else None
            sink = children.start("bench_curve", "sink", port=ports[mode], keys=use)
            pm_sinks[mode] = (sink, sink.expect("uuid", WAIT))
            raw = children.start("bench_curve", "raw_sink", keys=use)
            raw_sinks[mode] = (raw, raw.expect("endpoint", WAIT))
        for r in range(args.rounds):
            for mode in MODES:
                result = peermesh_round(children, pm_sinks, ports[mode], keys, mode,
                                        args.messages, args.pings)
                results[f"peermesh {mode}"].append(result)
                harness.progress(f"round {r + 1} peermesh {mode}: {result['rate']:,.0f} msg/s, "
                                 f"p50 {result['p50']:.0f} us")
                result = raw_round(children, raw_sinks, keys, server, mode, args.messages,
                                   args.pings)
                results[f"raw {mode}"].append(result)
                harness.progress(f"round {r + 1} raw {mode}: {result['rate']:,.0f} msg/s, "
                                 f"p50 {result['p50']:.0f} us")
    load = max(load, os.getloadavg()[0])
    summary = summarize(results)
    summary["load_average"] = load
    if args.json:
        print(harness.dump_json(summary))
        return 0
    print(f"\n{args.messages:,} 100-byte WHISPERs one way and {args.pings:,} round trips per "
          f"case and round, {args.rounds} rounds (median round; ratios: median of per-round "
          f"ratios); load average up to {load:.1f}")
    rows = [[case, *(statistics.median(r[k] for r in results[case])
                     for k in ("rate", "p50", "p99"))] for case in cases]
    print("\n".join(harness.table(["case", "msg/s", "RTT p50 us", "RTT p99 us"], rows)))
    print()
    ratio_rows = [[name, value, target] for name, value, target in summary["ratios"]]
    print("\n".join(harness.table(["ratio", "value", "target"], ratio_rows)))
    return 0


def summarize(results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    def per_round(a: str, b: str, key: str) -> float:
        return statistics.median(x[key] / y[key] for x, y in zip(results[a], results[b]))

    ratios = [
        ("peermesh curve / plain, one way", per_round("peermesh curve", "peermesh plain", "rate"),
         ">= 0.5"),
        ("peermesh curve / plain, RTT p50", per_round("peermesh curve", "peermesh plain", "p50"),
         "<= 1.3"),
        ("raw curve / plain, one way", per_round("raw curve", "raw plain", "rate"), "ceiling"),
        ("raw curve / plain, RTT p50", per_round("raw curve", "raw plain", "p50"), "ceiling"),
        ("peermesh curve / raw curve, one way", per_round("peermesh curve", "raw curve", "rate"),
         ""),
    ]
    return {"ratios": ratios, "results": results}


if __name__ == "__main__":
    harness.run(lambda: main())
