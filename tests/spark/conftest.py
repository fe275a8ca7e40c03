"""Fixtures of the PySpark tests: one local Spark session for the whole run, mesh peers.

The session is ``local[2]`` with the UI off, bound to 127.0.0.1
(``SPARK_LOCAL_IP`` too), its Python workers running this interpreter (through
``peermesh-pyspark-python``), and its warehouse, local and checkpoint
directories under pytest's tmp path. Tests that need it skip with the reason
when Java or pyspark is missing. Every node stays on loopback with a beacon
port of its own test.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, Optional

import pytest

INTERVAL = 0.1


def spark_unavailable() -> Optional[str]:
    """Why a local Spark session cannot run here, or None."""
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"pyspark, pyarrow and pandas are needed (pip install '.[spark]'): {exc}"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and os.path.exists(
            os.path.join(java_home, "bin", "java"))):
        return "java is not installed (PySpark needs a JDK; Java 17 works)"
    return None


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SparkSession shared by every test of the directory."""
    reason = spark_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from peermesh.spark.session import local_environment, local_session

    saved = {key: os.environ.get(key) for key in local_environment()}
    session = local_session(tmp_path_factory.mktemp("spark"), app="peermesh-tests",
                            **{"spark.sql.streaming.pollingDelay": "20ms",
                               "spark.driver.extraJavaOptions": "-Dpeermesh.tests=1"})
    try:
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def beacon_port() -> int:
    """A UDP port on 127.0.0.1 that was free a moment ago (this test's mesh)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def make_service(tmp_path: Any, beacon_port: int) -> Iterator[Callable[..., Any]]:
    """``make_service(groups, spark=None, **settings)``: a started DriverService on loopback,
    stopped at teardown (``spark``: also registered with it)."""
    from peermesh.spark import start_service

    services: list[Any] = []

    def make(groups: Any, spark: Any = None, **settings: Any) -> Any:
        settings.setdefault("directory", tmp_path / f"log{len(services)}")
        settings.setdefault("interface", "lo")
        settings.setdefault("port", beacon_port)
        settings.setdefault("interval", INTERVAL)
        # many tests append messages stamped near 1970 straight to the log: the default
        # retention by age (7 days) would delete them at once
        settings.setdefault("retention", None)
        service = start_service(spark, groups=groups, **settings)
        services.append(service)
        return service

    yield make
    for service in reversed(services):
        service.stop(0.2)


@pytest.fixture
def make_peer(beacon_port: int) -> Iterator[Callable[..., Any]]:
    """``make_peer(name, groups=())``: a started loopback ThreadedNode, stopped at teardown."""
    from peermesh import NodeConfig, ThreadedNode

    peers: list[Any] = []

    def make(name: str, groups: Any = (), **settings: Any) -> Any:
        settings.setdefault("interface", "lo")
        settings.setdefault("port", beacon_port)
        settings.setdefault("interval", INTERVAL)
        peer = ThreadedNode(name, config=NodeConfig(), groups=list(groups), **settings)
        peers.append(peer.start())
        return peer

    yield make
    for peer in reversed(peers):
        peer.stop(0.2)


def wait_until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``predicate`` until it is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.02)


def shout_all(peer: Any, group: str, items: list[Any]) -> None:
    """Shout every item (msgpack) from ``peer`` in one hand-over to its hub, then flush."""
    peer.call(lambda node: [node.shout_packed(group, item) for item in items])
    assert peer.call(lambda node: node.flush(5.0)), "a member did not confirm the shouts"


def meet(peer: Any, group: str, timeout: float = 10.0) -> None:
    """Wait until ``peer`` sees a member of ``group`` (e.g. the driver's node)."""
    wait_until(lambda: peer.peers_by_group(group), timeout, f"{peer.name} to meet {group}")


@pytest.fixture
def calc(make_peer: Callable[..., Any]) -> Iterator[Any]:
    """A server of ``calc`` 1.0 on the mesh; ``calc.recorded`` holds what ``record`` got.
    ``slow`` answers after 30 s (a request with a shorter timeout times out)."""
    sada = pytest.importorskip("peermesh.sada", reason="Safir-Darbaan (peermesh.sada) is missing")
    import gevent

    service = sada.Service("calc", "1.0")
    recorded: list[Any] = []

    @service.action("double", inline=True)
    def double(value: Any) -> Any:
        return {"value": value * 2, "kind": "doubled"}

    @service.action("picky", inline=True)
    def picky(value: Any) -> Any:
        if value % 2:
            raise sada.ServiceError(409, f"{value} is odd")
        return value

    @service.action("record", inline=True)
    def record(value: Any) -> Any:
        recorded.append(value)
        if isinstance(value, dict) and value.get("id") == -1:
            raise sada.ServiceError(422, "id -1 is refused")
        return None

    @service.action("slow")
    def slow(value: Any) -> Any:
        gevent.sleep(30)
        return value

    node = make_peer("calc-server", headers=dict(sada.ThreadedServer.headers))
    server = sada.ThreadedServer(services=[service]).start(node)
    server.recorded = recorded
    yield server
    server.stop(0.2)
