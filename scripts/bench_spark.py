#!/usr/bin/env python3
"""Benchmark the PySpark integration: mesh ingest, reads of the log against parquet, requests.

Everything stays on loopback (interface ``lo``, a free beacon port, the log
service on 127.0.0.1). Spark runs ``local[2]`` (see
``peermesh.spark.session``); mesh peers are child processes started by the
shared harness (``role_shouter`` and ``role_server`` below).

1. **read** (first, while no other session runs): a child process
   (``role_reader``) starts a Spark session of its own, appends ``--rows``
   telemetry messages straight into its log and writes the same rows as
   parquet. Each of ``--rounds`` rounds then times, in turn, a batch read
   of the log and of the parquet files, and an ``availableNow`` stream of
   each (``noop`` sink, 2 partitions): wall seconds and the CPU seconds of
   the session's whole process tree (JVM, Python workers, planners).
   Reported: medians, and the medians of the per-round ratios to parquet
   (its time over ours: the share of parquet's speed). The ceiling of any
   Python data source is measured beside them: the same rows as Arrow
   batches of 20,000 from a memory-mapped file through a minimal source
   (``spark_memory_source``, no peermesh). ``--baseline REV``
   runs a second such child with the code of commit REV, in the same
   rounds, and adds its figures and this checkout's speed over it;
   ``--conf KEY=VALUE`` sets a Spark setting in this checkout's session
   only (with ``--baseline .``: the setting's effect on the same code).
2. **ingest**: ``--peers`` processes shout ``--messages`` small msgpack
   telemetry messages (``{"host", "seq", "temp", "load"}``) each, as fast as
   the mesh's flow control lets them (``Node.shout_each``, 256 at a time: one
   SHOUT per message), to a group the driver's service is in.
   A streaming query (``readStream.format("peermesh")`` -> ``noop`` sink,
   every column materialised, ``partitions`` 2) runs throughout. Reported:
   the end-to-end rate (messages / seconds from the first shout until the
   query has processed the last one), the rate at which the service logged
   them, the query's own processing rate (rows / batch durations) and the CPU
   of the whole pipeline per message (peers, service, Spark); the median of
   ``--ingest-rounds`` runs. With ``--baseline REV`` each code tree runs in
   a child process of its own (``role_ingester``: its own Spark session and
   service), the rounds alternating between them (ABBA); reported beside this
   checkout's figures: the baseline's, and the median of the per-round ratios
   of end-to-end rates (this checkout's over the baseline's).
3. **requests**: ``--servers`` processes run a Safir-Darbaan server on the
   mesh with an ``echo`` action; ``ServiceCaller.apply`` sends one request
   per row of ``spark.range(--requests)`` (2 partitions) from the executors
   with ``--window`` requests in flight per task. Reported: requests per
   second (after a warm-up run that starts the executors' mesh nodes).
   Skipped when ``peermesh.sada`` is not importable.

Targets: ingest >= 50,000 messages/s end to end; a batch read >= 0.7 and an
``availableNow`` stream >= 0.5 of parquet's speed; executor requests >=
5,000/s pipelined. ``--json`` prints the results as one JSON object.
"""

from __future__ import annotations

import argparse
import shutil
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402  (puts this checkout on sys.path, unless a child runs another)
from harness import free_udp_port, progress  # noqa: E402
from processes import end_descendants  # noqa: E402

TARGETS = {"ingest_per_s": 50_000, "requests_per_s": 5_000}
#: Spark gives the Python process that plans a stream 10 s to connect back, and that
#: process first imports pyspark from pyspark.zip (no bytecode): on a machine loaded far
#: beyond its cores it may not make it, and the query fails before any source code runs.
#: A read round or an ingest run then starts the query again, at most this many times
#: (and reports it).
STREAM_RESTARTS = 5
NO_CONNECT_BACK = "failed to connect back"
INTERVAL = 0.1
#: messages a shouting peer packs and hands to ``Node.shout_each`` at a time (one SHOUT each)
SHOUT_BATCH = 256


# ---------------------------------------------------------------------------
# child roles


