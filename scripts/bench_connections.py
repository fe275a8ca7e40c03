"""What a flood of idle TCP connections costs a listener, with and without the policy.

One run on loopback only. A child process serves an echo ROUTER (a plain
``HubSocket``, the way every overlay listener was served before, or the same
under ``GuardedListener`` with its default policy) with its descriptor limit
at ``--fd-limit``; this process opens ``--flood`` idle TCP connections to it
(they never send a byte) and, meanwhile, a good client asks ``--pings``
echoes. Per case: the child's CPU while the flood stands (percent of one
core), its RSS before, with the flood and after the flood closed, the
connections it holds, and the good client's answered echoes and p50/p99.

Cases take turns for ``--rounds`` rounds; the table shows the median round.
Targets: with the policy, every echo answered and RSS after the flood within
10% of RSS before; the listener CPU under the flood at most 10% of one core.

    python scripts/bench_connections.py                 # 1,500 connections, fd limit 1,024
    python scripts/bench_connections.py --flood 3000 --fd-limit 4096 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402

WAIT = 60.0  # seconds: bound on every wait
CASES = ("unguarded", "guarded")


def role_listener(parent: harness.Parent, guarded: bool, fd_limit: int) -> None:
    """An echo ROUTER; answers ``stats`` with its CPU, RSS and connections."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, hard))
    import logging

    import gevent
    import zmq

    from peermesh.counters import Counters
    from peermesh.io import HubSocket, bind_ephemeral, make_socket
    from peermesh.io.connections import COUNTERS, GuardedListener

    router = make_socket(zmq.ROUTER)
    endpoint = bind_ephemeral(router, harness.LOOPBACK)
    listener: Any = HubSocket(router, endpoint=endpoint)
    counters = Counters(logging.getLogger("bench"), "listener", COUNTERS)
    if guarded:
        listener = GuardedListener(listener, counters)
    gevent.spawn(listener.serve, lambda identity, frames: listener.try_send([identity, *frames]))
    # read without opening anything: out of descriptors, opening a file fails
    statm = os.open("/proc/self/statm", os.O_RDONLY)
    page_mb = os.sysconf("SC_PAGE_SIZE") / (1 << 20)
    parent.send("endpoint", endpoint)

    def answer(command: dict[str, Any]) -> Any:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        resident = int(os.pread(statm, 200, 0).split()[1]) * page_mb
        return {"cpu": usage.ru_utime + usage.ru_stime, "rss": round(resident, 1),
                "connections": getattr(listener, "connections", None), **counters.snapshot()}

    parent.serve(answer, green=True)


def flood(endpoint: str, count: int) -> list[socket.socket]:
    host, _, port = endpoint.rpartition("//")[2].rpartition(":")
    made = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect((host, int(port)))
        except BlockingIOError:
            pass
        made.append(sock)
    return made


def pings(endpoint: str, count: int) -> tuple[int, list[float]]:
    import zmq

    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    times: list[float] = []
    try:
        for i in range(count):
            start = time.perf_counter()
            dealer.send(str(i).encode())
            if not dealer.poll(1000):
                continue  # unanswered (the next one may still be)
            while dealer.recv() != str(i).encode():
                if not dealer.poll(1000):
                    break
            else:
                times.append(time.perf_counter() - start)
    finally:
        dealer.close(0)
        context.term()
    return len(times), sorted(times)


def one_case(children: harness.Children, guarded: bool, args: argparse.Namespace) -> dict[str, Any]:
    child = children.start("bench_connections", "listener", guarded=guarded,
                           fd_limit=args.fd_limit)
    endpoint = child.expect("endpoint", WAIT)
    before = child.ask()
    made = flood(endpoint, args.flood)
    try:
        time.sleep(args.settle)  # the flood stands: how much CPU it costs the listener
        during = child.ask()
        answered, times = pings(endpoint, args.pings)
        after_pings = child.ask()
    finally:
        for sock in made:
            sock.close()
    time.sleep(args.settle)
    after = child.ask()
    child.end(2.0)
    seconds = args.settle
    return {"case": "guarded" if guarded else "unguarded",
            "cpu %": round(100 * (during["cpu"] - before["cpu"]) / seconds, 1),
            "rss MB before": before["rss"], "rss MB flood": after_pings["rss"],
            "rss MB after": after["rss"], "held": during["connections"],
            "answered": f"{answered}/{args.pings}",
            "p50 ms": harness.percentile(times, 50) * 1e3 if times else None,
            "p99 ms": harness.percentile(times, 99) * 1e3 if times else None,
            "shed": during.get("connections_shed", 0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=1500)
    parser.add_argument("--fd-limit", type=int, default=1024)
    parser.add_argument("--pings", type=int, default=200)
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds the flood stands before it is measured")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print JSON, not the table")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    with harness.Children() as children:
        for round_ in range(args.rounds):
            for case in CASES:
                harness.progress(f"round {round_ + 1}: {case}")
                runs[case].append(one_case(children, case == "guarded", args))
    rows = [harness.median_run(runs[case], "cpu %") for case in CASES]
    guarded = rows[1]
    ok = (guarded["answered"] == f"{args.pings}/{args.pings}"
          and guarded["rss MB after"] <= 1.1 * guarded["rss MB before"]
          and guarded["cpu %"] <= 10)
    if args.json:
        print(harness.dump_json({"runs": runs, "median": rows, "met": ok}))
        return 0
    head = [k for k in rows[0] if k != "trials"]
    for line in harness.table(head, [[row[k] for k in head] for row in rows]):
        print(line)
    print(f"with the policy: every echo answered, memory returned, CPU <= 10%: "
          f"{'met' if ok else 'missed'}")
    return 0


if __name__ == "__main__":
    harness.run(main)
