"""Safir-Darbaan calls from executors through the driver's MTL gateway.

The executors open no mesh node: each request goes to the gateway as MTL
content with a reply queue and an id, the driver's channel calls ``calc``
(a server on loopback, ``conftest.calc``) and the reply comes back as content
on the queue. Outcomes are those of calls through the mesh.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from .conftest import spark_unavailable

pytestmark = pytest.mark.slow

sada = pytest.importorskip("peermesh.sada", reason="Safir-Darbaan (peermesh.sada) is missing")


@pytest.fixture
def executors() -> Any:
    """``peermesh.spark.executor``, with this process's clients closed at teardown."""
    from peermesh.spark import executor

    yield executor
    executor.stop_all()


def _settings(service: Any) -> Any:
    from peermesh.spark.executor import GatewaySettings

    return GatewaySettings.from_options({k.lower(): v for k, v in service.options().items()})


def _gateway_service(make_service: Callable[..., Any], calc: Any, spark: Any = None,
                     **settings: Any) -> Any:
    service = make_service(["unused"], spark, gateway="127.0.0.1", **settings)
    assert service.channel.wait_for("calc", timeout=20)
    return service


def test_calls_through_the_gateway_reply_in_order(make_service: Callable[..., Any], calc: Any,
                                                  executors: Any) -> None:
    service = _gateway_service(make_service, calc)
    gateway = _settings(service)
    values = list(range(3000))
    outcomes = executors.request_many(None, gateway, "calc", "double", values, window=50)
    assert [o.value for o in outcomes] == [{"value": 2 * v, "kind": "doubled"} for v in values]
    assert {o.status for o in outcomes} == {200}
    # handler errors keep their status, in their place
    picky = executors.request_many(None, gateway, "calc", "picky", list(range(6)), window=3)
    assert [(o.ok, o.status, o.value) for o in picky] == [
        (i % 2 == 0, 409 if i % 2 else 200, None if i % 2 else i) for i in range(6)]
    assert picky[1].error == "409 1 is odd"
    # no server of the service: the channel's 404 after the request's timeout
    missing = executors.request_many(None, gateway, "nothing", "x", [1], timeout=0.5)
    assert missing[0].status == 404 and "no server offers service 'nothing'" in missing[0].error
    assert service.stats.gateway_calls == 3000 + 6 + 1
    # the reply queues are the gateway's own: the driver's node joined no group for them
    assert service.node.groups() == ["unused"]


def test_a_call_that_outlives_its_timeout(make_service: Callable[..., Any], calc: Any,
                                          executors: Any) -> None:
    service = _gateway_service(make_service, calc)
    outcomes = executors.request_many(None, _settings(service), "calc", "slow", [1, 2],
                                      timeout=0.3)
    assert [(o.ok, o.status) for o in outcomes] == [(False, None), (False, None)]
    assert all(o.error.startswith("RequestTimeout: ") for o in outcomes), outcomes


def test_calls_in_flight_are_bounded_per_client_and_in_all(
        make_service: Callable[..., Any], calc: Any, executors: Any) -> None:
    service = _gateway_service(make_service, calc)
    service._relay.per_client = 2      # (MAX_PER_CLIENT: 1024)
    outcomes = executors.request_many(None, _settings(service), "calc", "slow",
                                      list(range(5)), timeout=0.5, window=5)
    statuses = sorted((o.status or 0) for o in outcomes)
    assert statuses == [0, 0, 429, 429, 429], outcomes
    assert "more than 2 calls in flight from one client" in \
        next(o.error for o in outcomes if o.status == 429)
    # in all: every client counts
    service._relay.per_client, service._relay.total = 1024, 1
    outcomes = executors.request_many(None, _settings(service), "calc", "slow", [1, 2],
                                      timeout=0.5, window=2)
    assert sorted((o.status or 0) for o in outcomes) == [0, 503]
    # once the calls ended the room is back
    assert service._relay.running == 0 and not service._relay.in_flight
    ok = executors.request_many(None, _settings(service), "calc", "double", [1])
    assert ok[0].value == {"value": 2, "kind": "doubled"}


