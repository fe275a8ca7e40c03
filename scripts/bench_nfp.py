#!/usr/bin/env python3
"""Benchmark NFP jobs: sequential round trips, brokerless and brokered; broker failover.

Every process is started by this run and stays on loopback (127.0.0.1,
beacons to 127.255.255.255 on a free, non-default UDP port). One client (a
gevent ``Node`` with an ``NfpNode``) and one worker, plus a broker for the
brokered case, each in a process of its own:

1. sequential job round trips, POST -> result (``Client.run``: POST, 202,
   then the result; results persisted by the worker and the client in their
   SQLite stores), brokerless and brokered: jobs/s, p50, p99;
2. a reference "floor": the brokered message pattern (client -> broker ->
   worker, one answer back through the broker: a quick job's 202 carries its
   result) through peermesh's one driver with no NFP processing;
3. broker failover: two broker candidates (priority 10 and 5) and a worker;
   the elected broker is killed with SIGKILL and the time until a job has
   gone through the new broker is measured. With ZRE ``expired`` set to E
   the bound is 2 x E (issue 5); this run uses ``--expired`` (default 1 s);

and the CPU each process spends per job, by thread. Targets (issue 5):
brokered p50 <= 1 ms and >= 1,500 jobs/s; brokerless faster; failover within
2 x expired. ``--repeat N`` measures 1-2 N times, interleaved, and reports
the median run; ``--baseline REV`` measures them with an older commit's
peermesh too, interleaved, and prints now/baseline ratios::

    python scripts/bench_nfp.py --baseline c28923a --repeat 3 --jobs 3000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import tempfile
import time
from typing import Any, Optional

import harness
from harness import (INTERFACE, Children, Parent, dump_json, free_tcp_endpoint, free_udp_port,
                     interleaved, median_run, percentile, progress, socket_driver, table,
                     threads_cpu, trees)

TARGETS = {"brokered_p50_ms": 1.0, "brokered_jobs_per_s": 1500.0}
MODES = ("brokerless", "brokered", "floor")


# ---------------------------------------------------------------------------
# roles: each runs in a child process of its own (harness.Children.start)

def role_nfp_node(parent: Parent, **cfg: Any) -> None:
    """A node with an NfpNode (a broker, a worker of ``cfg["workers"]``, or both) that
    runs until the parent hangs up."""
    import gevent

    from peermesh import Node
    from peermesh.nfp import NfpNode, Tasks
    tasks = Tasks()

    @tasks.task()
    def echo(job: Any, *args: Any, **kwargs: Any) -> Any:
        return {"args": list(args), "kwargs": kwargs}

    node = Node(cfg["name"], interface=INTERFACE, port=cfg["port"], interval=cfg["interval"],
                evasive=cfg["evasive"], silent=cfg["silent"], expired=cfg["expired"])
    nfp = NfpNode(node, data_dir=cfg["data_dir"], broker=cfg["broker"],
                  priority=cfg["priority"], keepalive=cfg["keepalive"], request_timeout=2.0,
                  queue_timeout=5.0)
    for service, name in cfg["workers"]:
        nfp.add_worker(service, name, tasks)
    node.start()
    nfp.start()
    profile = None
    if cfg.get("profile"):
        import cProfile
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
    parent.send("ready", node.uuid.hex)
    drain = gevent.spawn(lambda: [None for _ in node.events()])
    try:
        parent.recv(600, green=True)       # "stop", or EOF when the parent hangs up
    except (EOFError, TimeoutError):
        pass
    drain.kill()
    if profile is not None:
        profile.disable()
        profile.dump_stats(cfg["profile"])
    nfp.stop()
    node.stop()


def role_relay(parent: Parent, side: str, endpoint: str) -> None:
    """The floor's broker (a ROUTER passing client <-> worker) or worker (a DEALER that
    answers every message with itself), on peermesh's one driver."""
    peers: dict[str, bytes] = {}
    if side == "broker":
        def relay(frames: list[bytes]) -> None:
            if frames[-1] == b"W":
                peers["w"] = frames[0]
            elif frames[0] == peers.get("w"):
                driver.send([peers["c"], *frames[1:]])
            else:
                peers["c"] = frames[0]
                driver.send([peers["w"], *frames[1:]])
    else:
        def relay(frames: list[bytes]) -> None:
            driver.send(frames)   # the 202, carrying the result
    driver = socket_driver(endpoint, side == "broker", relay)
    if side == "worker":
        driver.send([b"", b"", b"W"])
    parent.send("ready")
    try:
        parent.recv(600, green=True)
    except (EOFError, TimeoutError):
        pass


