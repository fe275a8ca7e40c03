"""How long does a node's hub make ready I/O wait while its beacon listener is flooded?

One process holds a gevent ``Node`` (interface ``lo``) and a probe: a reader
on a socket pair, woken by a byte written to the other end; its wake-up
latency is what any other socket of the hub (the mailbox, a good peer's
messages) waits behind the beacon listener. A child process sends
``--rate`` beacons per second with random UUIDs to the node's port.

The listener yields to the hub between batches of datagrams. Two ways are
measured, interleaved at random in short windows of the same run so that
load from elsewhere hits both alike: ``gevent.idle()`` (what the listener
does) and ``gevent.sleep(0)`` (what it did: other greenlets run, but the hub
does not poll for I/O, so ready sockets wait for tens of milliseconds).

    python scripts/bench_hub_lag.py                  # 16,000 beacons/s for 10 s
    python scripts/bench_hub_lag.py --seconds 5 --rate 8000
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

WAYS = ("idle", "sleep0")


def role_flood(parent: harness.Parent, port: int, rate: int, seconds: float) -> None:
    """Send ``rate`` beacons a second (random UUIDs, closed ports) for ``seconds``."""
    from peermesh.wire import zre
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    udp.bind((harness.LOOPBACK, 0))
    parent.send("ready")
    started, sent = time.monotonic(), 0
    while time.monotonic() < started + seconds:
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            beacon = zre.Beacon(uuid_module.uuid4().bytes, 40000 + sent % 1000)
            try:
                udp.sendto(zre.encode_beacon(beacon), (harness.LO_BROADCAST, port))
            except OSError:
                pass
            sent += 1
        time.sleep(0.001)
    parent.send("sent", sent)


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    import gevent
    import gevent.socket
    from gevent.event import Event

    import peermesh.discovery.beacon as beacon
    from peermesh import Node, NodeConfig

    way = {"now": "idle"}

    class Yield:
        """``gevent`` as the listener sees it, its ``idle`` the way measured now."""

        def __getattr__(self, name: str) -> Any:
            return getattr(gevent, name)

        def idle(self) -> None:
            if way["now"] == "idle":
                gevent.idle()
            else:
                gevent.sleep(0)

    beacon.gevent = Yield()  # type: ignore[assignment]
    port = harness.free_udp_port()
    node = Node("lagged", config=NodeConfig(), interface=harness.INTERFACE, port=port).start()
    near, far = gevent.socket.socketpair()
    woke: list[float] = []
    ready = Event()

    def probe() -> None:
        while True:
            near.recv(16)
            woke.append(time.perf_counter())
            ready.set()

    reader = gevent.spawn(probe)
    lags: dict[str, list[float]] = {w: [] for w in WAYS}
    with harness.Children() as children:
        flood = children.start("bench_hub_lag", "flood", port=port, rate=args.rate,
                               seconds=args.seconds + 1)
        flood.expect("ready", 30)
        gevent.sleep(0.3)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            way["now"] = random.choice(WAYS)
            gevent.sleep(0.02)
            for _ in range(10):
                ready.clear()
                sent = time.perf_counter()
                far.send(b"x")
                if ready.wait(2.0):
                    lags[way["now"]].append((woke[-1] - sent) * 1000)
                gevent.sleep(0.003)
        flood.expect("sent", 30 + args.seconds)
    reader.kill()
    node.stop(0.5)
    return {w: sorted(v) for w, v in lags.items()}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=16_000, help="beacons per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    lags = measure(args)
    print(f"\n{args.rate:,} beacons/s for {args.seconds:g} s; load average "
          f"{os.getloadavg()[0]:.1f}")
    rows = [[w, harness.percentile(v, 50), harness.percentile(v, 90),
             harness.percentile(v, 99), v[-1] if v else None, len(v)] for w, v in lags.items()]
    print("\n".join(harness.table(["listener yields with", "p50 ms", "p90 ms", "p99 ms",
                                   "max ms", "wakes"], rows)))
    print(f"p99 sleep(0)/idle: "
          f"{harness.fmt(harness.ratio(harness.percentile(lags['sleep0'], 99), harness.percentile(lags['idle'], 99)))}")
    return 0


if __name__ == "__main__":
    harness.run(main)