def test_only_the_services_the_driver_opens(make_service: Callable[..., Any], calc: Any,
                                            executors: Any) -> None:
    service = _gateway_service(make_service, calc, gateway_services=["calc"])
    gateway = _settings(service)
    assert executors.request_many(None, gateway, "calc", "double", [4])[0].value["value"] == 8
    closed = make_service(["unused2"], gateway="127.0.0.1", gateway_services=())
    refused = executors.request_many(None, _settings(closed), "calc", "double", [4, 5])
    assert [o.status for o in refused] == [403, 403]
    assert "service 'calc' is not open to the executors" in refused[0].error


def test_a_request_without_its_own_reply_queue_is_rejected(
        make_service: Callable[..., Any], calc: Any) -> None:
    from peermesh.mtl.client import Client
    from peermesh.spark.remotecalls import CALLS, REPLIES

    service = _gateway_service(make_service, calc)
    gateway = _settings(service)
    with Client(gateway.endpoint, gateway.user, gateway.password) as client:
        writer = client.writer([CALLS], confirm="full")
        properties = {"id": 1, "service": "calc", "action": "double",
                      "reply-to": REPLIES + "nobody-summoned-this"}
        writer.send(b"\x01", CALLS, properties)
        writer.send(b"\x01", CALLS, {"id": "one", "service": "calc"})   # malformed
        assert writer.wait(10)
        assert len(writer.rejected) == 2
        # the user may not write anywhere else under the calls' name, nor read requests
        with pytest.raises(Exception, match="403"):
            client.reader([CALLS], confirm="full")
    assert service.stats.gateway_calls == 0


def test_on_a_mesh_with_keys_calls_need_only_the_drivers_key(
        make_service: Callable[..., Any], make_peer: Callable[..., Any], executors: Any,
        tmp_path: Any) -> None:
    import sys
    from pathlib import Path

    from peermesh.spark.source import WriteOptions

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
    from curvemesh import KeyRing

    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "driver", "server")
    service = make_service(["secure"], gateway="127.0.0.1", key_file=ring.secret("driver"),
                           allowed_keys=allowed)
    calc = sada.Service("calc", "1.0")
    calc.add("double", lambda value: value * 2, inline=True)
    node = make_peer("calc-server", headers=dict(sada.ThreadedServer.headers),
                     key_file=ring.secret("server"), allowed_keys=allowed)
    server = sada.ThreadedServer(services=[calc]).start(node)
    try:
        assert service.channel.wait_for("calc", timeout=20)
        options = {k.lower(): v for k, v in service.options().items()}
        # a write with a service needs no keyFile through the gateway
        opts = WriteOptions.parse({**options, "service": "calc", "action": "double"})
        assert opts.gateway is not None and opts.gateway.server_key == options["serverkey"]
        outcomes = executors.request_many(None, opts.gateway, "calc", "double", [1, 2, 3])
        assert [o.value for o in outcomes] == [2, 4, 6]
    finally:
        server.stop(0.2)


