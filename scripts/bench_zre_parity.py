#!/usr/bin/env python3
"""What Zyre's behaviours cost: restart -> ENTER on loopback, and Zyre's leader election
on the simulated network at N members.

    python scripts/bench_zre_parity.py                   # restarts x20; N = 3, 10, 100
    python scripts/bench_zre_parity.py --restarts 50 --sizes 3,10,100,200

**Restart -> ENTER.** A ``ThreadedNode`` on loopback meets a hand-made ZRE peer
(raw pyzmq: a ROUTER at a fixed port, a DEALER to the node). The peer's process
"crashes" (its sockets close) and a new peer under a new UUID binds the same port
and says HELLO, then WHISPERs at once, as a restarted Zyre does. Measured: from
that HELLO leaving to the node's ENTER of the new UUID (median and worst of
``--restarts``), and that every early WHISPER arrived. Zyre itself takes
10-13 ms; the target here is 50 ms.

**Election.** N nodes on the simulated network (0.5 ms per message), all in group
"ops", none contesting, until the mesh is whole; then 3 of them (the node of the
lowest UUID among them wins) call ``contest("ops")`` at the same virtual instant.
Measured: virtual time until every node reports that leader (``LEADER`` event and
``leader("ops")``), the wall time that took to compute, and the mailbox
messages sent meanwhile (ELECT and LEADER, echo waves of Zyre's algorithm).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid as uuid_module
from typing import Any

import harness
from harness import INTERFACE, LOOPBACK, dump_json, free_udp_port, progress, table

TARGET_ENTER_MS = 50.0
MESSAGE_LATENCY = 0.0005  # seconds per mailbox message on the simulated LAN
CONTESTERS = 3


def _raw_peer(port: int) -> tuple[Any, Any, uuid_module.UUID]:
    """A ROUTER bound at ``port`` and a new UUID (the DEALER is made by the caller)."""
    import zmq
    context = zmq.Context.instance()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    deadline = time.monotonic() + 5
    while True:  # the previous holder's listener closes in libzmq's I/O thread
        try:
            router.bind(f"tcp://{LOOPBACK}:{port}")
            break
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.001)
    return context, router, uuid_module.uuid4()


def restart_to_enter(restarts: int) -> dict[str, Any]:
    """Median and worst milliseconds from a restarted peer's HELLO to the node's ENTER."""
    import zmq

    from peermesh import ThreadedNode
    from peermesh.events import EventType
    from peermesh.wire import zre

    node = ThreadedNode("observer", interface=INTERFACE, port=free_udp_port(),
                        discovery=(), interval=1.0).start()
    context = zmq.Context.instance()
    probe = context.socket(zmq.ROUTER)
    port = probe.bind_to_random_port(f"tcp://{LOOPBACK}", 49152, 65535)
    probe.close(linger=0)
    endpoint = f"tcp://{LOOPBACK}:{port}"
    times: list[float] = []
    lost = 0
    try:
        for round_ in range(restarts + 1):  # round 0 only puts the first peer in place
            context, router, uuid = _raw_peer(port)
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.IDENTITY, b"\x01" + uuid.bytes)
            dealer.connect(node.endpoint)
            hello = zre.encode(zre.Hello(1, endpoint, ("chat",), 1, f"peer{round_}", {}))
            sent = time.perf_counter()
            dealer.send_multipart(hello)
            for n in range(20):  # at once, as Zyre: before knowing the HELLO was taken
                dealer.send_multipart([zre.whisper_header(2 + n), b"early-%d" % n])
            entered = None
            whispers = 0
            deadline = time.monotonic() + 10
            while whispers < 20 and time.monotonic() < deadline:
                event = node.recv(timeout=max(0.0, deadline - time.monotonic()))
                if event is None:
                    break
                if event.peer != uuid:
                    continue
                if event.type is EventType.ENTER and entered is None:
                    entered = time.perf_counter()
                elif event.type is EventType.WHISPER:
                    whispers += 1
            if entered is None:
                raise RuntimeError(f"restart {round_}: no ENTER within 10 s")
            if round_:
                times.append((entered - sent) * 1000)
                lost += 20 - whispers
            # the peer "crashes": its sockets close; the next one binds the same port
            router.close(linger=0)
            dealer.close(linger=0)
    finally:
        node.stop(0.2)
    ordered = sorted(times)
    return {"restarts": restarts, "median_ms": round(statistics.median(ordered), 2),
            "p90_ms": round(harness.percentile(ordered, 90), 2),
            "max_ms": round(ordered[-1], 2), "whispers_lost": lost}


def election(size: int, limit: float = 120.0) -> dict[str, Any]:
    """Virtual and wall time of one election among ``size`` simulated members."""
    from peermesh.events import EventType
    from peermesh.sim import Simulation

    sim = Simulation(size, seed=7, latency=MESSAGE_LATENCY, groups=("ops",), interval=1.0)
    sim.start()
    if not sim.run_until(sim.is_full_mesh, limit):
        raise RuntimeError(f"{size} nodes: no full mesh within {limit} s")
    sim.run(2.0)  # the JOINs of the HELLOs settle
    contesters = sim.nodes[:CONTESTERS]
    winner = min(contesters, key=lambda n: n.uuid.hex)
    reported: set[Any] = set()
    for node in sim.nodes:
        def listen(event: Any, node: Any = node) -> None:
            if event.type is EventType.LEADER and event.peer == winner.uuid:
                reported.add(node)
        node.add_listener(listen)
    sent_before = sim.network.sent
    began_virtual, began_wall = sim.clock.now(), time.perf_counter()
    for node in contesters:
        node.contest("ops")

    def done() -> bool:
        return len(reported) == size and all(n.leader("ops") == winner.uuid for n in sim.nodes)

    ok = sim.run_until(done, limit, step=MESSAGE_LATENCY)
    wall = time.perf_counter() - began_wall
    result = {"members": size, "elected": ok,
              "virtual_ms": round((sim.clock.now() - began_virtual) * 1000, 2),
              "wall_ms": round(wall * 1000, 1), "messages": sim.network.sent - sent_before}
    sim.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_zre_parity.py", description=__doc__.split("\n")[0])
    p.add_argument("--restarts", type=int, default=20, metavar="N",
                   help="restarts at one endpoint measured (default: %(default)s)")
    p.add_argument("--sizes", default="3,10,100", metavar="LIST",
                   help="election members, comma-separated (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    progress(f"restart -> ENTER, {args.restarts} restarts")
    restart = restart_to_enter(args.restarts)
    elections = []
    for size in sizes:
        progress(f"election among {size} simulated members")
        elections.append(election(size))
    if args.json:
        print(dump_json({"restart": restart, "elections": elections}))
        return 0
    lines = table(["restart -> ENTER", "median ms", "p90 ms", "max ms", "target ms",
                   "early WHISPERs lost"],
                  [[f"{restart['restarts']} restarts", restart["median_ms"], restart["p90_ms"],
                    restart["max_ms"], TARGET_ENTER_MS, restart["whispers_lost"]]])
    lines.append("")
    lines += table(["election", "elected", "virtual ms", "wall ms", "messages"],
                   [[f"{e['members']} members, {CONTESTERS} contest",
                     "yes" if e["elected"] else "no",
                     e["virtual_ms"], e["wall_ms"], e["messages"]] for e in elections])
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
