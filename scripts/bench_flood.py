"""A node under a flood of hostile beacons and fake HELLOs: does a good peer still get served?

One run, on loopback only (interface ``lo``, a free UDP beacon port), each
part in its own process started by the shared harness (``harness.py``):

* **target**: a gevent ``Node`` that echoes every WHISPER back to its sender;
* **good**: a ``Node`` that whispers to the target and times each round trip
  (one message in flight), for the whole of each phase;
* **flood**: raw UDP and pyzmq, no peermesh: ``--beacons`` beacons with
  random UUIDs (nine in ten pointing at ports nobody listens on, one in ten
  port 0) and ``--hellos`` HELLOs, each from a DEALER of its own under a
  random identity, naming an endpoint of its own where nobody listens (a
  random 127.x.y.z: all of 127.0.0.0/8 is this host); spread evenly over
  ``--seconds``.

Phases: **quiet** (the good peer alone) and **flood** (the flood running),
each ``--seconds`` long; then **after**, ``--seconds`` once the flood
stopped. The table shows the good peer's round trips (p50, p99, how many),
the target's RSS and CPU over each phase (its main thread and libzmq's I/O
thread), the CPU of the good peer and of the flood, the mailbox connections
(peak) and those shed, and the target's hub rounds by CPU time (the longest,
and how many took 5 ms or more: a measure of what a message waits for that
a loaded machine does not blur, see ``HubRounds``); then its
``Node.stats()`` afterwards. Targets: under the flood, p99 below 10 ms and
RSS below 100 MB.
``--baseline REV`` runs the same with the target on an older commit (the
flood and good peer always run this checkout); ``--set KEY=VALUE`` changes
a setting of the target (a limit, say).

    python scripts/bench_flood.py                    # 100k beacons, 5k HELLOs, 10 s phases
    python scripts/bench_flood.py --beacons 20000 --hellos 1000 --seconds 5
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import time
import uuid as uuid_module
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

WAIT = 30.0  # seconds: bound on every wait
P99_TARGET_MS, RSS_TARGET_MB = 10.0, 100.0


def settings(port: int) -> dict[str, Any]:
    from peermesh import NodeConfig
    return {"config": NodeConfig(), "interface": harness.INTERFACE, "port": port}


# --- the node under the flood ---------------------------------------------------------------

class HubRounds:
    """The CPU time (of the hub's thread: not the time it waited for a core) each round
    of the gevent hub took, from one poll for I/O to the next: a message that arrives
    during a round waits for the rest of it, so on an idle machine the longest rounds
    are the worst round trips. Rounds of ``MIN_MS`` or more are kept."""

    MIN_MS = 1.0

    def __init__(self) -> None:
        import gevent
        self.long: list[float] = []
        self.count = 0
        self._last = time.thread_time()
        self._watcher = gevent.get_hub().loop.prepare()
        self._watcher.start(self._round)

    def _round(self) -> None:
        now = time.thread_time()
        ms, self._last = (now - self._last) * 1000, now
        self.count += 1
        if ms >= self.MIN_MS:
            self.long.append(ms)

    def take(self) -> dict[str, Any]:
        """The rounds since the last ``take``: how many, and those of ``MIN_MS`` or more."""
        out = {"rounds": self.count, "long": sorted(self.long)}
        self.long, self.count = [], 0
        return out


def role_target(parent: harness.Parent, port: int, limits: dict[str, Any]) -> None:
    """Echo every WHISPER to its sender; answer "stats" with ``Node.stats()``, "rounds"
    with its hub's long rounds (``HubRounds``)."""
    import gevent

    from peermesh import EventType, Node
    node = Node("target", **settings(port), **limits).start()

    def echo() -> None:
        for event in node.events():
            if event.type is EventType.WHISPER:
                try:
                    node.whisper(event.peer, *event.frames)
                except Exception:  # the peer left meanwhile
                    pass

    echoing = gevent.spawn(echo)
    rounds = HubRounds()
    try:
        parent.send("ready", [node.uuid.hex, node.endpoint])
        for command in parent.commands(green=True):
            if command == "rounds":
                parent.send("rounds", rounds.take())
            else:
                parent.send("stats", getattr(node, "stats", dict)())
    finally:
        echoing.kill()
        node.stop(0.5)


# --- the good peer -----------------------------------------------------------------------------

def role_good(parent: harness.Parent, port: int, target: str) -> None:
    """On each "phase" command, time round trips to the target for that many seconds."""
    from uuid import UUID

    from peermesh import EventType, Node
    node = Node("good", **settings(port)).start()
    peer = UUID(target)
    try:
        deadline = time.monotonic() + WAIT
        while peer not in node.peers():
            if time.monotonic() > deadline:
                raise TimeoutError("the target did not enter")
            node.recv(0.1)
        parent.send("ready")
        for command in parent.commands(green=True):
            trips, lost, sequence = [], 0, 0
            end = time.monotonic() + command["seconds"]
            while time.monotonic() < end:
                sequence += 1
                token = sequence.to_bytes(8, "big")
                sent = time.perf_counter()
                node.whisper(peer, token)
                while True:
                    event = node.recv(1.0)
                    if event is None:
                        lost += 1
                        break
                    if event.type is EventType.WHISPER and event.frames == (token,):
                        trips.append((time.perf_counter() - sent) * 1000)
                        break
            parent.send("trips", [sorted(trips), lost])
    finally:
        node.stop(0.5)


# --- the flood --------------------------------------------------------------------------------

def role_flood(parent: harness.Parent, port: int, endpoint: str, beacons: int, hellos: int,
               seconds: float) -> None:
    """Send the hostile beacons and HELLOs evenly over ``seconds``; report what was sent."""
    import zmq

    from peermesh.wire import zre
    parent.expect("go", WAIT)
    closed = []  # ports bound but not listening: nobody answers there
    for _ in range(64):
        sock = socket.socket()
        sock.bind((harness.LOOPBACK, 0))
        closed.append(sock)
    ports = [s.getsockname()[1] for s in closed]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    udp.bind((harness.LOOPBACK, 0))
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 65536)
    dealers: list[zmq.Socket] = []
    rng = random.Random(0xF100D)
    steps = max(beacons, hellos, 1)
    started = time.monotonic()
    sent_beacons = sent_hellos = 0
    try:
        for step in range(steps):
            while time.monotonic() < started + seconds * step / steps:
                time.sleep(0.001)
            if step * beacons // steps != sent_beacons or step == 0 and beacons:
                port_field = 0 if rng.random() < 0.1 else rng.choice(ports)
                data = zre.encode_beacon(zre.Beacon(uuid_module.uuid4().bytes, port_field))
                try:
                    udp.sendto(data, (harness.LO_BROADCAST, port))
                except OSError:
                    pass
                sent_beacons += 1
            if hellos and step * hellos // steps >= sent_hellos and sent_hellos < hellos:
                dealer = context.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.setsockopt(zmq.IDENTITY, b"\x01" + uuid_module.uuid4().bytes)
                dealer.connect(endpoint)
                # a loopback address of its own (127.0.0.0/8 is all this host) at a port
                # bound on 127.0.0.1 only: a distinct endpoint where nobody listens
                fake = (f"tcp://127.{rng.randrange(1, 255)}.{rng.randrange(256)}."
                        f"{rng.randrange(1, 255)}:{rng.choice(ports)}")
                dealer.send_multipart(zre.encode(zre.Hello(1, fake, (), 0, "fake", {})))
                dealers.append(dealer)
                sent_hellos += 1
        parent.send("sent", [sent_beacons, sent_hellos, time.monotonic() - started])
        parent.expect("stop", WAIT + seconds * 3)
    finally:
        for dealer in dealers:
            dealer.close(0)
        context.term()
        for sock in closed:
            sock.close()


