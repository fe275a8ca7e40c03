#!/usr/bin/env python3
"""Flux overlay: RPC latency against raw pyzmq, ping all, event fan-out, 1,000 ranks.

    python scripts/bench_flux.py                          # every section (~3 min idle)
    python scripts/bench_flux.py --only latency --rounds 5
    python scripts/bench_flux.py --only pingall,events --ranks 512
    python scripts/bench_flux.py --only sim --sim-sizes 100,1000,10000

Sections:

* ``latency``: p50 of a ``broker.ping`` RPC (100-byte payload) one hop away
  (rank 1 pings rank 0, two processes) and three hops away (a kary:1 chain
  of four processes, rank 3 pings rank 0), next to a raw pyzmq
  DEALER<->ROUTER echo of the same payload in the same round (the ceiling).
  Targets: one hop <= 1.5x raw, three hops <= 3x raw (median of per-round
  ratios).
* ``pingall``: ``--ranks`` ranks on real sockets in ONE process (kary:2 and
  kary:32): time to start and converge, then ``broker.ping`` to every rank
  at once from rank 0 (as ``flux ping all``): mean and max round trip of
  the responses, against flux-core's published mean of 21 ms for 480 ranks
  (flux-core PR 689, 30 nodes with 16 brokers each: here every broker shares
  one Python process and one core); descriptors used.
* ``events``: the same process publishes events and measures the CPU per
  delivered event (every rank subscribed).
* ``sim``: one event's fan-out at ``--sim-sizes`` simulated ranks (kary:32, 1 ms
  links): the tree's depth in hops, virtual time (the publisher's request up
  to rank 0, then down every branch) and wall time until every rank has it,
  and the memory used.
* ``thousand``: 1,000 real-socket ranks in one process start, converge and
  answer ping all.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Optional

import harness
from harness import (LOOPBACK, Children, Parent, cpu, dump_json, interleaved, percentile,
                     progress, round_ratios, rss_mb, table, verdict)

PAYLOAD = b"x" * 100
TARGET_ONE_HOP = 1.5
TARGET_THREE_HOPS = 3.0
FLUX_CORE_PING_ALL_MS = 21.0


# --- child roles --------------------------------------------------------------

def _settings() -> Any:
    from peermesh.flux import FluxSettings
    return FluxSettings(heartbeat=1.0, torpid=5.0, lost=10.0, hello_timeout=2.0)


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
    parent.send("ready", {"rank": flux.rank})
    parent.expect("go", 60, green=True)
    clock = time.perf_counter_ns
    samples = []
    c0 = cpu()
    for i in range(warmup + n):
        if i == warmup:
            c0 = cpu()
        t = clock()
        if flux.rpc("broker.ping", PAYLOAD, target).get(10) != PAYLOAD:
            raise RuntimeError("the ping came back changed")
        if i >= warmup:
            samples.append(clock() - t)
    used = cpu() - c0
    flux.stop()
    us = sorted(s / 1000 for s in samples)
    return {"p50_us": percentile(us, 50), "p99_us": percentile(us, 99),
            "mean_us": statistics.fmean(us), "ping_cpu_us": used / n * 1e6}


def _ping_all(root: Any, n: int) -> dict[str, float]:
    began = time.perf_counter()
    futures = [root.rpc("broker.ping", b"", rank) for rank in range(n)]
    times = []
    for future in futures:
        future.get(60)
        times.append(time.perf_counter() - began)
    return {"mean_ms": statistics.fmean(times) * 1000, "max_ms": max(times) * 1000}


def role_ranks(parent: Parent, n: int, topology: str, events: int = 0,
               rounds: int = 5) -> dict[str, Any]:
    """``n`` ranks on real sockets in this one process: start, converge, ping all,
    and (``events``) CPU per delivered event."""
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
    _ping_all(root, n)  # warm-up
    pings = [_ping_all(root, n) for _ in range(rounds)]
    result: dict[str, Any] = {
        "ranks": n, "topology": topology, "start_s": started - began,
        "converge_s": converged - started, "fds": fds, "fds_per_rank": fds / n,
        "ping_all_mean_ms": statistics.median(p["mean_ms"] for p in pings),
        "ping_all_max_ms": statistics.median(p["max_ms"] for p in pings),
        "rss_mb": rss_mb()}
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
    for node in nodes:
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

def latency_case(kind: str, n: int, warmup: int) -> dict[str, Any]:
    """raw, one_hop or three_hops; one run."""
    with Children() as kids:
        if kind == "raw":
            echo = kids.start("bench_mesh", "raw_echo", total=n + warmup)
            port = echo.expect("ready", 30)
            ping = kids.start("bench_mesh", "raw_ping", port=port, n=n, warmup=warmup)
            ping.expect("ready", 30)
            ping.send("go")
            result = ping.expect("result", 60 + n / 100)
            echo.send("stop")
            echo.expect("result", 15)
            return result
        hops = 1 if kind == "one_hop" else 3
        chain = [kids.start("bench_flux", "flux_node", topology="kary:1", root=True)]
        endpoints = [chain[0].expect("ready", 60)["endpoint"]]
        for _ in range(hops - 1):
            node = kids.start("bench_flux", "flux_node", topology="kary:1",
                              parents=[endpoints[-1]])
            endpoints.append(node.expect("ready", 60)["endpoint"])
        ping = kids.start("bench_flux", "flux_ping", topology="kary:1", parents=[endpoints[-1]],
                          target=0, n=n, warmup=warmup)
        rank = ping.expect("ready", 60)["rank"]
        if rank != hops:
            raise RuntimeError(f"the pinger got rank {rank}, not {hops}")
        ping.send("go")
        return dict(ping.expect("result", 60 + n / 50))


def child_result(role: str, timeout: float, **kwargs: Any) -> dict[str, Any]:
    with Children(grace=0) as kids:
        return dict(kids.start("bench_flux", role, **kwargs).expect("result", timeout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="latency,pingall,events,sim,thousand",
                        help="sections, comma-separated (default: all)")
    parser.add_argument("--rounds", type=int, default=3, help="latency rounds (default: 3)")
    parser.add_argument("-n", type=int, default=2000, help="round trips per latency run")
    parser.add_argument("--ranks", type=int, default=512, help="real-socket ranks (512)")
    parser.add_argument("--events", type=int, default=20, help="events published (20)")
    parser.add_argument("--sim-sizes", default="100,1000,10000")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    only = set(args.only.split(","))
    load = os.getloadavg()
    out: dict[str, Any] = {"loadavg": load}
    lines: list[str] = [f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"]
    if "latency" in only:
        runs = interleaved({kind: (lambda r, kind=kind: latency_case(kind, args.n, 200))
                            for kind in ("raw", "one_hop", "three_hops")}, args.rounds)
        one = statistics.median(round_ratios(runs["one_hop"], runs["raw"], "p50_us"))
        three = statistics.median(round_ratios(runs["three_hops"], runs["raw"], "p50_us"))
        out["latency"] = {"runs": runs, "one_hop_ratio": one, "three_hops_ratio": three}
        p50 = {k: statistics.median(r["p50_us"] for r in v) for k, v in runs.items()}
        lines += ["", "RPC round trip p50 (median of rounds):"] + table(
            ["case", "p50 us", "ratio to raw", "verdict"],
            [["raw DEALER<->ROUTER echo", f"{p50['raw']:.0f}", "1", ""],
             ["flux one hop", f"{p50['one_hop']:.0f}", f"{one:.2f}",
              verdict(one, TARGET_ONE_HOP, False)],
             ["flux three hops", f"{p50['three_hops']:.0f}", f"{three:.2f}",
              verdict(three, TARGET_THREE_HOPS, False)]])
    rows = []
    for topology in ("kary:2", "kary:32"):
        if "pingall" in only or ("events" in only and topology == "kary:32"):
            progress(f"{args.ranks} ranks on real sockets, {topology} ...")
            rows.append(child_result("ranks", 900, n=args.ranks, topology=topology,
                                     events=args.events if "events" in only else 0))
    if "thousand" in only:
        progress("1,000 ranks on real sockets, kary:32 ...")
        rows.append(child_result("ranks", 900, n=1000, topology="kary:32", rounds=3))
    if rows:
        out["ranks"] = rows
        lines += ["", f"ping all on real sockets, every rank in one process (flux-core: mean "
                  f"{FLUX_CORE_PING_ALL_MS:g} ms at 480 ranks on 30 nodes):"] + table(
            ["ranks", "topology", "start s", "converge s", "mean ms", "max ms", "fds",
             "fds/rank", "event us CPU/delivery"],
            [[str(r["ranks"]), r["topology"], f"{r['start_s']:.2f}", f"{r['converge_s']:.2f}",
              f"{r['ping_all_mean_ms']:.1f}", f"{r['ping_all_max_ms']:.1f}", str(r["fds"]),
              f"{r['fds_per_rank']:.1f}",
              f"{r['event_cpu_us_per_delivery']:.1f}" if "event_cpu_us_per_delivery" in r
              else ""] for r in rows])
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