def role_shouter(parent: harness.Parent, port: int, group: str, count: int, label: str) -> None:
    """Meet the driver's node, wait for "go", shout ``count`` messages, report."""
    import gevent
    import msgpack

    from peermesh import Node

    node = Node(f"shouter-{label}", interface="lo", port=port, interval=INTERVAL,
                send_timeout=60.0)
    node.start()
    deadline = time.monotonic() + 30
    while not node.peers_by_group(group):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no member of {group!r} within 30 s")
        gevent.sleep(0.02)
    parent.send("ready")
    parent.expect("go", 600, green=True)
    pack = msgpack.Packer(use_bin_type=True).pack
    start = time.perf_counter()
    for first in range(0, count, SHOUT_BATCH):  # as a producer with a batch at hand sends
        node.shout_each(group, [pack({"host": label, "seq": seq, "temp": 20.0 + seq % 10,
                                      "load": (seq % 100) / 100})
                                for seq in range(first, min(first + SHOUT_BATCH, count))])
        gevent.sleep(0)
    node.flush(60)
    elapsed = time.perf_counter() - start
    parent.send("sent", {"sent": count, "seconds": elapsed})
    node.stop()


def role_server(parent: harness.Parent, port: int, label: str) -> None:
    """A Safir-Darbaan server on the mesh offering ``bench`` 1.0 with ``echo``."""

    from peermesh import Node
    from peermesh.sada import Server, Service

    service = Service("bench", "1.0")

    @service.action("echo", inline=True)
    def echo(payload: Any) -> Any:
        return {"value": payload, "server": label}

    node = Node(f"server-{label}", interface="lo", port=port, interval=INTERVAL)
    server = Server(node, services=[service])
    node.start()
    server.start()
    parent.send("ready")
    try:
        parent.serve(lambda command: None, green=True)  # until the benchmark ends
    finally:
        server.stop(0.1)
        node.stop(0.1)


# ---------------------------------------------------------------------------
# the measurements