# --- the run ----------------------------------------------------------------------------------

def rss_of(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def phase(good: harness.Child, target: harness.Child, seconds: float,
          flood: Optional[harness.Child] = None) -> dict[str, Any]:
    """One phase: the good peer's round trips, the target's RSS and mailbox connections
    (peaks of samples every 0.2 s), connections it shed, and the CPU of each process (the
    target's by thread: its main thread, libzmq's I/O threads)."""
    target.send("stats")
    shed0 = target.expect("stats", WAIT).get("connections_shed", 0)
    target.send("rounds")
    target.expect("rounds", WAIT)
    cpu0 = harness.threads_cpu(target.pid)
    others0 = {name: harness.proc_cpu(child.pid)
               for name, child in (("good", good), ("flood", flood)) if child is not None}
    good.send({"seconds": seconds})
    if flood is not None:
        flood.send("go")
    peak, connections, stats = rss_of(target.pid), 0, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.2)
        peak = max(peak, rss_of(target.pid))
        target.send("stats")
        stats = target.expect("stats", WAIT)
        connections = max(connections, stats.get("connections", 0))
    trips, lost = good.expect("trips", WAIT + seconds)
    target.send("rounds")
    rounds = target.expect("rounds", WAIT)
    sent = flood.expect("sent", WAIT + seconds) if flood is not None else None
    cpu = {kind: (used - cpu0[kind]) / seconds * 100
           for kind, used in harness.threads_cpu(target.pid).items()}
    others = {name: (harness.proc_cpu(child.pid) - others0[name]) / seconds * 100
              for name, child in (("good", good), ("flood", flood)) if child is not None}
    return {"p50": harness.percentile(trips, 50), "p99": harness.percentile(trips, 99),
            "trips": len(trips), "lost": lost, "rss_mb": peak,
            "cpu_pct": sum(cpu.values()), "main_pct": cpu["main"], "zmq_pct": cpu["zmq"],
            "good_pct": others["good"], "flood_pct": others.get("flood", 0.0),
            "sent": sent, "connections": connections, "hub_rounds": rounds["rounds"],
            "hub_max_ms": max(rounds["long"], default=0.0),
            "hub_over_5ms": sum(1 for ms in rounds["long"] if ms >= 5.0),
            "shed": stats.get("connections_shed", 0) - shed0}


