#!/usr/bin/env python3
"""Benchmark NFP jobs: sequential round trips, brokerless and brokered; broker failover.

Every process is started by this run and stays on loopback (127.0.0.1,
beacons to 127.255.255.255 on a free, non-default UDP port). One client (this
process, a gevent ``Node`` with an ``NfpNode``) and one worker (a child
process), plus a broker child for the brokered case:

1. sequential job round trips, POST -> result (``Client.run``: POST, 202,
   then the result; results persisted by the worker and the client in their
   SQLite stores), brokerless and brokered: jobs/s, p50, p99;
2. broker failover: two broker candidates (priority 10 and 5) and a worker;
   the elected broker is killed with SIGKILL and the time until a job has
   gone through the new broker is measured. With ZRE ``expired`` set to E
   the bound is 2 x E (issue 5); the default E is 30 s, this run uses
   ``--expired`` (default 1 s).

3. a reference "floor": the brokered message pattern (client -> broker ->
   worker, one answer back through the broker: a quick job's 202 carries its
   result) with plain ``Channel`` relays and no NFP processing, measured in
   the same run;

and the CPU each process spends per job. Targets (issue 5): brokered p50 <=
1 ms and >= 1,500 jobs/s; brokerless faster; failover within 2 x expired.
``--json`` prints one JSON object; ``--only brokered,floor`` runs some sections.

``--compare DIR`` measures two versions of the library in one run: DIR holds
another ``peermesh`` package (e.g. ``git archive HEAD peermesh | tar -x -C
/tmp/before``); each round runs every mode once with that library and once
with this checkout, interleaved (so both see the same machine load), and the
medians of ``--rounds`` rounds are printed side by side::

    python scripts/bench_nfp.py --compare /tmp/before --rounds 3 --jobs 3000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

TARGETS = {"brokered_p50_ms": 1.0, "brokered_jobs_per_s": 1500.0}

CHILD = r"""
import json, sys, os, time
import gevent, gevent.os
from peermesh import Node
from peermesh.nfp import NfpNode, Tasks

cfg = json.loads(sys.argv[1])
tasks = Tasks()

@tasks.task()
def echo(job, *args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}

node = Node(cfg["name"], interface="lo", port=cfg["port"], interval=cfg["interval"],
            evasive=cfg["evasive"], silent=cfg["silent"], expired=cfg["expired"])
nfp = NfpNode(node, data_dir=cfg["data_dir"], broker=cfg["broker"], priority=cfg["priority"],
              keepalive=cfg["keepalive"], request_timeout=2.0, queue_timeout=5.0)
for service, name in cfg["workers"]:
    nfp.add_worker(service, name, tasks)
node.start(); nfp.start()
profile = None
if cfg.get("profile"):
    import cProfile
    profile = cProfile.Profile(time.thread_time)
    profile.enable()
print("READY", node.uuid.hex, flush=True)

def drain():
    for _ in node.events():
        pass

def stdin_closed():
    gevent.os.make_nonblocking(0)
    while gevent.os.nb_read(0, 4096):
        pass

gevent.wait([gevent.spawn(drain), gevent.spawn(stdin_closed)], count=1, timeout=600)
if profile is not None:
    profile.disable()
    profile.dump_stats(cfg["profile"])
nfp.stop(); node.stop()
"""


FLOOR = r"""
import sys, zmq, gevent
from peermesh.nfp.transport import Channel
role, endpoint = sys.argv[1], sys.argv[2]
ctx = zmq.Context.instance()
if role == "broker":
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    peers = {}
    def relay(frames):
        if frames[-1] == b"W":
            peers["w"] = frames[0]
        elif frames[0] == peers.get("w"):
            channel.send([peers["c"], *frames[1:]])
        else:
            peers["c"] = frames[0]
            channel.send([peers["w"], *frames[1:]])
else:
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    def relay(frames):
        channel.send(frames)   # the 202, carrying the result
channel = Channel(sock, relay)
if role == "worker":
    channel.send([b"", b"", b"W"])