def role_measure(parent: Parent, mode: str, jobs: int, data_dir: str,
                 profile: Optional[str]) -> dict[str, Any]:
    """One measurement of ``mode`` (brokerless, brokered or floor), this process the client."""
    if mode == "floor":
        return transport_floor(jobs)
    return round_trips(mode, jobs, data_dir, profile)


def role_failover(parent: Parent, expired: float, data_dir: str) -> dict[str, Any]:
    return failover(expired, data_dir)


# ---------------------------------------------------------------------------
# the client's side of each measurement

def _cpu_per_job(pids: dict[str, int], before: dict[str, dict[str, float]],
                 count: int) -> dict[str, dict[str, float]]:
    """Microseconds of CPU per job of each process (and thread kind) since ``before``."""
    out = {}
    for name, pid in pids.items():
        after = threads_cpu(pid)
        out[name] = {k: round((after[k] - before[name][k]) / count * 1e6, 1) for k in after}
        out[name]["total"] = round(sum(out[name].values()), 1)
    return out


def _rates(latencies: list[float], elapsed: float, cpu: dict[str, Any]) -> dict[str, Any]:
    ordered = sorted(latencies)
    return {"jobs": len(latencies), "jobs_per_s": round(len(latencies) / elapsed, 1),
            "p50_ms": round(percentile(ordered, 50) * 1e3, 3),
            "p99_ms": round(percentile(ordered, 99) * 1e3, 3),
            "mean_ms": round(statistics.fmean(latencies) * 1e3, 3), "cpu_us_per_job": cpu}


def transport_floor(count: int) -> dict[str, Any]:
    """The brokered message pattern (C->B->W->B->C) with no processing at all."""
    import gevent
    import gevent.event

    endpoint = free_tcp_endpoint()
    with Children(grace=3) as kids:
        procs = [kids.start("bench_nfp", "relay", side=side, endpoint=endpoint)
                 for side in ("broker", "worker")]
        for proc in procs:
            proc.expect("ready", 30)
        got = gevent.event.Event()
        driver = socket_driver(endpoint, False, lambda frames: got.set())
        frames = [b"", b"NFPC01", b"\x04", b"bench", b"any", b"0" * 32,
                  b'{"task":"echo","args":[1],"kwargs":{},"rid":"1"}']
        gevent.sleep(0.3)   # let both connections finish their handshakes
        latencies = []
        pids = {"client": os.getpid(), "broker": procs[0].pid, "worker": procs[1].pid}
        cpu0 = {name: threads_cpu(pid) for name, pid in pids.items()}
        for _ in range(count):
            got.clear()
            t0 = time.perf_counter()
            driver.send(frames)
            if not got.wait(2):
                raise RuntimeError("floor: no answer")
            latencies.append(time.perf_counter() - t0)
        cpu = _cpu_per_job(pids, cpu0, count)
        driver.close()
    return _rates(latencies, sum(latencies), cpu)


