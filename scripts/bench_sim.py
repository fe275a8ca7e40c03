#!/usr/bin/env python3
"""Convergence time and memory against N on the simulated network, and the
real-socket ceiling of one process.

    python scripts/bench_sim.py                 # N = 100, 500, 1000, 2000 (~5 min)
    python scripts/bench_sim.py --sizes 100,500,1000
    python scripts/bench_sim.py --real 10,20,40 # real zmq sockets, one process, loopback
    python scripts/bench_sim.py --sizes 300,1000 --jitter 1 --loss 0.02

Each size runs in a fresh process so memory figures do not mix; while one
runs, it prints a progress line on stderr every 10 s of wall time (ENTER
events so far out of N*(N-1), nodes with a full view, resident memory). For
the simulation it prints, per N: wall seconds until every node has ENTERed
every other (virtual time is also shown), resident memory in total and per
node, and mailbox messages sent. For --real it starts N nodes on loopback with
real sockets in one process and reports the time to a full mesh and the file
descriptors used, against the process limit (a full TCP mesh of N nodes in one
process needs about 3*N*(N-1) descriptors).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from typing import Any

import harness
from harness import (INTERFACE, ChildFailed, Children, Parent, dump_json, free_udp_port,
                     progress, rss_mb, table)

TARGET_1000_SECONDS = 30.0          # wall, on an idle machine
TARGET_1000_VIRTUAL = 5.0           # virtual seconds to the full mesh
TARGET_1000_BYTES = 4 * 1024 ** 3


def run_sim(n: int, limit: float, link: dict[str, float]) -> dict[str, Any]:
    from peermesh.sim import Simulation
    began = time.perf_counter()

    def progress(s: Simulation) -> None:
        print(f"  {n} nodes: {s.entered:,}/{n * (n - 1):,} ENTERs, {s.complete()} with a full "
              f"view, wall {time.perf_counter() - began:.0f} s, RSS {rss_mb():.0f} MB",
              file=sys.stderr, flush=True)

    from peermesh.config import NodeConfig

    # the default settings, as `peermesh simulate` passes them
    sim = Simulation(n, seed=1, config=NodeConfig(), **link)
    sim.watch(progress, every=10.0)
    cpu = time.process_time()
    sim.start()
    ok = sim.run_until(sim.is_full_mesh, limit)
    wall = time.perf_counter() - began
    report = sim.report()
    adds_up = all(c["sent"] == c["delivered"] + c["lost"] + c["in_flight"]
                  for c in (report["messages"], report["beacons"]))
    refused = sum(node.stats()[name] for node in sim.nodes
                  for name in ("peers_refused", "pending_refused"))
    return {"nodes": n, "full_mesh": ok, "wall_seconds": round(wall, 2),
            "cpu_seconds": round(time.process_time() - cpu, 2),
            "virtual_seconds": report["converged_after"], "rss_bytes": int(rss_mb() * 2**20),
            "per_node_bytes": report["memory_per_node_bytes"],
            "messages": report["messages"]["sent"], "counts_add_up": adds_up,
            "refused": refused}


def run_real(n: int, limit: float) -> dict[str, Any]:
    import gevent
    import peermesh
    port = free_udp_port()
    began = time.perf_counter()
    nodes = [peermesh.Node(f"r{i}", interface=INTERFACE, port=port, interval=0.2).start()
             for i in range(n)]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not all(len(x.peers()) == n - 1 for x in nodes):
        gevent.sleep(0.05)
    wall = time.perf_counter() - began
    full = all(len(x.peers()) == n - 1 for x in nodes)
    fds = len(os.listdir("/proc/self/fd"))
    for node in nodes:
        node.stop(0)
    return {"nodes": n, "full_mesh": full, "wall_seconds": round(wall, 2), "fds": fds,
            "fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "fds_predicted": 3 * n * (n - 1)}


def role_size(parent: Parent, kind: str, n: int, limit: float,
              link: dict[str, float]) -> dict[str, Any]:
    """One size in a fresh process (the harness ends it at once: tearing down millions
    of objects one by one takes half a minute)."""
    return run_sim(n, limit, link) if kind == "sim" else run_real(n, limit)


def child(kind: str, n: int, limit: float, timeout: float,
          link: dict[str, float]) -> dict[str, Any]:
    """Run one size in a fresh process; its progress lines and errors go to our stderr."""
    try:
        with Children(grace=0) as kids:
            return kids.start("bench_sim", "size", kind=kind, n=n, limit=limit,
                              link=link).expect("result", timeout)
    except ChildFailed as exc:
        return {"nodes": n, "error": str(exc).strip().splitlines()[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,500,1000,2000",
                        help="simulated network sizes (default: 100,500,1000,2000)")
    parser.add_argument("--real", default="", help="real-socket sizes, e.g. 10,20,40")
    parser.add_argument("--limit", type=float, default=30.0,
                        help="virtual seconds (sim) or real seconds (real) to wait for a full mesh")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="wall seconds one size may take in all (default: 1800)")
    parser.add_argument("--latency", type=float, default=1.0, metavar="MS",
                        help="simulated one-way latency (default: 1)")
    parser.add_argument("--jitter", type=float, default=0.0, metavar="MS",
                        help="simulated random extra latency, up to this (default: 0)")
    parser.add_argument("--loss", type=float, default=0.0, metavar="P",
                        help="simulated beacon loss probability (default: 0)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    link = {"latency": args.latency / 1000, "jitter": args.jitter / 1000, "loss": args.loss}
    rows = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        progress(f"simulating {n} nodes ...")
        rows.append({"kind": "sim", **child("sim", n, args.limit, args.timeout, link)})
    for n in [int(x) for x in args.real.split(",") if x]:
        progress(f"{n} nodes on real sockets in one process ...")
        rows.append({"kind": "real", **child("real", n, args.limit, args.timeout, link)})
    if args.json:
        print(dump_json(rows))
        return 0
    print("\n".join(table(
        ["kind", "N", "full", "wall s", "CPU s", "virtual s", "RSS MB", "KB/node", "fds"],
        [[r["kind"], str(r["nodes"]), f"error: {r['error']}", "", "", "", "", "", ""]
         if "error" in r
         else [r["kind"], str(r["nodes"]), str(r["full_mesh"]), str(r["wall_seconds"]),
               str(r.get("cpu_seconds", "")),
               str(r.get("virtual_seconds", "")), f"{r.get('rss_bytes', 0) / 2**20:.0f}",
               f"{r.get('per_node_bytes', 0) / 1024:.0f}",
               f"{r['fds']}/{r['fd_limit']}" if "fds" in r else ""] for r in rows])))
    for r in rows:
        if r.get("kind") == "sim" and r.get("nodes") == 1000 and "error" not in r:
            print(f"\n1,000 nodes: full mesh after {r['virtual_seconds']} virtual s (target <= "
                  f"{TARGET_1000_VIRTUAL:g}), {r['wall_seconds']} s wall and {r['cpu_seconds']} "
                  f"s CPU (target <= {TARGET_1000_SECONDS:g} wall on an idle machine), "
                  f"{r['rss_bytes'] / 2**30:.2f} GiB (target <= 4); report adds up: "
                  f"{r['counts_add_up']}; peers refused at a cap: {r['refused']}")
        if r.get("kind") == "sim" and r.get("nodes") == 2000:
            if "error" in r:
                print(f"2,000 nodes: {r['error']}")
            else:
                print(f"2,000 nodes: {'full mesh' if r['full_mesh'] else 'NO full mesh'}, "
                      f"{r['wall_seconds']} s wall, {r['rss_bytes'] / 2**30:.2f} GiB "
                      "(target: does not fall over)")
    return 0


if __name__ == "__main__":
    harness.run(main)
