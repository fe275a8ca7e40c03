"""Safir-Darbaan requests from Spark executors: ``ServiceCaller`` and ``write`` with a service.

A ``ThreadedServer`` on a loopback node offers ``calc`` 1.0; the executors'
Python workers open their own mesh node and channel, which the server finds
through the mesh and connects to (``calc`` is in conftest.py).
"""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

pytestmark = pytest.mark.slow

sada = pytest.importorskip("peermesh.sada", reason="Safir-Darbaan (peermesh.sada) is missing")


@pytest.mark.timeout(300)   # the first test of the directory: it starts the Spark session
def test_service_caller_replies_as_columns(spark: Any, make_service: Callable[..., Any],
                                           calc: Any) -> None:
    from peermesh.spark import ServiceCaller, call_service

    make_service(["unused"], spark)  # the mesh settings executors use come from here
    df = spark.range(0, 400, numPartitions=2)
    out = ServiceCaller("calc", "double", max_in_flight=16,
                        discovery_timeout=20).apply(df, payload="id",
                                                    reply_schema="value long, kind string")
    assert out.columns == ["id", "value", "kind"]
    rows = out.collect()
    assert len(rows) == 400
    assert all(r.value == 2 * r.id and r.kind == "doubled" for r in rows)

    # errors as columns: one row per request, failures say why
    picky = call_service(df.limit(10), "calc", "picky", payload="id", errors="column",
                         reply_schema="value long").orderBy("id").collect()
    assert [(r.id, r.value, r.status) for r in picky] == [
        (i, None if i % 2 else i, 409 if i % 2 else 200) for i in range(10)]
    assert picky[1].error == "409 1 is odd" and picky[0].error is None

    # without a reply schema the reply is one JSON column
    reply = call_service(df.limit(3), "calc", "double", payload="id").orderBy("id").collect()
    expected = [{"value": 2 * i, "kind": "doubled"} for i in range(3)]
    assert [json.loads(r.reply) for r in reply] == expected

    # errors="fail" (the default): the first error status fails the Spark task
    with pytest.raises(Exception, match="409"):
        ServiceCaller("calc", "picky").apply(df, payload="id").collect()
    # a map payload ({"id": ...}) cannot be doubled: the handler's error is a 500
    with pytest.raises(Exception, match="500"):
        call_service(df.limit(3), "calc", "double", payload=["id"]).collect()


def test_write_sends_rows_as_requests(spark: Any, make_service: Callable[..., Any],
                                      calc: Any) -> None:
    make_service(["unused"], spark)
    df = spark.createDataFrame([(i, f"n{i}") for i in range(50)], "id long, name string")
    df.repartition(2).write.format("peermesh").option("service", "calc") \
        .option("action", "record").option("maxInFlight", "8").mode("append").save()
    assert sorted(v["id"] for v in calc.recorded) == list(range(50))
    assert {v["name"] for v in calc.recorded} == {f"n{i}" for i in range(50)}

    bad = spark.createDataFrame([(1, "ok"), (-1, "refused")], "id long, name string")
    with pytest.raises(Exception, match="422"):
        bad.write.format("peermesh").option("service", "calc").option("action", "record") \
            .mode("append").save()


def test_call_many_inside_map_in_pandas(spark: Any, make_service: Callable[..., Any],
                                        calc: Any) -> None:
    from peermesh.spark import ServiceCaller

    make_service(["unused"], spark)
    caller = ServiceCaller("calc", "double", max_in_flight=8)

    def enrich(frames: Any) -> Any:
        for frame in frames:
            outcomes = caller.call_many(frame["id"].tolist())
            frame["doubled"] = [o.value["value"] for o in outcomes]
            yield frame

    rows = spark.range(0, 30, numPartitions=2).mapInPandas(enrich, "id long, doubled long") \
        .collect()
    assert sorted((r.id, r.doubled) for r in rows) == [(i, 2 * i) for i in range(30)]


def test_mesh_servers_connect_to_the_driver_channel(make_service: Callable[..., Any],
                                                    calc: Any) -> None:
    service = make_service(["unused"])
    assert service.channel is not None
    assert service.channel.wait_for("calc", timeout=10)
    assert service.channel.request("calc", "double", 21) == {"value": 42, "kind": "doubled"}
    info = service.node.call(lambda node: node.headers)
    assert info[sada.HEADER_CHANNEL] == service.channel.endpoint
