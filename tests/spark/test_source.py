"""The ``peermesh`` data source on a real local Spark session, with real mesh peers.

Every test starts its own driver-side service (a fresh log and beacon port)
and registers the source with it; peers are ``ThreadedNode``s on loopback.
Streaming tests use Spark's parquet file sink, which is exactly-once, so
what it holds is what the source delivered. Every wait is bounded:
``processAllAvailable`` on a running query, ``awaitTermination(timeout)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import msgpack
import pytest

from .conftest import meet, shout_all, wait_until

pytestmark = pytest.mark.slow


def offsets_in(spark: Any, path: Path) -> list[int]:
    return sorted(r.offset for r in spark.read.parquet(str(path)).select("offset").collect())


def parquet_query(spark: Any, group: str, out: Path, checkpoint: Path, **options: str) -> Any:
    reader = spark.readStream.format("peermesh").option("group", group)
    for key, value in options.items():
        reader = reader.option(key, value)
    return (reader.load().writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(checkpoint)).start())


def test_streaming_read_over_micro_batches(spark: Any, make_service: Callable[..., Any],
                                           make_peer: Callable[..., Any],
                                           tmp_path: Path) -> None:
    service = make_service(["tele"], spark)
    alice, bob = make_peer("alice"), make_peer("bob")
    for peer in (alice, bob):
        meet(peer, "tele")
    out = tmp_path / "out"
    query = parquet_query(spark, "tele", out, tmp_path / "ck", startingOffsets="earliest",
                          maxOffsetsPerTrigger="70", partitions="2")
    try:
        total = 0
        for round_ in range(3):
            shout_all(alice, "tele", [{"host": "alice", "seq": round_ * 50 + i, "temp": 20.5}
                                      for i in range(50)])
            shout_all(bob, "tele", [{"host": "bob", "seq": round_ * 50 + i} for i in range(50)])
            total += 100
            assert service.wait_for_offset(total, 10)
            query.processAllAvailable()
        progress = [p for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert len(progress) >= 5  # 300 messages, at most 70 per micro-batch
    assert all(p["numInputRows"] <= 70 for p in progress)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.offset for r in rows) == list(range(300))  # no gap, no duplicate
    by_host: dict[str, list[int]] = {}
    for row in sorted(rows, key=lambda r: r.offset):
        value = json.loads(row.text)
        assert msgpack.unpackb(row.payload) == value
        assert row.group == "tele"
        assert row.sender_name == value["host"]
        assert row.sender == (alice if value["host"] == "alice" else bob).uuid.hex
        by_host.setdefault(value["host"], []).append(value["seq"])
    assert by_host == {"alice": list(range(150)), "bob": list(range(150))}  # in order


def test_restart_from_checkpoint_is_exactly_once(spark: Any, make_service: Callable[..., Any],
                                                 make_peer: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    service = make_service(["tele"], spark)
    peer = make_peer("p")
    meet(peer, "tele")
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    shout_all(peer, "tele", list(range(100)))
    assert service.wait_for_offset(100, 10)
    query = parquet_query(spark, "tele", out, checkpoint, startingOffsets="earliest",
                          maxOffsetsPerTrigger="40")
    query.processAllAvailable()
    query.stop()
    assert offsets_in(spark, out) == list(range(100))

    # While the query is down: more messages, and its last batch loses its commit
    # (as if the driver died between the sink and the commit log): Spark replays that
    # batch from its checkpointed offsets, which the log must still hold.
    shout_all(peer, "tele", list(range(100, 250)))
    assert service.wait_for_offset(250, 10)
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name)
                     if p.name.isdigit() else -1)
    commits[-1].unlink()
    crc = commits[-1].with_name(f".{commits[-1].name}.crc")
    if crc.exists():
        crc.unlink()
    consumers = service.consumers()
    assert len(consumers) == 1 and 0 < consumers[0].committed < 100
    # commits trim whole chunks below the committed offset: what a replay needs stays
    assert service.bounds(["tele"])[0] <= consumers[0].committed

    query = parquet_query(spark, "tele", out, checkpoint, startingOffsets="earliest",
                          maxOffsetsPerTrigger="40")
    try:
        query.processAllAvailable()
        shout_all(peer, "tele", list(range(250, 300)))
        assert service.wait_for_offset(300, 10)
        query.processAllAvailable()
    finally:
        query.stop()
    assert offsets_in(spark, out) == list(range(300))
    values = sorted(msgpack.unpackb(r.payload) for r in
                    spark.read.parquet(str(out)).select("payload").collect())
    assert values == list(range(300))
    assert [c.id for c in service.consumers()] == [consumers[0].id]  # the same query


def test_available_now_with_a_read_limit(spark: Any, make_service: Callable[..., Any],
                                         make_peer: Callable[..., Any]) -> None:
    service = make_service(["tele"], spark)
    peer = make_peer("p")
    meet(peer, "tele")
    shout_all(peer, "tele", [{"i": i} for i in range(100)])
    assert service.wait_for_offset(100, 10)
    query = (spark.readStream.format("peermesh").option("group", "tele")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "30")
             .load().writeStream.format("memory").queryName("available_now")
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(90), "the availableNow query did not finish"
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert batches == [30, 30, 30, 10]
    got = sorted(r.offset for r in spark.sql("SELECT offset FROM available_now").collect())
    assert got == list(range(100))


def test_batch_read(spark: Any, make_service: Callable[..., Any],
                    make_peer: Callable[..., Any]) -> None:
    service = make_service(["a", "b"], spark)
    peer = make_peer("p")
    meet(peer, "a")
    meet(peer, "b")
    for i in range(60):
        shout_all(peer, "a" if i % 3 else "b", [{"seq": i, "temp": 20 + i, "unit": "C"}]) \
            if i % 20 == 0 else peer.shout_packed("a" if i % 3 else "b",
                                                  {"seq": i, "temp": 20 + i, "unit": "C"})
    assert peer.call(lambda node: node.flush(5.0))
    assert service.wait_for_offset(60, 10)

    both = (spark.read.format("peermesh").option("group", "a,b").option("partitions", "3")
            .load())
    assert both.rdd.getNumPartitions() == 3
    rows = both.collect()
    assert [r.offset for r in rows] == list(range(60))  # merged in offset order
    assert [json.loads(r.text)["seq"] for r in rows] == list(range(60))

    only_b = (spark.read.format("peermesh").option("group", "b")
              .option("startingOffsets", "10").option("endingOffsets", "40").load())
    assert [r.offset for r in only_b.collect()] == [i for i in range(10, 40) if i % 3 == 0]

    # a user schema: metadata columns by name, the others from the decoded payload
    typed = (spark.read.format("peermesh").schema(
        "offset long, seq int, temp double, unit string, missing string, sender_name string")
        .option("group", "a").load())
    first = typed.orderBy("offset").first()
    assert first.asDict() == {"offset": 1, "seq": 1, "temp": 21.0, "unit": "C",
                              "missing": None, "sender_name": "p"}
    assert typed.where("temp > 70").count() == len([i for i in range(51, 60) if i % 3])


def test_batch_and_streaming_write_reach_a_mesh_peer(
        spark: Any, make_service: Callable[..., Any], make_peer: Callable[..., Any],
        tmp_path: Path) -> None:
    service = make_service(["in"], spark)
    listener = make_peer("listener", groups=["out"])
    feeder = make_peer("feeder")
    meet(feeder, "in")

    received: list[Any] = []

    def collect(count: int) -> list[Any]:
        def more() -> bool:
            while (event := listener.recv(0)) is not None:
                if event.type.value == "SHOUT" and event.group == "out":
                    received.append(event)
            return len(received) >= count
        wait_until(more, 30, f"{count} shouts in 'out'")
        return received

    df = spark.createDataFrame([(i, f"row {i}", float(i) / 2) for i in range(40)],
                               "id long, label string, value double").repartition(2)
    df.write.format("peermesh").option("group", "out").mode("append").save()
    got = collect(40)
    rows = sorted((e.unpack() for e in got), key=lambda v: v["id"])
    assert rows == [{"id": i, "label": f"row {i}", "value": i / 2} for i in range(40)]
    assert len({e.peer for e in got}) >= 1  # sent by the executors' own nodes
    assert service.node.uuid not in {e.peer for e in got}

    # one column as the message itself
    spark.createDataFrame([("raw-a",), ("raw-b",)], "msg string").write.format("peermesh") \
        .option("group", "out").option("column", "msg").mode("append").save()
    assert sorted(e.message for e in collect(42)[40:]) == [b"raw-a", b"raw-b"]

    # streaming: what arrives in "in" is transformed and shouted to "out"
    query = (spark.readStream.format("peermesh").option("group", "in")
             .option("startingOffsets", "earliest").load()
             .selectExpr("offset", "upper(text) AS text")
             .writeStream.format("peermesh").option("group", "out")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        shout_all(feeder, "in", [f"msg {i}" for i in range(25)])
        assert service.wait_for_offset(25, 10)
        query.processAllAvailable()
    finally:
        query.stop()
    streamed = sorted((e.unpack() for e in collect(67)[42:]), key=lambda v: v["offset"])
    assert streamed == [{"offset": i, "text": f'"MSG {i}"'} for i in range(25)]


def test_write_fails_the_job_when_nobody_listens(spark: Any,
                                                 make_service: Callable[..., Any]) -> None:
    make_service(["x"], spark)
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(Exception, match="nobody|fewer than"):
        (df.write.format("peermesh").option("group", "nobody-here")
         .option("discoveryTimeout", "1").mode("append").save())


def test_options_are_checked(spark: Any, make_service: Callable[..., Any]) -> None:
    make_service(["x"], spark)
    with pytest.raises(Exception, match="group"):
        spark.read.format("peermesh").load().collect()
    with pytest.raises(Exception, match="startingOffsets"):
        (spark.read.format("peermesh").option("group", "x")
         .option("startingOffsets", "soon").load().collect())
    with pytest.raises(Exception, match="exactly one of"):
        spark.createDataFrame([(1,)], "id long").write.format("peermesh") \
            .mode("append").save()


def test_a_batch_read_of_an_empty_log_has_no_rows(spark: Any,
                                                  make_service: Callable[..., Any]) -> None:
    service = make_service(["quiet"], spark)
    assert spark.read.format("peermesh").option("group", "quiet").load().count() == 0
    assert spark.read.format("peermesh").option("group", "never-logged").load().count() == 0
    assert "never-logged" not in service.node.call(lambda node: node.groups())


@pytest.mark.parametrize("key, value, message", [
    ("maxOffsetsPerTrigger", "abc", "maxOffsetsPerTrigger must be an integer"),
    ("maxOffsetsPerTrigger", "0", "maxOffsetsPerTrigger must be at least 1"),
    ("partitions", "0", "partitions must be at least 1"),
    ("failOnDataLoss", "maybe", "failOnDataLoss must be a boolean"),
    ("startingOffsets", "erliest", "startingOffsets must be earliest, latest or an offset"),
    ("decode", "xml", "decode must be one of"),
    ("maxOffsetPerTrigger", "5", "unknown option 'maxoffsetpertrigger'.*did you mean"),
])
def test_bad_stream_options_fail_at_load_with_their_own_message(
        spark: Any, make_service: Callable[..., Any], key: str, value: str,
        message: str) -> None:
    make_service(["x"], spark)
    with pytest.raises(Exception, match=message):
        spark.readStream.format("peermesh").option("group", "x").option(key, value).load()


def test_options_that_do_not_apply_are_refused(spark: Any,
                                               make_service: Callable[..., Any],
                                               tmp_path: Path) -> None:
    make_service(["x"], spark)
    df = spark.createDataFrame([(1,)], "id long")
    with pytest.raises(Exception, match="only appends"):
        df.write.format("peermesh").option("group", "x").mode("overwrite").save()
    with pytest.raises(Exception, match="endingOffsets does not apply to a stream"):
        parquet_query(spark, "x", tmp_path / "out", tmp_path / "ck",
                      endingOffsets="5").awaitTermination(20)


def test_kafka_style_options_end_to_end(spark: Any, make_service: Callable[..., Any],
                                        make_peer: Callable[..., Any]) -> None:
    """A 'group' column routes each row (Kafka's 'topic'); includeHeaders adds the
    sender's HELLO headers; startingOffsets per group as JSON."""
    service = make_service(["tele", "logs"], spark)
    alice = make_peer("alice", groups=["a"])
    bob = make_peer("bob", groups=["b"])
    sensor = make_peer("sensor", headers={"X-SITE": "lab-3"})
    meet(sensor, "tele")

    def collect(peer: Any, group: str, count: int) -> list[Any]:
        got: list[Any] = []

        def more() -> bool:
            while (event := peer.recv(0)) is not None:
                if event.type.value == "SHOUT" and event.group == group:
                    got.append(event.unpack())
            return len(got) >= count
        wait_until(more, 30, f"{count} shouts in {group!r}")
        return got

    rows = [("a" if i % 3 else "b", i) for i in range(30)]
    spark.createDataFrame(rows, "group string, n long").repartition(2) \
        .write.format("peermesh").mode("append").save()
    assert sorted(v["n"] for v in collect(alice, "a", 20)) == [i for i in range(30) if i % 3]
    assert sorted(v["n"] for v in collect(bob, "b", 10)) == [i for i in range(30) if not i % 3]

    shout_all(sensor, "tele", [{"t": i} for i in range(5)])
    shout_all(sensor, "logs", [{"l": i} for i in range(5)])
    assert service.wait_for_offset(10, 10)
    read = (spark.read.format("peermesh").option("group", "tele,logs")
            .option("includeHeaders", "true")
            .option("startingOffsets", '{"tele": "earliest", "logs": 8}').load())
    got = sorted((r.group, r.offset, {h.key: h.value.decode() for h in r.headers})
                 for r in read.collect())
    assert [g for g, _, _ in got] == ["logs", "logs"] + ["tele"] * 5
    assert all(h.get("X-SITE") == "lab-3" for _, _, h in got)
