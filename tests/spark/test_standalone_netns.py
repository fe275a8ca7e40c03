"""A Spark standalone cluster whose worker is another host: its own network namespace.

The master, the driver program and its ``DriverService`` (mesh on ``lo``,
log server and MTL gateway on the root end of a veth, ``netlab.Lan.link_root``)
run in this machine's namespace; the worker, its executor and their Python
workers in a namespace of their own, with no address on the driver's mesh.
The executor writes through the driver's gateway (the driver logs every row
once) and calls a Safir-Darbaan service on the driver's mesh through it. Every
Python process of the cluster is ``peermesh-pyspark-python``, as
``docs/spark.md`` tells a cluster's users to set it up.
Needs root and ``ip`` (CI runs as root); skips with the reason elsewhere.
Every namespace, veth and process the test made is removed, also on failure
(the ``lan_factory`` finaliser, the ``finally`` below).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from peermesh.spark.pythonexec import installed_launcher

from .conftest import spark_unavailable, wait_until

try:  # tests/ as a package
    from ..netlab import REPO_ROOT
except ImportError:  # tests/ on sys.path
    from netlab import REPO_ROOT

if spark_unavailable():
    pytest.skip(spark_unavailable(), allow_module_level=True)

ROWS = 2000
#: bounds: the master's port open, the whole driver program (session, write, log read).
#: The run costs about 35 s of CPU (four JVMs and their Python workers start); on a
#: machine shared with heavy load (load average 50 on 2 cores) it took 150-180 s
MASTER_TIMEOUT = 60.0
DRIVER_TIMEOUT = 200.0
ROWS_PARTITIONS = 2

DRIVER = r"""
import json, os, sys
cfg = json.loads(sys.argv[1])
from pyspark.sql import SparkSession
from peermesh import NodeConfig, ThreadedNode, sada
from peermesh.spark import call_service, register, start_service
from peermesh.spark.log import MessageLog
import msgpack

calc = sada.Service("calc", "1.0")
calc.add("double", lambda value: value * 2, inline=True)
calc_node = ThreadedNode("calc", config=NodeConfig(), interface="lo", port=cfg["beacon"],
                         interval=0.1, headers=dict(sada.ThreadedServer.headers)).start()
server = sada.ThreadedServer(services=[calc]).start(calc_node)
service = start_service(None, groups=["telemetry"], directory=cfg["dir"], interface="lo",
                        port=cfg["beacon"], interval=0.1, retention=None,
                        bind=cfg["root"], gateway=cfg["root"])
