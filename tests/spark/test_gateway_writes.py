"""Writes through the driver's MTL gateway (no Spark session, no mesh node on the writer).

What the gateway confirmed is in the log at that moment: the writer's
Confirm follows the append. Groups the driver does not log are refused.
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack
import pytest

from .conftest import spark_unavailable, wait_until

if spark_unavailable():
    pytest.skip(spark_unavailable(), allow_module_level=True)


def _payloads(service: Any, group: str) -> list[bytes]:
    from peermesh.spark.log import MessageLog

    with MessageLog(service.path) as log:
        return [row[5] for row in log.read(0, 10 ** 9, [group])]


@pytest.fixture
def gateway_writer() -> Any:
    from peermesh.spark import executor

    yield executor.executor_gateway
    executor.stop_all()


def test_what_the_gateway_confirmed_is_in_the_log(
        make_service: Callable[..., Any], gateway_writer: Callable[..., Any]) -> None:
    from peermesh.spark.executor import GatewaySettings
    from peermesh.spark.source import WriteOptions

    service = make_service(["telemetry"], channel=False, gateway="127.0.0.1")
    options = {k.lower(): v for k, v in service.options().items()}
    assert options["gateway"] == service.gateway_endpoint
    opts = WriteOptions.parse({**options, "group": "telemetry"})
    assert opts.gateway == GatewaySettings.from_options(options)
    # an empty option gateway: this write goes through a mesh node
    assert WriteOptions.parse({**options, "group": "other", "gateway": ""}).gateway is None

    writer = gateway_writer(opts.gateway)
    sent = [msgpack.packb({"i": i}) for i in range(5000)]
    for start in range(0, len(sent), 2000):
        writer.send_many("telemetry", sent[start:start + 2000])
    writer.confirm(20.0)
    # no waiting: the Confirm came after the append
    got = _payloads(service, "telemetry")
    assert got == sent, f"{len(got)} logged of {len(sent)}"
    assert service.stats.messages == len(sent)
    row_sender = None
    from peermesh.spark.log import MessageLog

    with MessageLog(service.path) as log:
        row_sender = log.read(0, 1, ["telemetry"])[0][3]
    assert row_sender == "mtl:spark-executors"


def test_a_write_task_through_the_gateway_routes_rows_by_their_group_column(
        make_service: Callable[..., Any], gateway_writer: Callable[..., Any]) -> None:
    from pyspark.sql import Row

    from peermesh.spark.executor import MeshWriteError
    from peermesh.spark.source import WriteOptions, write_rows

    service = make_service(["a", "b"], channel=False, gateway="127.0.0.1")
    options = {k.lower(): v for k, v in service.options().items()}
    opts = WriteOptions.parse(options, columns=["group", "i"])
    assert opts.group_column and opts.gateway is not None
    rows = [Row(group="ab"[i % 2], i=i) for i in range(4100)]
    commit = write_rows(opts, iter(rows))
    assert (commit.rows, commit.mode) == (4100, "gateway")
    for name, parity in (("a", 0), ("b", 1)):
        logged = [msgpack.unpackb(p)["i"] for p in _payloads(service, name)]
        assert logged == list(range(parity, 4100, 2))
    assert write_rows(opts, iter([])).rows == 0
    with pytest.raises(MeshWriteError, match="row 1 of this task has no group"):
        write_rows(opts, iter([Row(group="a", i=0), Row(group="", i=1)]))


def test_writers_are_pushed_back_when_the_log_lags_and_nothing_is_lost(
        make_service: Callable[..., Any], gateway_writer: Callable[..., Any]) -> None:
    from peermesh.spark.executor import GatewaySettings

    service = make_service(["burst"], channel=False, gateway="127.0.0.1")
    queues = service.gateway.data.queues
    queues.max_pending = 4096       # four contents wait for the log, at most
    settings = GatewaySettings.from_options(
        {k.lower(): v for k, v in service.options().items()})
    assert settings is not None
    writer = gateway_writer(settings)
    sent = [b"%04d" % i + b"x" * 1020 for i in range(2000)]
    writer.send_many("burst", sent)
    writer.confirm(30.0)
    got = _payloads(service, "burst")
    assert sorted(got) == sent      # each once (refused ones came again, later)
    # (the ingest takes what waits every 10 ms, at most)
    assert service.stats.gateway_refused > 0


def test_a_group_the_driver_does_not_log_is_refused(
        make_service: Callable[..., Any], gateway_writer: Callable[..., Any]) -> None:
    from peermesh.spark.executor import GatewaySettings, MeshWriteError

    service = make_service(["logged"], channel=False, gateway=True)
    settings = GatewaySettings.from_options(
        {k.lower(): v for k, v in service.options().items()})
    assert settings is not None
    writer = gateway_writer(settings)
    with pytest.raises(MeshWriteError, match="not-logged"):
        writer.send_many("not-logged", [b"x"])
    # a group joined later is writable from then on (the gateway reads its users again)
    service.join("later")
    def took() -> bool:
        try:
            writer.send_many("later", [b"y"])
        except MeshWriteError:
            return False
        return True

    wait_until(took, 5.0, "the gateway to take group 'later'")
    writer.confirm(10.0)
    assert _payloads(service, "later")[-1:] == [b"y"]


def test_on_a_mesh_with_keys_the_gateway_speaks_curve(
        make_service: Callable[..., Any], gateway_writer: Callable[..., Any],
        tmp_path: Any) -> None:
    import sys
    from pathlib import Path

    from peermesh.spark.source import WriteOptions

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
    from curvemesh import KeyRing

    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "driver")
    service = make_service(["secure"], channel=False, gateway="127.0.0.1",
                           key_file=ring.secret("driver"), allowed_keys=allowed)
    options = {k.lower(): v for k, v in service.options().items()}
    assert options["serverkey"] == ring.public("driver").decode()
    # no keyFile: the executor makes no mesh node, the gateway needs only the driver's key
    opts = WriteOptions.parse({**options, "group": "secure"})
    assert opts.gateway is not None and opts.gateway.server_key == options["serverkey"]
    writer = gateway_writer(opts.gateway)
    writer.send_many("secure", [b"a", b"b"])
    writer.confirm(10.0)
    assert _payloads(service, "secure") == [b"a", b"b"]


def test_gateway_options_need_the_credentials() -> None:
    from peermesh.spark.source import WriteOptions

    with pytest.raises(ValueError, match="gatewayUser"):
        WriteOptions.parse({"group": "g", "gateway": "tcp://127.0.0.1:1"})
    from peermesh.spark.service import DriverService

    with pytest.raises(ValueError, match="gateway port"):
        DriverService(["g"], gateway="127.0.0.1:99999")
