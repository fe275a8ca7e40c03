#!/usr/bin/env python3
"""Mesh telemetry through Spark and back: a runnable example of ``peermesh.spark``.

What runs (everything on loopback, in this process, Spark on ``local[2]``):

* the driver-side service (``peermesh.spark.start_service``) joins the mesh
  group ``telemetry`` and logs every message shouted there;
* ``--sensors`` mesh peers (``ThreadedNode``s) shout readings
  ``{"host", "temp", "load"}`` to ``telemetry`` several times a second;
* a streaming query reads ``telemetry`` with a user schema (the payload's
  fields become columns), averages each host's readings over 5-second
  windows, and writes every updated window back to the mesh group
  ``telemetry-summary`` (``writeStream.format("peermesh")``, sent from the
  executors);
* a ``dashboard`` peer in ``telemetry-summary`` prints what arrives.

    python scripts/spark_example.py              # 3 sensors; 20 s after the first summary
    python scripts/spark_example.py --seconds 60 --sensors 5

Needs Java 17 and ``pip install ".[spark]"``; the environment Spark needs
(``SPARK_LOCAL_IP``, ``PYSPARK_PYTHON``) is set by
``peermesh.spark.session.local_session``.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sensor(name: str, port: int, stop: threading.Event, rate: float) -> int:
    """One mesh peer shouting readings until ``stop``; how many it sent."""
    from peermesh import ThreadedNode

    sent = 0
    with ThreadedNode(name, interface="lo", port=port, interval=0.2) as node:
        while not node.peers_by_group("telemetry") and not stop.is_set():
            time.sleep(0.05)
        temp = random.uniform(18, 24)
        while not stop.wait(1 / rate):
            temp += random.uniform(-0.3, 0.3)
            node.shout_packed("telemetry", {"host": name, "temp": round(temp, 2),
                                            "load": round(random.random(), 3)})
            sent += 1
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="how long to go on once the first summaries arrived")
    parser.add_argument("--sensors", type=int, default=3, help="sensor peers")
    parser.add_argument("--rate", type=float, default=20.0, help="readings per second per sensor")
    args = parser.parse_args(argv)

    import peermesh.spark as ps
    from peermesh import ThreadedNode
    from peermesh.spark.session import local_session
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    tmp = tempfile.mkdtemp(prefix="peermesh-spark-example-")
    port = free_udp_port()
    print(f"Spark local[2] (scratch in {tmp}); mesh on lo, beacon port {port}")
    spark = local_session(tmp, app="peermesh-example")
    service = ps.start_service(spark, groups=["telemetry"], directory=os.path.join(tmp, "log"),
                               interface="lo", port=port, interval=0.2)
    print(f"driver service: log {service.path}, endpoint {service.endpoint}")

    readings = (spark.readStream.format("peermesh").option("group", "telemetry")
                .schema("received timestamp, host string, temp double, load double")
                .load())
    summary = (readings.withWatermark("received", "10 seconds")
               .groupBy(F.window("received", "5 seconds"), "host")
               .agg(F.round(F.avg("temp"), 2).alias("avg_temp"),
                    F.round(F.max("load"), 3).alias("max_load"),
                    F.count("*").alias("readings"))
               .select(F.col("window.start").cast("string").alias("window"), "host",
                       "avg_temp", "max_load", "readings"))

    def publish(batch: "DataFrame", batch_id: int) -> None:
        # Spark's Python sinks take append mode only; updated windows go out through a
        # batch write of each micro-batch (rows are shouted from the executors)
        batch.write.format("peermesh").option("group", "telemetry-summary") \
            .mode("append").save()

    query = (summary.writeStream.outputMode("update").foreachBatch(publish)
             .trigger(processingTime="2 seconds")
             .option("checkpointLocation", os.path.join(tmp, "checkpoint")).start())

    stop = threading.Event()
    counts: dict[str, int] = {}
    summaries = 0
    try:
        with ThreadedNode("dashboard", interface="lo", port=port, interval=0.2,
                          groups=["telemetry-summary"]) as dashboard:
            threads = []
            for i in range(args.sensors):
                name = f"sensor-{i + 1}"
                thread = threading.Thread(
                    target=lambda n=name: counts.__setitem__(n, sensor(n, port, stop, args.rate)),
                    daemon=True)
                thread.start()
                threads.append(thread)

            def show(event: Any) -> int:
                if event is None or event.type.value != "SHOUT":
                    return 0
                row = event.unpack()
                print(f"  {row['window']}  {row['host']:<10} avg {row['avg_temp']:6.2f} C"
                      f"  max load {row['max_load']:.3f}  ({row['readings']} readings)")
                return 1

            # the first micro-batch also starts Spark's Python workers: allow for it
            print("waiting for the first summaries (the first micro-batch takes a while)")
            deadline = time.monotonic() + args.seconds
            give_up = time.monotonic() + 180
            while time.monotonic() < (deadline if summaries else give_up):
                summaries += show(dashboard.recv(0.5))
                if summaries == 1:
                    deadline = time.monotonic() + args.seconds
            stop.set()
            for thread in threads:
                thread.join(5)
            query.processAllAvailable()
            while (event := dashboard.recv(1.0)) is not None:
                summaries += show(event)
    finally:
        stop.set()
        query.stop()
        service.stop()
        spark.stop()
    print(f"sensors sent {sum(counts.values())} readings; the dashboard got {summaries} "
          f"window summaries from Spark")
    return 0 if summaries else 1


if __name__ == "__main__":
    sys.exit(main())