def measure(code: str, args: argparse.Namespace) -> dict[str, Any]:
    port = harness.free_udp_port()
    with harness.Children() as children:
        profile = {} if not args.profile else {
            "target": {"_profile": os.path.join(args.profile, "target.prof")},
            "good": {"_profile": os.path.join(args.profile, "good.prof")}}
        target = children.start("bench_flood", "target", code, port=port, limits=args.set,
                                **profile.get("target", {}))
        uuid, endpoint = target.expect("ready", WAIT)
        good = children.start("bench_flood", "good", port=port, target=uuid,
                              **profile.get("good", {}))
        good.expect("ready", WAIT)
        flood = children.start("bench_flood", "flood", port=port, endpoint=endpoint,
                               beacons=args.beacons, hellos=args.hellos, seconds=args.seconds)
        result = {"quiet": phase(good, target, args.seconds)}
        harness.progress("quiet phase done; flooding ...")
        result["flood"] = phase(good, target, args.seconds, flood)
        flood.send("stop")
        harness.progress("flood done; after ...")
        result["after"] = phase(good, target, args.seconds)
        target.send("stats")
        result["stats"] = target.expect("stats", WAIT)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--beacons", type=int, default=100_000)
    parser.add_argument("--hellos", type=int, default=5_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    parser.add_argument("--baseline", metavar="REV", help="also run the target on this commit")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="a NodeConfig setting of the target (an integer or a number)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--profile", metavar="DIR",
                        help="write cProfile stats of the target and the good peer to DIR "
                             "(target.prof, good.prof)")
    args = parser.parse_args(argv)
    try:
        args.set = {key: (float(value) if "." in value else int(value))
                    for key, _, value in (item.partition("=") for item in args.set)}
    except ValueError:
        parser.error("--set takes KEY=NUMBER, e.g. --set max_connections=100000")
    results = {}
    for label, code in harness.trees(args.baseline).items():
        harness.progress(f"{label}: target from {code}")
        results[label] = measure(code, args)
    if args.json:
        print(harness.dump_json(results))
        return 0
    print(f"\nflood: {args.beacons:,} beacons and {args.hellos:,} fake HELLOs over "
          f"{args.seconds:g} s; load average {os.getloadavg()[0]:.1f}")
    rows = []
    for label, result in results.items():
        for name in ("quiet", "flood", "after"):
            r = result[name]
            rows.append([f"{label} {name}", r["p50"], r["p99"], r["trips"], r["lost"],
                         r["rss_mb"], r["main_pct"], r["zmq_pct"], r["good_pct"],
                         r["flood_pct"], r["connections"], r["shed"], r["hub_max_ms"],
                         r["hub_over_5ms"]])
    print("\n".join(harness.table(["phase", "p50 ms", "p99 ms", "trips", "lost",
                                   "target RSS MB", "target main CPU %", "target zmq CPU %",
                                   "good CPU %", "flood CPU %", "connections", "shed",
                                   "longest hub round CPU ms", "hub rounds >= 5 ms CPU"],
                                  rows)))
    for label, result in results.items():
        flood, quiet = result["flood"], result["quiet"]
        print(f"{label}: p99 under flood {harness.verdict(flood['p99'], P99_TARGET_MS, False)}"
              f", RSS {harness.verdict(flood['rss_mb'], RSS_TARGET_MB, False)}; "
              f"p99 flood/quiet {harness.fmt(harness.ratio(flood['p99'], quiet['p99']))}")
        stats = {k: v for k, v in result["stats"].items() if v}
        print(f"{label}: stats after: {stats}")
    return 0


if __name__ == "__main__":
    harness.run(main)