def test_relay_ignores_a_request_it_still_runs() -> None:
    from peermesh.mtl.credentials import make_user
    from peermesh.mtl.dataflow import Grant, LeaseLink
    from peermesh.mtl.profiles import MESH
    from peermesh.spark.executor import Outcome
    from peermesh.spark.remotecalls import CALLS, REPLIES, CallRelay
    from peermesh.wire.mtl import Content, Direction, decode_data

    user = make_user("spark-executors", "pw", read=["*"], write=["*"])
    stranger = make_user("someone", "pw", read=["*"], write=["*"])

    def link(identity: bytes, direction: Direction, who: Any = user) -> LeaseLink:
        grant = Grant("t" + identity.hex(), b"session", who, MESH, "", direction, (),
                      "full", 0.0)
        return LeaseLink(identity, grant, 0.0)

    relay = CallRelay("spark-executors")
    reader, writer = link(b"r", Direction.READ), link(b"w", Direction.WRITE)
    queue = REPLIES + "q"
    relay.summoned(reader, queue)
    relay.summoned(link(b"x", Direction.READ, stranger), REPLIES + "s")   # not the user's
    assert relay.queues == {queue: reader}
    request = Content(7, CALLS, b"\x05", {"id": 3, "service": "calc", "action": "double",
                                           "reply-to": queue})
    sends, call = relay.request(writer, request, 0.0)
    assert call is not None and call.body == b"\x05"
    assert decode_data(sends[0][1]).sequence == 7                  # its Confirm
    again, copy = relay.request(writer, Content(8, CALLS, b"\x05", request.properties), 0.0)
    assert copy is None and len(again) == 1                        # confirmed, not run again
    replies = relay.answered(call, Outcome(True, b"\x0a", 200))
    assert [(identity, decode_data(frames).properties) for identity, frames in replies] == [
        (b"r", {"id": 3, "status": 200})]
    assert relay.running == 0
    relay.gone(reader)                                  # its link went: the reply goes nowhere
    sends, call = relay.request(writer, Content(9, CALLS, b"", {**request.properties, "id": 4}),
                                0.0)
    assert call is None and type(decode_data(sends[0][1])).__name__ == "Reject"


#: (the first test to use the Spark session starts it: about 50 s under load, and its
#: first job starts the Python workers)
needs_spark = pytest.mark.skipif(spark_unavailable() is not None,
                                 reason=str(spark_unavailable()))
first_job = pytest.mark.timeout(300)


@needs_spark
@first_job
def test_service_caller_picks_the_gateway(spark: Any, make_service: Callable[..., Any],
                                          calc: Any) -> None:
    from peermesh.spark import ServiceCaller, call_service
    from peermesh.spark.executor import GatewaySettings

    service = _gateway_service(make_service, calc, spark)
    caller = ServiceCaller("calc", "double", max_in_flight=16)
    assert isinstance(caller.gateway, GatewaySettings)          # from the service's options
    assert ServiceCaller("calc", "double", gateway=False).gateway is False
    df = spark.range(0, 400, numPartitions=2)
    rows = caller.apply(df, payload="id", reply_schema="value long, kind string").collect()
    assert sorted((r.id, r.value, r.kind) for r in rows) == [
        (i, 2 * i, "doubled") for i in range(400)]
    assert service.stats.gateway_calls == 400

    # errors as columns, as through the mesh
    picky = call_service(df.limit(10), "calc", "picky", payload="id", errors="column",
                         reply_schema="value long").collect()
    assert sorted((r.id, r.value, r.status, r.error) for r in picky) == [
        (i, None if i % 2 else i, 409 if i % 2 else 200, f"409 {i} is odd" if i % 2 else None)
        for i in range(10)]


@needs_spark
@first_job
def test_timeouts_and_failures_through_the_gateway(spark: Any, make_service: Callable[..., Any],
                                                   calc: Any) -> None:
    from peermesh.spark import ServiceCaller, call_service

    _gateway_service(make_service, calc, spark)
    df = spark.range(0, 20, numPartitions=1)
    timed_out = call_service(df.limit(2), "calc", "slow", payload="id", errors="column",
                             timeout=0.3).collect()
    assert [(r.reply, r.status) for r in timed_out] == [(None, None), (None, None)]
    assert timed_out[0].error.startswith("RequestTimeout: ")
    # errors="fail": the first error fails the task
    with pytest.raises(Exception, match="409 1 is odd"):
        ServiceCaller("calc", "picky").apply(df, payload="id").collect()


@needs_spark
@first_job
def test_a_write_with_a_service_goes_through_the_gateway(
        spark: Any, make_service: Callable[..., Any], calc: Any) -> None:
    service = _gateway_service(make_service, calc, spark)
    data = spark.createDataFrame([(i, f"n{i}") for i in range(50)], "id long, name string")
    data.repartition(2).write.format("peermesh").option("service", "calc") \
        .option("action", "record").option("maxInFlight", "8").mode("append").save()
    assert sorted(v["id"] for v in calc.recorded) == list(range(50))
    assert service.stats.gateway_calls == 50