print("READY", flush=True)
gevent.sleep(600)
"""


def _free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def transport_floor(count: int) -> dict[str, Any]:
    """The brokered message pattern (C->B->W->B->C) with no processing at all."""
    import gevent
    import gevent.event
    import zmq
    from peermesh.nfp.transport import Channel

    endpoint = f"tcp://127.0.0.1:{_free_tcp_port()}"
    procs = []
    try:
        for role in ("broker", "worker"):
            proc = subprocess.Popen([sys.executable, "-c", FLOOR, role, endpoint],
                                    stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(endpoint)
        got = gevent.event.Event()

        def on_answer(frames: list[bytes]) -> None:
            got.set()
        channel = Channel(sock, on_answer)
        frames = [b"", b"NFPC01", b"\x04", b"bench", b"any", b"0" * 32,
                  b'{"task":"echo","args":[1],"kwargs":{},"rid":"1"}']
        gevent.sleep(0.3)   # let both connections finish their handshakes
        latencies = []
        pids = {"client": os.getpid(), "broker": procs[0].pid, "worker": procs[1].pid}
        cpu0 = {name: _thread_cpu(pid) for name, pid in pids.items()}
        for _ in range(count):
            got.clear()
            t0 = time.perf_counter()
            channel.send(frames)
            if not got.wait(2):
                raise RuntimeError("floor: no answer")
            latencies.append(time.perf_counter() - t0)
        cpu = _cpu_per_job(pids, cpu0, count)
        channel.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return {"jobs_per_s": round(count / sum(latencies), 1),
            "p50_ms": round(_percentile(latencies, 0.50) * 1e3, 3),
            "p99_ms": round(_percentile(latencies, 0.99) * 1e3, 3), "cpu_us_per_job": cpu}


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Children:
    """Child processes, all ended (stdin closed, then SIGKILL) on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, **cfg: Any) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(cfg)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"child {cfg['name']} did not start: {line!r}")
        return proc

    def close(self) -> None:
        for proc in self.procs:
            try:
                if proc.stdin:
                    proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 3
        for proc in self.procs:
            try:
                proc.wait(max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` by kind: ``main``, ``zmq`` (libzmq's
    I/O threads) and ``other`` (SQLite checkpoints, thread pools)."""
    out = {"main": 0.0, "zmq": 0.0, "other": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        task = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{task}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        name = head.split("(", 1)[1]
        kind = "main" if tid == str(pid) else "zmq" if name.startswith("ZMQbg") else "other"
        try:   # nanoseconds on the CPU (stat's user + system time counts whole ticks)
            with open(f"{task}/schedstat") as f:
                out[kind] += int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            fields = rest.split()
            out[kind] += (int(fields[11]) + int(fields[12])) / tick
    return out


def _cpu_per_job(pids: dict[str, int], before: dict[str, dict[str, float]],
                 count: int) -> dict[str, dict[str, float]]:
    """Microseconds of CPU per job of each process (and thread kind) since ``before``."""
    out = {}
    for name, pid in pids.items():
        after = _thread_cpu(pid)
        out[name] = {k: round((after[k] - before[name][k]) / count * 1e6, 1) for k in after}
        out[name]["total"] = round(sum(out[name].values()), 1)
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def round_trips(mode: str, count: int, args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    """Sequential Client.run round trips against one worker (and a broker if brokered)."""
    import gevent
    from peermesh import Node
    from peermesh.nfp import NfpNode

    port = _free_udp_port()
    timing = dict(port=port, interval=0.1, evasive=1.0, silent=1.5, expired=2.0, keepalive=0.5,
                  data_dir=data_dir)
    profiles = args.profile

    def profile(name: str) -> Optional[str]:
        return os.path.join(profiles, f"{mode}-{name}.prof") if profiles else None
    names = ["broker", "worker"] if mode == "brokered" else ["worker"]
    with Children() as children:
        if mode == "brokered":
            children.start(name="bench-broker", broker="always", priority=0, workers=[],
                           profile=profile("broker"), **timing)
        children.start(name="bench-worker", broker="never", priority=0,
                       workers=[["bench", "w1"]], profile=profile("worker"), **timing)
        node = Node("bench-client", interface="lo", port=port, interval=0.1, evasive=1.0,
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
            pids.update(zip(names, (p.pid for p in children.procs)))
            cpu0 = {name: _thread_cpu(pid) for name, pid in pids.items()}
            start = time.perf_counter()
            for i in range(count):
                t0 = time.perf_counter()
                reply = nfp.client.run("bench", "echo", [i], target="any", timeout=5)
                latencies.append(time.perf_counter() - t0)
                if reply.status != 200:
                    raise RuntimeError(f"{mode}: job {i} ended {reply.status}: {reply.body}")
            elapsed = time.perf_counter() - start
            cpu = _cpu_per_job(pids, cpu0, count)
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(os.path.join(profiles, f"{mode}-client.prof"))
        finally:
            nfp.stop()
            node.stop()
    return {"mode": mode, "jobs": count, "jobs_per_s": round(count / elapsed, 1),
            "p50_ms": round(_percentile(latencies, 0.50) * 1e3, 3),
            "p99_ms": round(_percentile(latencies, 0.99) * 1e3, 3),
            "mean_ms": round(statistics.fmean(latencies) * 1e3, 3),
            "cpu_us_per_job": cpu}


def failover(args: argparse.Namespace, data_dir: str) -> dict[str, Any]:
    """Kill the elected broker; time until a job has gone through the next one."""
    import gevent
    from peermesh import Node
    from peermesh.nfp import NfpNode

    port = _free_udp_port()
    expired = args.expired
    timing = dict(port=port, interval=min(0.1, expired / 5), evasive=expired / 2,
                  silent=expired * 0.75, expired=expired, keepalive=0.2, data_dir=data_dir)
    with Children() as children:
        first = children.start(name="bench-b1", broker="auto", priority=10, workers=[], **timing)
        children.start(name="bench-b2", broker="auto", priority=5, workers=[], **timing)
        children.start(name="bench-fw", broker="never", priority=0, workers=[["fo", "fw1"]],
                       **timing)
        node = Node("bench-fo-client", interface="lo", port=port,
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
            first.wait()
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


def _median_run(done: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (the lower one of the middle two), with every run's
    rate and p50 under "runs" when there were several."""
    ranked = sorted(done, key=lambda r: r["jobs_per_s"])
    median = dict(ranked[(len(ranked) - 1) // 2])
    if len(done) > 1:
        median["runs"] = [[r["jobs_per_s"], r["p50_ms"]] for r in done]
    return median


def _print_runs(result: dict[str, Any]) -> None:
    if "runs" in result:
        rates = sorted(rate for rate, _ in result["runs"])
        print(f"{'':<12} the median of {len(rates)} runs; jobs/s "
              f"{', '.join(f'{rate:.0f}' for rate in rates)}")


def _library() -> str:
    """Where the peermesh package this run imports lives."""
    import peermesh
    return os.path.dirname(os.path.dirname(os.path.abspath(peermesh.__file__)))


def compare(args: argparse.Namespace) -> int:
    """Interleaved runs of this library and the one under ``--compare DIR``; medians."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    libraries = {"before": os.path.abspath(args.compare), "after": here}
    modes = [m for m in ("brokerless", "brokered", "floor") if m in args.only.split(",")]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    workdir = tempfile.mkdtemp(prefix="bench-nfp-compare-")
    try:
        for round_ in range(args.rounds):
            for mode in modes:
                for label, library in libraries.items():
                    _say(f"round {round_ + 1}/{args.rounds}: {mode}, {label} ({library}) ...")
                    env = {**os.environ, "PYTHONPATH": library}
                    done = subprocess.run(
                        [sys.executable, os.path.abspath(__file__), "--only", mode, "--json",
                         "--jobs", str(args.jobs)], env=env, cwd=workdir,
                        capture_output=True, text=True, timeout=600)
                    if done.returncode != 0:
                        raise RuntimeError(f"{mode} ({label}) failed:\n{done.stderr[-2000:]}")
                    result = json.loads(done.stdout)
                    if result.get("library") != library:
                        raise RuntimeError(f"{label} imported {result.get('library')}, "
                                           f"not {library}")
                    runs.setdefault((mode, label), []).append(result[mode])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary: dict[str, Any] = {}
    for (mode, label), results in runs.items():
        def median(key: str) -> float:
            return round(statistics.median(r[key] for r in results), 3)
        cpu = {name: round(statistics.median(r["cpu_us_per_job"][name]["total"]
                                             for r in results), 1)
               for name in results[0].get("cpu_us_per_job", {})}
        summary.setdefault(mode, {})[label] = {
            "jobs_per_s": median("jobs_per_s"), "p50_ms": median("p50_ms"),
            "p99_ms": median("p99_ms"), "cpu_us_per_job": cpu,
            "runs": [(r["jobs_per_s"], r["p50_ms"]) for r in results]}
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"medians of {args.rounds} interleaved rounds of {args.jobs} jobs "
          f"(before: {libraries['before']}, after: {libraries['after']})")
    print(f"{'mode':<12} {'':<7} {'jobs/s':>9} {'p50 ms':>8} {'p99 ms':>8}   runs (jobs/s, p50)")
    for mode in modes:
        for label in libraries:
            r = summary[mode][label]
            print(f"{mode:<12} {label:<7} {r['jobs_per_s']:>9.0f} {r['p50_ms']:>8.3f} "
                  f"{r['p99_ms']:>8.3f}   {r['runs']}")
            print(f"{'':<21} CPU us/job (median): "
                  + ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_job"].items()))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="round trips per mode")
    parser.add_argument("--expired", type=float, default=1.0,
                        help="ZRE expired timeout for the failover run (seconds)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--only", default="brokerless,brokered,floor,failover",
                        help="comma-separated sections to run (default: all)")
    parser.add_argument("--compare", metavar="DIR",
                        help="also run the library in DIR (a directory holding a peermesh "
                             "package, e.g. from `git archive`), interleaved with this one, "
                             "and print medians of both (brokerless, brokered, floor)")
    parser.add_argument("--profile", metavar="DIR",
                        help="run client, broker and worker under cProfile and write "
                             "DIR/<mode>-<process>.prof (timings are then not comparable)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --compare: interleaved rounds (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="measure brokerless, brokered and the floor N times each, "
                             "alternating, and report the median run with the range (this "
                             "VM's rates swing with its host's load; default: %(default)s)")
    args = parser.parse_args()
    if args.repeat < 1 or args.rounds < 1 or args.jobs < 1:
        parser.error("--jobs, --rounds and --repeat must be at least 1")
    if args.compare:
        return compare(args)
    only = set(args.only.split(","))
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="bench-nfp-")
    try:
        results: dict[str, Any] = {"library": _library()}
        runs: dict[str, list[dict[str, Any]]] = {}
        for n in range(args.repeat):
            of = f" (run {n + 1} of {args.repeat})" if args.repeat > 1 else ""
            for mode in ("brokerless", "brokered"):
                if mode in only:
                    _say(f"{mode}: {args.jobs} sequential jobs{of} ...")
                    runs.setdefault(mode, []).append(round_trips(
                        mode, args.jobs, args, os.path.join(data_dir, f"{mode}-{n}")))
            if "floor" in only:
                _say(f"transport floor (brokered message pattern, no processing){of} ...")
                runs.setdefault("floor", []).append(transport_floor(args.jobs))
        results.update({mode: _median_run(done) for mode, done in runs.items()})
        if "failover" in only:
            _say("failover ...")
            results["failover"] = failover(args, os.path.join(data_dir, "failover"))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    targets: dict[str, Any] = {}
    b = results.get("brokered")
    if b is not None:
        targets["brokered_p50_ms"] = {"target": TARGETS["brokered_p50_ms"], "got": b["p50_ms"],
                                      "met": b["p50_ms"] <= TARGETS["brokered_p50_ms"]}
        targets["brokered_jobs_per_s"] = {
            "target": TARGETS["brokered_jobs_per_s"], "got": b["jobs_per_s"],
            "met": b["jobs_per_s"] >= TARGETS["brokered_jobs_per_s"]}
        if "brokerless" in results:
            targets["brokerless_faster"] = results["brokerless"]["p50_ms"] <= b["p50_ms"]
    if "failover" in results:
        targets["failover_within_2x_expired"] = results["failover"]["serving_after_s"] \
            <= results["failover"]["bound_s"]
    results["targets"] = targets
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{'mode':<12} {'jobs/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for mode in ("brokerless", "brokered"):
        if mode in results:
            r = results[mode]
            print(f"{mode:<12} {r['jobs_per_s']:>9.0f} {r['p50_ms']:>8.3f} "
                  f"{r['p99_ms']:>8.3f}")
            _print_runs(r)
            for name, c in r["cpu_us_per_job"].items():
                print(f"{'':<12} CPU us/job {name:<7} {c['total']:>7.1f} (main thread "
                      f"{c['main']:.1f}, libzmq I/O {c['zmq']:.1f}, other {c['other']:.1f})")
    if "floor" in results:
        fl = results["floor"]
        print(f"{'floor':<12} {fl['jobs_per_s']:>9.0f} {fl['p50_ms']:>8.3f} "
              f"{fl['p99_ms']:>8.3f}   (brokered message pattern through peermesh's socket "
              "layer, no processing)")
        _print_runs(fl)
        for name, c in fl["cpu_us_per_job"].items():
            print(f"{'':<12} CPU us/job {name:<7} {c['total']:>7.1f} (main thread "
                  f"{c['main']:.1f}, libzmq I/O {c['zmq']:.1f}, other {c['other']:.1f})")
    if "failover" in results:
        f = results["failover"]
        print(f"failover: new broker elected after {f['elected_after_s']:.3f}s, serving after "
              f"{f['serving_after_s']:.3f}s (expired {f['expired_s']:g}s, "
              f"bound {f['bound_s']:g}s)")
    for name, t in targets.items():
        print(f"target {name}: {t}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