def warm_up(service: Any, port: int, group: str, count: int = 4000) -> None:
    """Shout ``count`` messages from a node in this process and wait until they are logged."""
    from peermesh import ThreadedNode

    target = service.bounds()[1] + count
    with ThreadedNode("warm-up", interface="lo", port=port, interval=INTERVAL) as node:
        deadline = time.monotonic() + 30
        while not node.peers_by_group(group) and time.monotonic() < deadline:
            time.sleep(0.02)
        payload = b"\x81\xa4warm\xc3"  # msgpack {"warm": true}
        for _ in range(count // 500):
            node.call(lambda n: [n.shout(group, payload) for _ in range(500)])
        node.call(lambda n: n.flush(10))
    if not service.wait_for_offset(target, 30):
        raise RuntimeError("the warm-up messages were not logged")


def bench_ingest(spark: Any, service: Any, port: int, args: argparse.Namespace,
                 tmp: str) -> dict[str, Any]:
    group = service.groups[0]
    total = args.peers * args.messages
    query = (spark.readStream.format("peermesh").option("group", group)
             .option("startingOffsets", "earliest").option("partitions", "2").load()
             .writeStream.format("noop").queryName("bench_ingest")
             .option("checkpointLocation", os.path.join(tmp, "ck-ingest")).start())
    try:
        with harness.Children() as children:
            procs = [children.start("bench_spark", "shouter", port=port, group=group,
                                    count=args.messages, label=f"p{i}")
                     for i in range(args.peers)]
            for proc in procs:
                proc.expect("ready", 60)
            progress("warming the query up (its Python workers start with the first data)")
            warm_up(service, port, group)
            query.processAllAvailable()
            base = service.bounds()[1]
            warm_batches = {p["batchId"] for p in query.recentProgress}
            progress(f"{args.peers} peers shout {args.messages} messages each")
            # the CPU of the whole pipeline: peers, the driver's service, Spark's JVM and
            # Python workers (all descendants of this process)
            with TreeCpu(os.getpid()) as cpu:
                start = time.perf_counter()
                for proc in procs:
                    proc.send("go")
                # (one reader polls, beside the service: not a new connection per poll)
                if not service.wait_for_offset(base + total, args.timeout):
                    raise RuntimeError(f"only {service.bounds()[1] - base} of {total} "
                                       f"messages were logged within {args.timeout} s")
                logged_at = time.perf_counter()
                query.processAllAvailable()
                done = time.perf_counter()
            sent = [proc.expect("sent", args.timeout) for proc in procs]
        timed = [p for p in query.recentProgress
                 if p["numInputRows"] and p["batchId"] not in warm_batches]
        rows = sum(p["numInputRows"] for p in timed)
        busy = sum(p["durationMs"].get("triggerExecution", 0) for p in timed) / 1000
        shout_rate = sum(s["sent"] for s in sent) / max(s["seconds"] for s in sent)
        return {"messages": total, "peers": args.peers,
                "seconds": done - start,
                "per_s": total / (done - start),
                # CPU per message, and the rate it allows with every core of the machine
                "cpu_us": cpu.seconds / total * 1e6,
                "cpu_us_by_part": {k: v / total * 1e6 for k, v in sorted(cpu.parts.items())},
                "cpu_bound_per_s": total * (os.cpu_count() or 1) / cpu.seconds,
                "logged_per_s": total / (logged_at - start),
                "shout_per_s": shout_rate,
                "query_rows": rows, "query_busy_s": busy,
                "query_per_s": rows / busy if busy else None,
                "batches": len(timed),
                "batch_detail": [{"rows": p["numInputRows"], **p["durationMs"]} for p in timed]}
    finally:
        query.stop()


def fill_log(service: Any, group: str, count: int) -> None:
    """Append ``count`` telemetry messages to ``group`` straight into the service's log."""
    import msgpack

    from peermesh.spark.log import MessageLog

    sender = "ab" * 16
    with MessageLog(service.path) as log:
        for begin in range(0, count, 20_000):
            log.append([(group, sender, "bench", time.time(),
                         msgpack.packb({"host": "h1", "seq": i, "temp": 20.5 + i % 7,
                                        "load": i % 100}))
                        for i in range(begin, min(begin + 20_000, count))])


class TreeCpu:
    """``with TreeCpu(pid) as cpu: ...``; then ``cpu.seconds``: CPU seconds that process
    ``pid`` and its descendants (Spark's JVM, Python workers and planners) used inside the
    block. Sampled every ``every`` seconds, so that a process that ends counts up to its
    last sample: Spark's Python daemon lets the kernel reap its workers, so their CPU
    never reaches a parent's accounting. The sampling's own CPU (a walk over the threads
    of the JVM, in ``root``'s tree when ``root`` is this process) is left out: it grows
    with wall time, not with the work measured. ``cpu.parts``: the same seconds by part
    (``part_of``)."""

    def __init__(self, root: int, every: float = 0.05) -> None:
        self.root = root
        self.every = every
        self.seconds = 0.0
        self.parts: dict[str, float] = {}
        self._last: dict[int, int] = {}
        self._kinds: dict[int, str] = {}
        self._done = threading.Event()

    def _sample(self) -> dict[int, int]:
        ticks, todo = {}, [self.root]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime
                if pid not in self._kinds:
                    self._kinds[pid] = self.part_of(pid)
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children") as f:
                        todo.extend(int(child) for child in f.read().split())
                except OSError:
                    pass
        return ticks

    def _run(self) -> None:
        start = time.thread_time()
        while not self._done.wait(self.every):
            self._last.update(self._sample())
        self._sampling = time.thread_time() - start

    def __enter__(self) -> "TreeCpu":
        self._base = self._sample()
        self._sampling = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        start = time.thread_time()
        self._last.update(self._sample())
        tick = os.sysconf("SC_CLK_TCK")
        sampling = self._sampling + time.thread_time() - start
        mine = self.root == os.getpid()
        for pid, t in self._last.items():
            part = self._kinds.get(pid, "other")
            self.parts[part] = self.parts.get(part, 0.0) + (t - self._base.get(pid, 0)) / tick
        if mine:
            self.parts["driver"] = max(0.0, self.parts.get("driver", 0.0) - sampling)
        self.seconds = sum(self.parts.values())

    def part_of(self, pid: int) -> str:
        """What process ``pid`` is: "driver" (the root: the service, its node, py4j),
        "jvm", "peers" (this benchmark's mesh children) or "python" (Spark's Python
        workers and planners)."""
        if pid == self.root:
            return "driver"
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return "other"
        name = os.path.basename(argv[0])
        if name == b"java":
            return "jvm"
        if b"harness.py" in b" ".join(argv[1:3]):
            return "peers"
        return "python"


def role_reader(parent: harness.Parent, rows: int, timeout: float, directory: str,
                conf: Optional[dict[str, str]] = None) -> None:
    """A Spark session (with the settings ``conf``) and a log of ``rows`` messages (and the
    same rows as parquet) under ``directory`` (the parent's: it removes it, also when this
    process is killed); each command from the parent is one round (``read_cases``)."""
    import peermesh.spark as ps
    from peermesh.spark.session import local_session

    use_for_temporary_files(directory)
    spark = local_session(directory, app="bench_spark_read", **(conf or {}))
    service = ps.start_service(spark, groups=["bench-read"],
                               directory=os.path.join(directory, "log"), interface="lo",
                               port=free_udp_port(), interval=INTERVAL, bind="127.0.0.1",
                               retention=None)
    try:
        read_cases(spark, service, rows, timeout, directory, parent)
    finally:
        service.stop()
        spark.stop()


def memory_source(spark: Any, parquet_dir: str, schema: Any, tmp: str) -> dict[str, str]:
    """Register the ceiling's format (``spark_memory_source``) and write the rows of
    ``parquet_dir`` for it as an Arrow file, in batches of 20,000 rows (the log's chunks in
    ``fill_log``), typed as a Python data source must hand ``schema`` to Spark; its
    options."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema
    from spark_memory_source import ArrowFileSource, write_batches

    spark.dataSource.register(ArrowFileSource)
    arrow = to_arrow_schema(schema, timezone="UTC")
    table = pq.read_table(parquet_dir).select(arrow.names).cast(arrow).combine_chunks()
    path = os.path.join(tmp, "memory.arrow")
    write_batches(path, table.to_batches(max_chunksize=20_000))
    return {"path": path, "partitions": "2"}


def restarting(run: Callable[[], Any]) -> tuple[Any, int]:
    """``run()``'s result, and how many times it was started again because Spark's planner
    process of a stream did not connect back in time (``STREAM_RESTARTS``)."""
    for attempt in range(STREAM_RESTARTS + 1):
        try:
            return run(), attempt
        except Exception as exc:
            if attempt == STREAM_RESTARTS or NO_CONNECT_BACK not in str(exc):
                raise
    raise AssertionError("unreachable")


def read_cases(spark: Any, service: Any, count: int, timeout: float, tmp: str,
               parent: harness.Parent) -> None:
    """Fill the log and the parquet files, warm every case up, then answer each command
    with one round: wall and CPU seconds of a batch read and an availableNow stream of
    the log and of the parquet files, in turn."""
    group = "bench-read"
    fill_log(service, group, count)
    source = spark.read.format("peermesh").option("group", group).option("partitions", "2")
    parquet_dir = os.path.join(tmp, "parquet")
    source.load().repartition(2).write.parquet(parquet_dir)
    schema = spark.read.parquet(parquet_dir).schema
    runs = iter(range(1_000_000))

    def batch(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    def stream(reader: Any) -> None:
        query = (reader.writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", os.path.join(tmp, f"ck-read-{next(runs)}"))
                 .start())
        query.awaitTermination(timeout)
        if query.isActive:
            query.stop()
            raise RuntimeError(f"an availableNow stream did not end within {timeout} s")

    stream_source = (spark.readStream.format("peermesh").option("group", group)
                     .option("startingOffsets", "earliest").option("partitions", "2"))
    typed = source.load().schema
    memory = memory_source(spark, parquet_dir, typed, tmp)
    cases = {"batch": lambda: batch(source.load()),
             "parquet_batch": lambda: batch(spark.read.parquet(parquet_dir)),
             "memory_batch": lambda: batch(spark.read.format("arrowfile").schema(typed)
                                           .options(**memory).load()),
             "stream": lambda: stream(stream_source.load()),
             "parquet_stream": lambda: stream(spark.readStream.schema(schema)
                                              .parquet(parquet_dir)),
             "memory_stream": lambda: stream(spark.readStream.format("arrowfile")
                                             .schema(typed).options(**memory).load())}
    for case in cases.values():  # warm both paths up (Python workers, JIT)
        restarting(case)
    me = os.getpid()

    def timed(case: Any) -> tuple[float, float]:
        with TreeCpu(me) as cpu:
            start = time.perf_counter()
            case()
            wall = time.perf_counter() - start
        return wall, cpu.seconds

    def one_round(command: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"restarts": 0}
        for name, case in cases.items():
            (out[name], out[f"{name}_cpu"]), restarts = restarting(lambda: timed(case))
            out["restarts"] += restarts
        return out

    parent.send("filled")
    parent.serve(one_round)


def bench_read(args: argparse.Namespace) -> dict[str, Any]:
    """A batch read and an availableNow stream of the log, against the same rows in parquet,
    in a Spark session of their own per code tree (this checkout, ``--baseline``)."""
    code = harness.trees(args.baseline)
    results: dict[str, Any] = {"rows": args.rows, "rounds": args.rounds}
    # the readers' logs, parquet and Spark directories (GBs at 10M rows): made and removed
    # here, since a reader may be killed before it could remove them itself
    scratch = tempfile.mkdtemp(prefix="bench-spark-read-")
    try:
        with harness.Children() as children:
            readers = {}
            for label, tree in code.items():
                progress(f"{label}: Spark, {args.rows:,} messages into the log and parquet")
                readers[label] = children.start(
                    "bench_spark", "reader", tree, rows=args.rows, timeout=args.timeout,
                    directory=os.path.join(scratch, label),
                    conf=args.conf if label == "peermesh" else {})
                # filling, writing parquet and warming every case up: long at 10M rows
                readers[label].expect("filled", max(900.0, args.rows / 2000))
            rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in code}
            for r in range(args.rounds):
                for label, child in readers.items():
                    progress(f"{label}: round {r + 1}/{args.rounds} (batch: peermesh, "
                             "parquet, memory; the same as streams)")
                    rounds[label].append(child.ask(args.timeout * 4, go=r))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for label, runs in rounds.items():
        summary: dict[str, Any] = {"rounds": runs,
                                   "restarts": sum(run.get("restarts", 0) for run in runs)}
        for kind in ("batch", "stream"):
            for unit in ("", "_cpu"):
                mine, theirs, ceiling = ([run[f"{prefix}{kind}{unit}"] for run in runs]
                                         for prefix in ("", "parquet_", "memory_"))
                for prefix, times in (("", mine), ("parquet_", theirs), ("memory_", ceiling)):
                    summary[f"{prefix}{kind}{unit}"] = statistics.median(times)
                for prefix, times in (("", mine), ("memory_", ceiling)):
                    summary[f"{prefix}{kind}{unit}_vs_parquet"] = statistics.median(
                        t / m for t, m in zip(theirs, times))
        results[label] = summary
    if "baseline" in results:
        now, base = rounds["peermesh"], rounds["baseline"]
        results["now_vs_base"] = {kind: statistics.median(b[kind] / n[kind]
                                                          for n, b in zip(now, base))
                                  for kind in ("batch", "stream")}
        results["baseline"]["library"] = code["baseline"]
    return results


def bench_requests(spark: Any, port: int, args: argparse.Namespace) -> dict[str, Any]:
    from peermesh.spark import ServiceCaller

    caller = ServiceCaller("bench", "echo", max_in_flight=args.window, timeout=30.0,
                           discovery_timeout=20.0)
    with harness.Children() as children:
        procs = [children.start("bench_spark", "server", port=port, label=f"s{i}")
                 for i in range(args.servers)]
        for proc in procs:
            proc.expect("ready", 60)
        progress("warming the executors' channels up")
        df = spark.range(0, 2000, numPartitions=2)
        caller.apply(df, payload="id", reply_schema="value long").write.format("noop") \
            .mode("overwrite").save()
        progress(f"{args.requests} requests from 2 tasks, window {args.window}")
        df = spark.range(0, args.requests, numPartitions=2)
        out = caller.apply(df, payload="id", reply_schema="value long, server string")
        start = time.perf_counter()
        out.write.format("noop").mode("overwrite").save()
        seconds = time.perf_counter() - start
        check = out.limit(5).collect()
        assert all(r.value == r.id for r in check), check
    return {"requests": args.requests, "servers": args.servers, "window": args.window,
            "seconds": seconds, "per_s": args.requests / seconds}


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"targets": TARGETS}
    try:
        if "read" in args.only:  # first, while no other Spark session runs beside it
            results["read"] = bench_read(args)
        if "ingest" in args.only and args.baseline:
            results["ingest"] = ingest_trees(args)
        if "requests" in args.only or "ingest" in args.only and not args.baseline:
            with_session(results, args)
    finally:
        results["load_average"] = os.getloadavg()
    return results


def with_session(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The phases that share one Spark session in this process (the last phases: its JVM
    is ended, so that nothing writes to the directory while it is removed)."""
    from peermesh.spark.executor import sada_available

    with tempfile.TemporaryDirectory(prefix="bench-spark-") as tmp:
        try:
            spark, service, port = ingest_session(tmp)
            try:
                if "ingest" in args.only and "ingest" not in results:
                    results["ingest"] = median_ingest(spark, service, port, args, tmp)
                if "requests" in args.only:
                    if sada_available():
                        results["requests"] = bench_requests(spark, port, args)
                    else:
                        results["requests"] = {"skipped": "peermesh.sada is not importable"}
            finally:
                service.stop()
                spark.stop()
        finally:
            end_descendants()


def use_for_temporary_files(directory: str) -> None:
    """A role's temporary files (pyspark's, when it starts its JVM) go under ``directory``,
    which the parent removes: also what a role ended midway leaves there."""
    os.makedirs(directory, exist_ok=True)
    tempfile.tempdir = directory


def role_ingester(parent: harness.Parent, directory: str, settings: dict[str, Any]) -> None:
    """A Spark session and a driver service of this process's code under ``directory``
    (the parent's: it removes it); each command from the parent is one ingest run
    (``bench_ingest`` with the parent's ``settings``)."""
    args = argparse.Namespace(**settings)
    use_for_temporary_files(directory)
    spark, service, port = ingest_session(directory)
    try:
        runs = iter(range(1_000_000))
        parent.send("ready")
        parent.serve(lambda command: one_ingest(
            spark, service, port, args, os.path.join(directory, f"i{next(runs)}")))
    finally:
        service.stop()
        spark.stop()


def ingest_session(directory: str) -> tuple[Any, Any, int]:
    """A local Spark session and a driver service for ingest runs, under ``directory``;
    the service's beacon port."""
    import peermesh.spark as ps
    from peermesh.spark.session import local_session

    progress("starting Spark (local[2])")
    spark = local_session(directory, app="bench_spark")
    port = free_udp_port()
    service = ps.start_service(spark, groups=["bench"], directory=os.path.join(directory, "log"),
                               interface="lo", port=port, interval=INTERVAL, bind="127.0.0.1",
                               trim=True)
    return spark, service, port


def one_ingest(spark: Any, service: Any, port: int, args: argparse.Namespace,
               tmp: str) -> dict[str, Any]:
    """``bench_ingest``, started again when Spark's planner does not connect back."""
    tries = iter(range(STREAM_RESTARTS + 1))  # a fresh checkpoint for each start
    run, restarts = restarting(lambda: bench_ingest(spark, service, port, args,
                                                    os.path.join(tmp, f"t{next(tries)}")))
    return {**run, "restarts": restarts}


def ingest_trees(args: argparse.Namespace) -> dict[str, Any]:
    """Ingest runs of this checkout and of ``--baseline``, each in a child process with a
    Spark session of its own, the rounds alternating between them."""
    code = harness.trees(args.baseline)
    settings = {k: getattr(args, k) for k in ("peers", "messages", "timeout")}
    scratch = tempfile.mkdtemp(prefix="bench-spark-ingest-")
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in code}
    try:
        with harness.Children() as children:
            ingesters = {}
            for label, tree in code.items():
                ingesters[label] = children.start("bench_spark", "ingester", tree,
                                                  directory=os.path.join(scratch, label),
                                                  settings=settings)
                ingesters[label].expect("ready", 600)
            for r in range(args.ingest_rounds):
                # ABBA: neither tree always runs second, on a machine whose load drifts
                order = list(ingesters.items())[::-1 if r % 2 else 1]
                for label, child in order:
                    progress(f"{label}: ingest round {r + 1}/{args.ingest_rounds}")
                    runs[label].append(child.ask(args.timeout * 4, go=r))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = summary_ingest(runs["peermesh"])
    result["baseline"] = {**summary_ingest(runs["baseline"]), "library": code["baseline"]}
    result["now_vs_base"] = statistics.median(
        n["per_s"] / b["per_s"] for n, b in zip(runs["peermesh"], runs["baseline"]))
    return result