assert service.channel.wait_for("calc", timeout=60)
print("READY", flush=True)
sys.stdin.readline()  # the master is up
spark = (SparkSession.builder.master(cfg["master"]).appName("peermesh-netns")
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", cfg["root"])
         .config("spark.driver.bindAddress", cfg["root"])
         .config("spark.executor.memory", "512m")
         .config("spark.executor.cores", "1")
         .config("spark.cores.max", "1")
         .config("spark.pyspark.python", cfg["python"])
         .config("spark.executorEnv.PYTHONPATH", cfg["pythonpath"])
         .config("spark.local.dir", cfg["local"])
         .config("spark.driver.extraJavaOptions", "-Djava.io.tmpdir=" + cfg["local"])
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")
register(spark, service)

def tagged(rows):
    import os, pyspark
    where = os.stat("/proc/self/ns/net").st_ino
    for i in rows:
        yield (i, where, pyspark.__file__)

rows = spark.sparkContext.parallelize(range(cfg["rows"]), cfg["partitions"])
rows = rows.mapPartitions(tagged)
frame = spark.createDataFrame(rows, "i long, ns long, pyspark string")
frame.write.format("peermesh").option("group", "telemetry").mode("append").save()
with MessageLog(service.path) as log:
    logged = log.read(0, 10 ** 9, ["telemetry"])
values = [msgpack.unpackb(r[5]) for r in logged]
called = call_service(frame, "calc", "double", payload="i", reply_schema="doubled long",
                      errors="column").collect()
print("RESULT " + json.dumps({
    "driver_ns": os.stat("/proc/self/ns/net").st_ino,
    "ids": [v["i"] for v in values], "ns": sorted({v["ns"] for v in values}),
    "pyspark": sorted({v["pyspark"] for v in values}),
    "senders": sorted({r[3] for r in logged}),
    "calls": sorted([r.i, r.doubled, r.status, r.ns] for r in called),
    "gateway_calls": service.stats.gateway_calls}), flush=True)
spark.stop()
service.stop()
server.stop()
calc_node.stop()
"""


def _spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _stop(proc: "subprocess.Popen[Any]") -> None:
    """End ``proc``'s process group (it was started in a session of its own)."""
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def _listening(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no output)"


@pytest.mark.timeout(MASTER_TIMEOUT + DRIVER_TIMEOUT + 30)
def test_a_worker_on_another_host_writes_and_calls_through_the_drivers_gateway(
        tmp_path: Path, beacon_port: int, lan_factory: Callable[..., Any]) -> None:
    python = installed_launcher()
    assert python is not None, "peermesh-pyspark-python is not installed (pip install -e .)"
    java_env = {"SPARK_DAEMON_MEMORY": "256m", "PYSPARK_PYTHON": python,
                "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={tmp_path}",
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    started: list[subprocess.Popen[Any]] = []
    lan = lan_factory(1)
    root = lan.link_root()
    host = lan.hosts[0]
    master_port, master_ui = _free_port(root), _free_port(root)
    master_url = f"spark://{root}:{master_port}"
    env = {**os.environ, **java_env, "SPARK_LOCAL_IP": root,
           "PYTHONPATH": os.pathsep.join(filter(None, (REPO_ROOT,
                                                        os.environ.get("PYTHONPATH"))))}
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker", "driver")}
    (tmp_path / "work").mkdir()
    (tmp_path / "local").mkdir()
    config = {"dir": str(tmp_path / "log"), "beacon": beacon_port, "root": root,
              "master": master_url, "rows": ROWS, "partitions": ROWS_PARTITIONS,
              "local": str(tmp_path / "local"), "python": python,
              "pythonpath": env["PYTHONPATH"]}
    try:
        with open(logs["master"], "wb") as out:
            started.append(subprocess.Popen(
                [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", root,
                 "--port", str(master_port), "--webui-port", str(master_ui)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        with open(logs["driver"], "wb") as out:   # (it starts its service meanwhile)
            driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(config)],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=out, start_new_session=True)
            started.append(driver)
        # (a worker or driver that finds no master waits 10-20 s before it asks again)
        wait_until(lambda: _listening(root, master_port), MASTER_TIMEOUT, "the master")
        with open(logs["worker"], "wb") as out:
            host.popen([_spark_class(), "org.apache.spark.deploy.worker.Worker", master_url,
                        "--host", host.address, "--cores", "1", "--memory", "768m",
                        "--webui-port", str(_free_port("127.0.0.1")),
                        "--work-dir", str(tmp_path / "work")],
                       env={**java_env, "SPARK_LOCAL_IP": host.address},
                       stdout=out, stderr=subprocess.STDOUT)
        try:
            printed, _ = driver.communicate(b"go\n", timeout=DRIVER_TIMEOUT)
        except subprocess.TimeoutExpired:
            printed = b""
        lines = [line for line in printed.decode(errors="replace").splitlines()
                 if line.startswith("RESULT ")]
        executors = sorted((tmp_path / "work").glob("*/*/stderr"))
        assert lines, (f"the driver printed no result (exit {driver.poll()}); driver:\n"
                       f"{_tail(logs['driver'])}\nworker:\n{_tail(logs['worker'])}\n"
                       f"executor:\n{_tail(executors[-1]) if executors else 'none'}\n"
                       f"master:\n{_tail(logs['master'])}")
    finally:
        for proc in reversed(started):
            _stop(proc)
    result = json.loads(lines[-1][len("RESULT "):])
    ids = result["ids"]
    assert len(ids) == ROWS and sorted(ids) == list(range(ROWS)), \
        f"{len(ids)} logged, {len(set(ids))} distinct, of {ROWS}"
    # every row was written by an executor in the worker's namespace, through the gateway
    assert len(result["ns"]) == 1 and result["ns"][0] != result["driver_ns"], result["ns"]
    assert result["senders"] == ["mtl:spark-executors"]
    # its Python workers imported the installed pyspark, not the zip Spark hands them
    assert len(result["pyspark"]) == 1 and ".zip" not in result["pyspark"][0], result["pyspark"]
    # and called calc, on the driver's mesh, through it: every reply right
    assert result["calls"] == [[i, 2 * i, 200, result["ns"][0]] for i in range(ROWS)], \
        result["calls"][:5]
    assert result["gateway_calls"] == ROWS