def round_trips(mode: str, count: int, data_dir: str, profiles: Optional[str]) -> dict[str, Any]:
    """Sequential Client.run round trips against one worker (and a broker if brokered)."""
    import gevent

    from peermesh import Node
    from peermesh.nfp import NfpNode

    port = free_udp_port()
    timing: dict[str, Any] = dict(port=port, interval=0.1, evasive=1.0, silent=1.5,
                                  expired=2.0, keepalive=0.5, data_dir=data_dir)

    def profile(name: str) -> Optional[str]:
        return os.path.join(profiles, f"{mode}-{name}.prof") if profiles else None
    names = ["broker", "worker"] if mode == "brokered" else ["worker"]
    with Children(grace=3) as children:
        if mode == "brokered":
            children.start("bench_nfp", "nfp_node", name="bench-broker", broker="always",
                           priority=0, workers=[], profile=profile("broker"), **timing)
        children.start("bench_nfp", "nfp_node", name="bench-worker", broker="never", priority=0,
                       workers=[["bench", "w1"]], profile=profile("worker"), **timing)
        for child in children.children:
            child.expect("ready", 30)
        node = Node("bench-client", interface=INTERFACE, port=port, interval=0.1, evasive=1.0,
                    silent=1.5, expired=2.0)
        nfp = NfpNode(node, data_dir=data_dir, keepalive=0.5)
        node.start()
        nfp.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                ready = (nfp.current_broker is not None) if mode == "brokered" else \
                    bool(nfp.client.direct_workers().get("bench"))
                if ready and nfp.settled.is_set():
                    reply = nfp.client.run("bench", "echo", [0], target="any", timeout=2)
                    if reply.status == 200:
                        break
                gevent.sleep(0.05)
            else:
                raise RuntimeError(f"{mode}: the mesh did not come up")
            if mode == "brokered" and nfp.current_broker is None:
                raise RuntimeError("brokered: no broker")
            for i in range(min(200, count // 5)):  # warm up
                nfp.client.run("bench", "echo", [i], target="any", timeout=5)
            latencies = []
            profiler = None
            if profiles:
                import cProfile
                profiler = cProfile.Profile(time.thread_time)
                profiler.enable()
            pids = {"client": os.getpid()}
            pids.update(zip(names, (p.pid for p in children.children)))
            cpu0 = {name: threads_cpu(pid) for name, pid in pids.items()}
            start = time.perf_counter()
            for i in range(count):
                t0 = time.perf_counter()
                reply = nfp.client.run("bench", "echo", [i], target="any", timeout=5)
                latencies.append(time.perf_counter() - t0)
                if reply.status != 200:
                    raise RuntimeError(f"{mode}: job {i} ended {reply.status}: {reply.body}")
            elapsed = time.perf_counter() - start
            cpu = _cpu_per_job(pids, cpu0, count)
            if profiler is not None and profiles:
                profiler.disable()
                profiler.dump_stats(os.path.join(profiles, f"{mode}-client.prof"))
        finally:
            nfp.stop()
            node.stop()
    return {"mode": mode, **_rates(latencies, elapsed, cpu)}


def failover(expired: float, data_dir: str) -> dict[str, Any]:
    """Kill the elected broker; time until a job has gone through the next one."""
    import gevent

    from peermesh import Node
    from peermesh.nfp import NfpNode

    port = free_udp_port()
    timing: dict[str, Any] = dict(port=port, interval=min(0.1, expired / 5),
                                  evasive=expired / 2, silent=expired * 0.75, expired=expired,
                                  keepalive=0.2, data_dir=data_dir)
    with Children(grace=3) as children:
        first = children.start("bench_nfp", "nfp_node", name="bench-b1", broker="auto",
                               priority=10, workers=[], **timing)
        children.start("bench_nfp", "nfp_node", name="bench-b2", broker="auto", priority=5,
                       workers=[], **timing)
        children.start("bench_nfp", "nfp_node", name="bench-fw", broker="never", priority=0,
                       workers=[["fo", "fw1"]], **timing)
        for child in children.children:
            child.expect("ready", 30)
        node = Node("bench-fo-client", interface=INTERFACE, port=port,
                    interval=timing["interval"], evasive=timing["evasive"],
                    silent=timing["silent"], expired=expired)
        nfp = NfpNode(node, data_dir=data_dir, keepalive=0.2, request_timeout=0.5)
        node.start()
        nfp.start()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                broker = nfp.current_broker
                if broker is not None and broker.name == "bench-b1":
                    if nfp.client.run("fo", "echo", [0], target="any", timeout=1).status == 200:
                        break
                gevent.sleep(0.05)
            else:
                raise RuntimeError("failover: bench-b1 never became broker")
            killed = time.monotonic()
            os.kill(first.pid, signal.SIGKILL)
            first.process.wait()
            served: Optional[float] = None
            elected: Optional[float] = None
            while time.monotonic() - killed < 2 * expired + 5:
                broker = nfp.current_broker
                if broker is not None and broker.name == "bench-b2":
                    elected = elected or time.monotonic()
                    reply = nfp.client.run("fo", "echo", [1], target="any", timeout=1)
                    if reply.status == 200:
                        served = time.monotonic()
                        break
                gevent.sleep(0.01)
        finally:
            nfp.stop()
            node.stop()
    if served is None:
        raise RuntimeError("failover: no job went through the new broker in time")
    return {"expired_s": expired, "bound_s": 2 * expired,
            "elected_after_s": round((elected or served) - killed, 3),
            "serving_after_s": round(served - killed, 3)}


# ---------------------------------------------------------------------------
# the parent: interleaved rounds, the report

def measure(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    only = set(args.only.split(","))
    code = trees(args.baseline)
    timeout = 120 + args.jobs / 50

    def case(mode: str, tree: str, label: str) -> Any:
        def run(r: int) -> dict[str, Any]:
            with Children() as kids:
                child = kids.start("bench_nfp", "measure", tree, mode=mode, jobs=args.jobs,
                                   data_dir=os.path.join(data_dir, f"{mode}-{label}-{r}"),
                                   profile=args.profile if label == "peermesh" else None)
                result = child.expect("result", timeout)
            progress(f"  {result['jobs_per_s']:,.0f} jobs/s, p50 {result['p50_ms']:.3f} ms")
            return result
        return run
    cases = {f"{mode}{'' if label == 'peermesh' else ' [baseline]'}": case(mode, tree, label)
             for mode in MODES if mode in only for label, tree in code.items()}
    runs = interleaved(cases, args.repeat)
    results: dict[str, Any] = {"library": code["peermesh"]}
    for name, done in runs.items():
        chosen = median_run(done, "jobs_per_s")
        chosen["runs"] = [[r["jobs_per_s"], r["p50_ms"]] for r in done]
        if name.endswith(" [baseline]"):
            results.setdefault("baseline", {"library": code["baseline"]})[name.split()[0]] = chosen
        else:
            results[name] = chosen
    if "failover" in only:
        progress("failover ...")
        with Children() as kids:
            results["failover"] = kids.start(
                "bench_nfp", "failover", expired=args.expired,
                data_dir=os.path.join(data_dir, "failover")).expect("result", 60 + 4 * args.expired)
    return results


def targets(results: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    b = results.get("brokered")
    if b is not None:
        out["brokered_p50_ms"] = {"target": TARGETS["brokered_p50_ms"], "got": b["p50_ms"],
                                  "met": b["p50_ms"] <= TARGETS["brokered_p50_ms"]}
        out["brokered_jobs_per_s"] = {
            "target": TARGETS["brokered_jobs_per_s"], "got": b["jobs_per_s"],
            "met": b["jobs_per_s"] >= TARGETS["brokered_jobs_per_s"]}
        if "brokerless" in results:
            out["brokerless_faster"] = results["brokerless"]["p50_ms"] <= b["p50_ms"]
    if "failover" in results:
        out["failover_within_2x_expired"] = results["failover"]["serving_after_s"] \
            <= results["failover"]["bound_s"]
    return out


def report(results: dict[str, Any], repeat: int) -> str:
    base = results.get("baseline", {})
    rows = []
    for mode in MODES:
        for label, r in (("", results.get(mode)), (" [baseline]", base.get(mode))):
            if r is None:
                continue
            now = results[mode]
            vs = "" if label or mode not in base else \
                f"{now['jobs_per_s'] / base[mode]['jobs_per_s']:.3f}"
            rows.append([mode + label, f"{r['jobs_per_s']:.0f}", f"{r['p50_ms']:.3f}",
                         f"{r['p99_ms']:.3f}", *([vs] if base else []),
                         " ".join(f"{rate:.0f}" for rate, _ in r["runs"])])
            for name, c in r["cpu_us_per_job"].items():
                rows.append([f"  CPU us/job {name}", f"{c['total']:.1f}",
                             f"main {c['main']:.1f}", f"zmq {c['zmq']:.1f}",
                             *([""] if base else []), f"other {c['other']:.1f}"])
    head = ["mode", "jobs/s", "p50 ms", "p99 ms", *(["now/base"] if base else []),
            f"jobs/s of each run ({repeat})"]
    lines = table(head, rows) if rows else []
    if "floor" in results:
        lines.append("floor: the brokered message pattern through peermesh's one driver, "
                     "no processing")
    if base:
        lines.append(f"baseline: {base['library']}; now/base = jobs/s ratio of the median runs")
    if "failover" in results:
        f = results["failover"]
        lines.append(f"failover: new broker elected after {f['elected_after_s']:.3f}s, serving "
                     f"after {f['serving_after_s']:.3f}s (expired {f['expired_s']:g}s, "
                     f"bound {f['bound_s']:g}s)")
    for name, t in results["targets"].items():
        lines.append(f"target {name}: {t}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="round trips per mode")
    parser.add_argument("--expired", type=float, default=1.0,
                        help="ZRE expired timeout for the failover run (seconds)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--only", default="brokerless,brokered,floor,failover",
                        help="comma-separated sections to run (default: all)")
    parser.add_argument("--baseline", "--compare", metavar="REV", dest="baseline",
                        help="also measure brokerless, brokered and the floor with the peermesh "
                             "of REV (a commit, or a directory holding a peermesh package), "
                             "interleaved with this checkout's")
    parser.add_argument("--profile", metavar="DIR",
                        help="run client, broker and worker under cProfile and write "
                             "DIR/<mode>-<process>.prof (timings are then not comparable)")
    parser.add_argument("--repeat", "--rounds", type=int, default=1, metavar="N",
                        help="measure brokerless, brokered and the floor N times each, "
                             "interleaved, and report the median run with every run's rate "
                             "(default: %(default)s)")
    args = parser.parse_args()
    if args.repeat < 1 or args.jobs < 1:
        parser.error("--jobs and --repeat must be at least 1")
    if args.profile:
        args.profile = os.path.abspath(args.profile)
        os.makedirs(args.profile, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="bench-nfp-")
    try:
        results = measure(args, data_dir)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    results["targets"] = targets(results)
    print(dump_json(results) if args.json else report(results, args.repeat))
    return 0


if __name__ == "__main__":
    harness.run(main)