def summary_ingest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run of ``runs`` (by end-to-end rate), with every run's rate and CPU."""
    return {**harness.median_run(runs, "per_s"), "cpu_us_trials": [r["cpu_us"] for r in runs]}


def median_ingest(spark: Any, service: Any, port: int, args: argparse.Namespace,
                  tmp: str) -> dict[str, Any]:
    """``bench_ingest`` ``--ingest-rounds`` times: the median run, every run's rate."""
    runs = []
    for r in range(args.ingest_rounds):
        progress(f"ingest round {r + 1}/{args.ingest_rounds}")
        runs.append(one_ingest(spark, service, port, args, os.path.join(tmp, f"i{r}")))
    return summary_ingest(runs)


def table(r: dict[str, Any]) -> str:
    lines = ["| measurement | result | target |", "| --- | --- | --- |"]
    ingest = r.get("ingest")
    if ingest:
        ok = "met" if ingest["per_s"] >= TARGETS["ingest_per_s"] else "NOT met"
        lines.append(f"| ingest end to end ({ingest['peers']} peers x "
                     f"{ingest['messages'] // ingest['peers']:,} msgs) | "
                     f"{ingest['per_s']:,.0f} msg/s (runs: "
                     f"{', '.join(f'{t:,.0f}' for t in ingest['trials'])}) | "
                     f">= {TARGETS['ingest_per_s']:,} ({ok}) |")
        lines.append(f"| - CPU of the whole pipeline per message (peers, service, Spark) | "
                     f"{ingest['cpu_us']:.1f} µs: {ingest['cpu_bound_per_s']:,.0f} msg/s "
                     f"with all {os.cpu_count()} cores to itself | |")
        lines.append("| - CPU per message by process | " + ", ".join(
            f"{k} {v:.1f} µs" for k, v in ingest.get("cpu_us_by_part", {}).items()) + " | |")
        lines.append(f"| - peers shouting | {ingest['shout_per_s']:,.0f} msg/s | |")
        lines.append(f"| - logged by the driver's service | {ingest['logged_per_s']:,.0f} msg/s "
                     "| |")
        if ingest["query_per_s"]:
            lines.append(f"| - query processing ({ingest['batches']} batches with data) | "
                         f"{ingest['query_per_s']:,.0f} rows/s | |")
        base = ingest.get("baseline")
        if base:
            lines.append(f"| ingest end to end [baseline] | {base['per_s']:,.0f} msg/s (runs: "
                         f"{', '.join(f'{t:,.0f}' for t in base['trials'])}); CPU "
                         f"{base['cpu_us']:.1f} µs per message | |")
            lines.append(f"| this checkout / baseline, end-to-end rate | "
                         f"{ingest['now_vs_base']:.2f}x | |")
    read = r.get("read")
    if read:
        for label in ("peermesh", "baseline"):
            got = read.get(label)
            if not got:
                continue
            tag = "" if label == "peermesh" else " [baseline]"
            for kind, name, target in (("batch", "batch read", 0.7),
                                       ("stream", "availableNow stream", 0.5)):
                ratio = got[f"{kind}_vs_parquet"]
                ok = f">= {target} ({'met' if ratio >= target else 'NOT met'})" if not tag else ""
                lines.append(f"| {name} of {read['rows']:,} rows{tag} | {got[kind]:.2f} s, "
                             f"{ratio:.2f}x parquet's speed ({got[f'parquet_{kind}']:.2f} s); "
                             f"CPU {got[f'{kind}_cpu']:.2f} s, "
                             f"{got[f'{kind}_cpu_vs_parquet']:.2f}x parquet's "
                             f"({got[f'parquet_{kind}_cpu']:.2f} s) | {ok} |")
                if not tag:
                    lines.append(f"| - ceiling: a minimal Python data source of the same Arrow "
                                 f"batches, memory-mapped | {got[f'memory_{kind}']:.2f} s, "
                                 f"{got[f'memory_{kind}_vs_parquet']:.2f}x parquet's speed; "
                                 f"CPU {got[f'memory_{kind}_cpu']:.2f} s, "
                                 f"{got[f'memory_{kind}_cpu_vs_parquet']:.2f}x parquet's | |")
        restarts = sum(read[label].get("restarts", 0) for label in ("peermesh", "baseline")
                       if label in read)
        if restarts:
            lines.append(f"| streams started again (planner did not connect back in 10 s) | "
                         f"{restarts} | |")
        if "now_vs_base" in read:
            speed = read["now_vs_base"]
            lines.append(f"| this checkout / baseline, speed | batch {speed['batch']:.2f}x, "
                         f"stream {speed['stream']:.2f}x | |")
    req = r.get("requests")
    if req and "per_s" in req:
        ok = "met" if req["per_s"] >= TARGETS["requests_per_s"] else "NOT met"
        lines.append(f"| executor requests ({req['servers']} servers, window {req['window']}) | "
                     f"{req['per_s']:,.0f} req/s | >= {TARGETS['requests_per_s']:,} ({ok}) |")
    elif req:
        lines.append(f"| executor requests | skipped: {req['skipped']} | |")
    lines.append("| load average (1, 5, 15 min) at the end | "
                 f"{', '.join(f'{x:.2f}' for x in r['load_average'])} | |")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=2, help="shouting peer processes")
    parser.add_argument("--messages", type=int, default=100_000, help="messages per peer")
    parser.add_argument("--servers", type=int, default=2, help="server processes")
    parser.add_argument("--requests", type=int, default=50_000, help="requests in the timed run")
    parser.add_argument("--window", type=int, default=128, help="requests in flight per task")
    parser.add_argument("--timeout", type=float, default=120.0, help="limit per phase (s)")
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="messages in the log for the read phase")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds of the read phase (medians reported)")
    parser.add_argument("--ingest-rounds", type=int, default=1,
                        help="ingest runs (the median run is reported)")
    parser.add_argument("--baseline", metavar="REV",
                        help="read and ingest phases: also measure the code of commit REV (or a "
                             "directory holding peermesh), in a Spark session of its own, same "
                             "rounds")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="read phase: a Spark setting for this checkout's session (not the "
                             "baseline's: --baseline . measures a setting's effect); repeatable")
    parser.add_argument("--only", default="ingest,read,requests",
                        help="comma-separated sections: ingest, read, requests")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    args.only = set(args.only.split(","))
    try:
        args.conf = dict(item.split("=", 1) for item in args.conf)
    except ValueError:
        parser.error("--conf takes KEY=VALUE")
    results = run(args)
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    harness.run(main)  # SIGTERM too ends the children and removes the scratch directories
