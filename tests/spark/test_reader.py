"""The stream and batch readers' offset logic, called directly (pyspark imported, no session).

Spark calls these methods in its Python workers; here the test plays Spark:
initial offset, admission control, availableNow, partitions, commits, and
what happens when offsets a query needs are gone (``failOnDataLoss``).
"""

from __future__ import annotations

from typing import Any, Callable

import msgpack
import pytest

from .conftest import spark_unavailable

if spark_unavailable():
    pytest.skip(spark_unavailable(), allow_module_level=True)

from pyspark.sql.datasource import InputPartition  # noqa: E402
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows  # noqa: E402

from peermesh.spark.client import log_client  # noqa: E402
from peermesh.spark.protocol import DataLossError  # noqa: E402
from peermesh.spark.source import (SCHEMA, BatchReader, OffsetRange, SourceOptions,  # noqa: E402
                                   StreamReader, read_range, split_range)


def fill(service: Any, groups: list[str], count: int, start: int = 0) -> None:
    """Append messages straight to the service's log (round-robin over ``groups``)."""
    from peermesh.spark.log import MessageLog

    with MessageLog(service.path) as log:
        log.append([(groups[i % len(groups)], "ab" * 16, "p", 1.0 + i,
                     msgpack.packb({"i": start + i})) for i in range(count)])


def reader(service: Any, batch: bool = False, **options: str) -> Any:
    given = {"endpoint": service.endpoint, "token": service.token, "group": "g", **options}
    opts = SourceOptions.parse({k.lower(): v for k, v in given.items()}, batch)  # as Spark does
    return (BatchReader if batch else StreamReader)(opts, SCHEMA)


def rows(opts_reader: Any, part: OffsetRange) -> list[int]:
    return [o for b in read_range(opts_reader.opts, SCHEMA, part)
            for o in b.column("offset").to_pylist()]


def test_offsets_admission_and_commits(make_service: Callable[..., Any]) -> None:
    service = make_service(["g", "h"], channel=False)
    fill(service, ["g", "h"], 100)
    stream = reader(service, startingOffsets="earliest", maxOffsetsPerTrigger="10",
                    partitions="3")
    start = stream.initialOffset()
    assert start["offset"] == 0 and start["log"] == service.log_id
    assert stream.getDefaultReadLimit() == ReadMaxRows(10)
    end = stream.latestOffset(start, ReadMaxRows(10))
    assert end["offset"] == 19  # ten messages of "g": offsets 0, 2, ... 18
    assert end["consumer"] == start["consumer"]
    parts = stream.partitions(start, end)
    assert [(p.start, p.end) for p in parts] == [(0, 7), (7, 14), (14, 19)]
    assert [o for p in parts for o in rows(stream, p)] == list(range(0, 19, 2))
    assert stream.latestOffset(end, ReadAllAvailable())["offset"] == 99
    stream.commit(end)
    assert stream.committed(10)  # told from a thread of the planner's process
    consumers = service.consumers()
    assert [(c.id, c.committed) for c in consumers] == [(start["consumer"], 19)]
    # "g" is one chunk (0-98) that straddles 19: kept whole; "h" is not this query's to trim
    assert service.bounds(["g"]) == (0, 100) and service.bounds(["h"]) == (0, 100)
    assert stream.partitions(end, end) == []

    # startingOffsets latest; availableNow fixes a target that later data does not move
    late = reader(service)
    first = late.initialOffset()
    assert first["offset"] == 100
    assert late.latestOffset(first, ReadAllAvailable()) == first  # nothing new: same offset
    late.prepareForTriggerAvailableNow()
    fill(service, ["g"], 5, start=100)
    assert late.latestOffset(first, ReadAllAvailable())["offset"] == 100
    assert reader(service).latestOffset(first, ReadAllAvailable())["offset"] == 105


def test_fail_on_data_loss(make_service: Callable[..., Any]) -> None:
    service = make_service(["g"], channel=False)
    fill(service, ["g"], 50)
    stream = reader(service, startingOffsets="earliest")
    start = stream.initialOffset()
    end = stream.latestOffset(start, ReadAllAvailable())
    assert end["offset"] == 50
    service.trim(30)  # e.g. retention, or a consumer that was forgotten
    with pytest.raises(DataLossError, match="offsets 0-29 of group .g. were trimmed.*failOnDataLoss"):
        stream.latestOffset(start, ReadAllAvailable())
    with pytest.raises(DataLossError, match="trimmed"):
        rows(stream, stream.partitions(start, end)[0])
    lenient = reader(service, startingOffsets="earliest", failOnDataLoss="false")
    assert lenient.latestOffset(start, ReadAllAvailable())["offset"] == 50
    assert rows(lenient, lenient.partitions(start, end)[0]) == list(range(30, 50))

    # a log that is not the one the offsets came from (its file was deleted)
    other = make_service(["g"], channel=False)
    moved = reader(other, startingOffsets="earliest")
    with pytest.raises(DataLossError, match="belong to log"):
        moved.latestOffset(start, ReadAllAvailable())
    with pytest.raises(DataLossError, match="now serves log"):
        rows(moved, OffsetRange(service.log_id, 30, 50))

    # batch reads: an explicit start below what the log holds
    with pytest.raises(DataLossError, match="below the earliest"):
        reader(service, batch=True, startingOffsets="5").partitions()
    parts = reader(service, batch=True, startingOffsets="5", failOnDataLoss="false").partitions()
    assert parts[0].start == 5


def test_split_range() -> None:
    assert [(p.start, p.end) for p in split_range("x", 0, 10, 3)] == [(0, 4), (4, 8), (8, 10)]
    assert [(p.start, p.end) for p in split_range("x", 5, 7, 8)] == [(5, 6), (6, 7)]
    assert split_range("x", 5, 5, 2) == []


@pytest.mark.parametrize("options, message", [
    ({"group": "g"}, "endpoint"),
    ({"endpoint": "tcp://127.0.0.1:1"}, "group"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "partitions": "0"}, "partitions"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "maxoffsetspertrigger": "x"},
     "maxOffsetsPerTrigger must be an integer"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "maxoffsetspertrigger": "0"},
     "maxOffsetsPerTrigger must be at least 1"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "startingoffsets": "erliest"},
     "startingOffsets must be earliest, latest or an offset"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "startingoffsets": "-3"},
     "startingOffsets must be earliest"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "endingoffsets": "5"},
     "endingOffsets does not apply to a stream"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "service": "s"},
     "service does not apply to a stream"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "decode": "xml"}, "decode"),
    ({"endpoint": "tcp://127.0.0.1:1", "group": "g", "failondataloss": "maybe"}, "boolean"),
])
def test_bad_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(options, batch=False)


@pytest.mark.parametrize("options, message", [
    ({"maxOffsetPerTrigger": "10"}, "unknown option 'maxoffsetpertrigger'.*did you mean "
                                    "maxOffsetsPerTrigger"),
    ({"startingOffset": "earliest"}, "did you mean startingOffsets"),
    ({"colour": "red"}, "unknown option 'colour'"),
    ({"partitions": "0"}, "partitions must be at least 1"),
    ({"failondataloss": "maybe"}, "failOnDataLoss must be a boolean"),
    ({"decode": "xml"}, "decode must be one of"),
    ({"port": "70000"}, "port must be a UDP port"),
    ({"discoverytimeout": "-1"}, "discoveryTimeout must be a positive number"),
])
def test_every_option_is_known_and_checked_when_the_source_is_made(
        options: dict[str, str], message: str) -> None:
    from peermesh.spark.source import PeermeshDataSource

    with pytest.raises(ValueError, match=message):
        PeermeshDataSource({"group": "g", **options})


def test_options_that_apply_elsewhere_are_refused() -> None:
    from peermesh.spark.source import WriteOptions

    given = {"endpoint": "tcp://127.0.0.1:1", "group": "g"}
    with pytest.raises(ValueError, match="maxOffsetsPerTrigger does not apply to a batch read"):
        SourceOptions.parse({**given, "maxoffsetspertrigger": "5"}, batch=True)
    with pytest.raises(ValueError, match="startingOffsets does not apply to a write"):
        WriteOptions.parse({**given, "startingoffsets": "earliest"})
    with pytest.raises(ValueError, match="peers does not apply to a batch read"):
        SourceOptions.parse({**given, "peers": "2"}, batch=True)


def test_kafka_offsets_minus_two_is_earliest_and_minus_one_latest(
        make_service: Callable[..., Any]) -> None:
    service = make_service(["g"])
    fill(service, ["g"], 10)
    earliest = reader(service, batch=True, startingOffsets="-2").partitions()
    assert [(p.start, p.end) for p in earliest] == [(0, 10)]
    latest = reader(service, batch=True, endingOffsets="-1").partitions()
    assert [(p.start, p.end) for p in latest] == [(0, 10)]
    stream = reader(service, startingOffsets="-2")
    assert stream.initialOffset()["offset"] == 0
    assert reader(service, startingOffsets="-1").initialOffset()["offset"] == 10


def test_an_empty_plan_reads_no_rows(make_service: Callable[..., Any]) -> None:
    service = make_service(["g"])
    batch = reader(service, batch=True)
    assert batch.partitions() == []
    assert list(batch.read(InputPartition(None))) == []  # PySpark's stand-in for an empty plan
    assert list(batch.read(None)) == []


def test_a_batch_read_never_joins_a_group_a_stream_does(
        make_service: Callable[..., Any]) -> None:
    service = make_service(["g"])
    given = {"endpoint": service.endpoint, "token": service.token, "group": "elsewhere"}
    BatchReader(SourceOptions.parse(given, True), SCHEMA).partitions()
    assert "elsewhere" not in service.node.call(lambda node: node.groups())
    StreamReader(SourceOptions.parse(given, False), SCHEMA).initialOffset()
    assert "elsewhere" in service.node.call(lambda node: node.groups())


def test_per_group_starts_by_offset_and_by_time(make_service: Callable[..., Any]) -> None:
    service = make_service(["g", "h"], channel=False)
    fill(service, ["g", "h"], 100)  # g: even offsets, h: odd; received 1.0 + offset
    both = {"group": "g,h", "partitions": "2"}
    batch = reader(service, batch=True, startingOffsets='{"h": 90}', **both)
    parts = batch.partitions()
    got = sorted(o for p in parts for o in rows(batch, p))
    assert got == sorted(list(range(0, 100, 2)) + [91, 93, 95, 97, 99])
    by_time = reader(service, batch=True, startingOffsetsByTimestamp='{"g": 50000}',
                     startingOffsets='{"h": 100}', **both)
    assert sorted(o for p in by_time.partitions() for o in rows(by_time, p)) == \
        list(range(50, 100, 2))
    everything_since = reader(service, batch=True, startingTimestamp="96000", **both)
    assert sorted(o for p in everything_since.partitions()
                  for o in rows(everything_since, p)) == [95, 96, 97, 98, 99]
    stream = reader(service, startingOffsets='{"g": "earliest", "h": 97}', **both)
    start = stream.initialOffset()
    assert start["offset"] == 0 and start["floors"] == {"h": 97}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert "floors" not in end  # past every floor: plain offsets again
    assert sorted(o for p in stream.partitions(start, end) for o in rows(stream, p)) == \
        sorted(list(range(0, 100, 2)) + [97, 99])
    with pytest.raises(ValueError, match="names group.*x.*that the read does not include"):
        reader(service, batch=True, startingOffsets='{"x": 1}', **both)
    # startingTimestamp holds for the groups startingOffsetsByTimestamp leaves out (420
    # rows instead of 20: it was ignored for them)
    combined = reader(service, batch=True, startingTimestamp="96000",
                      startingOffsetsByTimestamp='{"g": 90000}', **both)
    assert sorted(o for p in combined.partitions() for o in rows(combined, p)) == \
        [90, 92, 94, 95, 96, 97, 98, 99]
    # a starting time after every message: an error, unless the strategy is latest
    with pytest.raises(ValueError, match="no message received at or after.*Strategy"):
        reader(service, batch=True, startingTimestamp="200000", **both).partitions()
    late = reader(service, batch=True, startingTimestamp="200000",
                  startingOffsetsByTimestampStrategy="latest", **both)
    assert late.partitions() == []


def test_a_named_consumer_keeps_its_name(make_service: Callable[..., Any]) -> None:
    service = make_service(["g"], channel=False)
    fill(service, ["g"], 10)
    stream = reader(service, startingOffsets="earliest", consumerName="nightly-report")
    start = stream.initialOffset()
    assert start["consumer"].startswith("nightly-report#")
    stream.commit(stream.latestOffset(start, ReadAllAvailable()))
    assert stream.committed(10)
    assert [(c.id, c.committed) for c in service.consumers()] == [(start["consumer"], 10)]


def test_two_queries_with_one_consumer_name_never_trim_for_each_other(
        make_service: Callable[..., Any]) -> None:
    # The slow one of two queries named alike failed after 20 rows with "offsets 100-179
    # were trimmed": the log kept the higher commit of the two.
    service = make_service(["g"], channel=False, trim=True)
    for start in range(0, 200, 20):
        fill(service, ["g"], 20, start=start)   # chunks of 20
    fast = reader(service, startingOffsets="earliest", consumerName="etl")
    slow = reader(service, startingOffsets="earliest", consumerName="etl",
                  maxOffsetsPerTrigger="20")
    fast_start, slow_start = fast.initialOffset(), slow.initialOffset()
    assert fast_start["consumer"] != slow_start["consumer"]
    fast_end = fast.latestOffset(fast_start, ReadAllAvailable())
    slow_end = slow.latestOffset(slow_start, ReadMaxRows(20))
    assert (fast_end["offset"], slow_end["offset"]) == (200, 20)
    fast.commit(fast_end)
    slow.commit(slow_end)
    assert fast.committed(10) and slow.committed(10)
    assert service.bounds(["g"])[0] == 20  # what both have read, no more
    following = slow.latestOffset(slow_end, ReadMaxRows(20))
    assert rows(slow, slow.partitions(slow_end, following)[0]) == list(range(20, 40))
    assert service.forget_consumer("etl") and service.consumers() == []


def test_a_read_of_several_groups_after_one_was_trimmed(
        make_service: Callable[..., Any]) -> None:
    # After a stream on A trimmed A, a read of A and B raised DataLossError though all of
    # B was there (with failOnDataLoss=false: 10 rows of 60); the stream's latestOffset too.
    service = make_service(["A", "B"], channel=False, trim=True)
    for start in range(0, 60, 20):
        fill(service, ["A"], 10, start=start)
        fill(service, ["B"], 10, start=start + 10)
    on_a = reader(service, startingOffsets="earliest", group="A")
    begin = on_a.initialOffset()
    on_a.commit(on_a.latestOffset(begin, ReadAllAvailable()))
    on_a.stop()  # waits for the commit
    assert service.bounds(["A"])[0] == 50 and service.bounds(["B"])[0] == 0
    both = reader(service, batch=True, group="A,B")
    got = [o for p in both.partitions() for o in rows(both, p)]
    assert sorted(got) == [o for s in range(0, 60, 20) for o in range(s + 10, s + 20)]
    stream = reader(service, startingOffsets="earliest", group="A,B")
    start = stream.initialOffset()
    assert start["offset"] == 0 and start["floors"] == {"A": 50}
    end = stream.latestOffset(start, ReadAllAvailable())
    assert len([o for p in stream.partitions(start, end) for o in rows(stream, p)]) == 30
    # a query that had not read A when it went: the loss is A's, named
    with pytest.raises(DataLossError, match="offsets 0-49 of group 'A' were trimmed"):
        stream.latestOffset({**start, "floors": {}}, ReadAllAvailable())
    # a trim that cuts inside B's chunk 10-19 hides what is below the cut
    service.trim(15, ["B"])
    assert sorted(o for p in both.partitions() for o in rows(both, p))[:5] == \
        [15, 16, 17, 18, 19]


def test_a_driver_restarted_on_another_host_resumes_from_the_checkpoint(
        make_service: Callable[..., Any], tmp_path: Any) -> None:
    # The log lived on the driver's local disk: a driver restarted elsewhere found no log
    # and the query failed with data loss. Its place is the user's choice: here a volume
    # that moves to the new host (copied while no driver runs), the new driver listening
    # at another address.
    import shutil

    first = make_service(["g"], channel=False, directory=tmp_path / "volume")
    fill(first, ["g"], 50)
    stream = reader(first, startingOffsets="earliest")
    start = stream.initialOffset()
    checkpointed = stream.latestOffset(start, ReadAllAvailable())  # what Spark keeps
    stream.commit(checkpointed)
    assert stream.committed(10)
    first.stop()
    shutil.copytree(tmp_path / "volume", tmp_path / "elsewhere")
    second = make_service(["g"], channel=False, directory=tmp_path / "elsewhere",
                          bind="127.0.0.2")
    assert second.endpoint.startswith("tcp://127.0.0.2:") and second.log_id == first.log_id
    fill(second, ["g"], 10, start=50)
    resumed = reader(second, startingOffsets="earliest")
    end = resumed.latestOffset(checkpointed, ReadAllAvailable())
    assert end["offset"] == 60 and end["consumer"] == start["consumer"]
    got = [msgpack.unpackb(r[5])["i"] for p in resumed.partitions(checkpointed, end)
           for r in _rows_of(resumed, p)]
    assert got == list(range(50, 60))
    assert [c.id for c in second.consumers()] == [start["consumer"]]


def _rows_of(opts_reader: Any, part: OffsetRange) -> list[tuple]:
    """``(offset, group, sender, sender_name, received, payload)`` of ``part``."""
    return [tuple(r) for b in read_range(opts_reader.opts, SCHEMA, part)
            for r in zip(*(b.column(n).to_pylist() for n in
                           ("offset", "group", "sender", "sender_name", "received", "payload")))]


def test_kafka_checks_of_trigger_and_batch_options(make_service: Callable[..., Any]) -> None:
    service = make_service(["g"], channel=False)
    with pytest.raises(ValueError, match="minOffsetsPerTrigger .20. must not be greater"):
        reader(service, minOffsetsPerTrigger="20", maxOffsetsPerTrigger="10")
    with pytest.raises(ValueError, match="startingOffsets: latest .* not valid for a batch"):
        reader(service, batch=True, startingOffsets="latest")
    with pytest.raises(ValueError, match="startingOffsets: latest"):
        reader(service, batch=True, startingOffsets='{"g": -1}')
    with pytest.raises(ValueError, match="endingOffsets: earliest"):
        reader(service, batch=True, endingOffsets="-2")
    # maxTriggerDelay as Kafka's source reads it: a bare number is milliseconds
    assert reader(service, maxTriggerDelay="1500").opts.max_trigger_delay == 1.5
    assert reader(service, maxTriggerDelay="2min").opts.max_trigger_delay == 120.0
    with pytest.raises(ValueError, match="maxTriggerDelay must be a positive duration"):
        reader(service, maxTriggerDelay="15 parsecs")


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(
        make_service: Callable[..., Any]) -> None:
    service = make_service(["g"], channel=False)
    fill(service, ["g"], 5)
    stream = reader(service, startingOffsets="earliest", minOffsetsPerTrigger="10",
                    maxTriggerDelay="1h")
    start = stream.initialOffset()
    assert stream.latestOffset(start, ReadAllAvailable()) == start  # 5 < 10: wait
    fill(service, ["g"], 5, start=5)
    assert stream.latestOffset(start, ReadAllAvailable())["offset"] == 10
    fill(service, ["g"], 3, start=10)
    later = stream.latestOffset(_at(start, 10), ReadAllAvailable())
    assert later["offset"] == 10  # 3 < 10 again
    stream._last_batch -= 3601  # the planner's memory: an hour without a batch
    assert stream.latestOffset(_at(start, 10), ReadAllAvailable())["offset"] == 13


def _at(offset: dict, position: int) -> dict:
    return {**offset, "offset": position}


def test_progress_reports_how_far_behind_each_group_is(
        make_service: Callable[..., Any]) -> None:
    service = make_service(["g", "h"], channel=False)
    fill(service, ["g", "h"], 40)
    stream = reader(service, startingOffsets="earliest", group="g,h",
                    maxOffsetsPerTrigger="10")
    start = stream.initialOffset()
    end = stream.latestOffset(start, ReadMaxRows(10))
    assert end["offset"] == 10
    report = stream.reportLatestOffset()
    assert report is not None and report["offset"] == 40
    assert report["behind"] == {"g": 15, "h": 15}
    # the log's answer to latestOffset carries the backlog: the report asks nothing more
    client = log_client(service.endpoint, service.token)
    assert client.latest(["g", "h"], 10, 10)["behind"] == {"g": 10, "h": 10}
    end = stream.latestOffset(end, ReadAllAvailable())
    assert end["offset"] == 40 and stream.reportLatestOffset()["behind"] == {"g": 0, "h": 0}
    # an availableNow target below the log's end leaves what came after it behind
    stream.prepareForTriggerAvailableNow()
    fill(service, ["g"], 5, start=40)
    assert stream.latestOffset(end, ReadAllAvailable())["offset"] == 40
    assert stream.reportLatestOffset() == {**end, "offset": 45, "behind": {"g": 5, "h": 0}}


def test_sender_headers_as_a_column(make_service: Callable[..., Any]) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from peermesh.spark.log import MessageLog
    from peermesh.spark.source import HEADERS, PeermeshDataSource

    service = make_service(["g"], channel=False)
    with MessageLog(service.path) as log:
        log.append([("g", "ab" * 16, "p", 1.0, b"x", {"X-ROLE": "sensor"}),
                    ("g", "cd" * 16, "q", 2.0, b"y")])
    source = PeermeshDataSource({"group": "g", "includeHeaders": "true"})
    assert source.schema()["headers"] == HEADERS
    schema = StructType([*SCHEMA.fields, HEADERS])
    opts = SourceOptions.parse({"endpoint": service.endpoint, "token": service.token,
                                "group": "g", "includeheaders": "true"}, True)
    part = BatchReader(opts, schema).partitions()[0]
    batches = list(read_range(opts, schema, part))
    # Kafka's type: array<struct<key: string, value: binary>>
    assert str(HEADERS.dataType) == ("ArrayType(StructType([StructField('key', StringType(), "
                                     "True), StructField('value', BinaryType(), True)]), False)")
    assert [h for b in batches for h in b.column("headers").to_pylist()] == \
        [[{"key": "X-ROLE", "value": b"sensor"}], []]
    # any other schema (a field of the payload): row by row
    only = StructType([SCHEMA["offset"], HEADERS, StructField("x", LongType())])
    slow = [tuple(r) for r in read_range(opts, only, part)]
    assert [(r[0], r[1]) for r in slow] == [(0, [("X-ROLE", b"sensor")]), (1, [])]


def test_arrow_batches_agree_with_rows_made_one_by_one(
        make_service: Callable[..., Any]) -> None:
    from peermesh.spark.codec import STORED_TEXT_MAX
    from peermesh.spark.log import MessageLog
    from peermesh.spark.columns import _Columns

    service = make_service(["g", "h"], channel=False)
    payloads = [msgpack.packb({"i": 1, "s": "x"}), b"7", b"plain", b"\xff\xfe", b"",
                msgpack.packb([1.5, None]), b"y" * (STORED_TEXT_MAX + 1)]
    with MessageLog(service.path) as log:
        for texts in (True, False):  # made at ingest, and left to the reader
            # (with texts: two senders in a chunk; received to the microsecond)
            log.append([(("g", "h")[i % 2], ("ab", "cd")[texts and i % 3 == 0] * 16,
                         ("p", "q")[texts and i % 3 == 0], 10.0 + i / 3, p)
                        for i, p in enumerate(payloads * 3)], texts=texts)
        log.append([("g", "ab" * 16, "p", 1.0, p) for p in payloads[:4]])  # no text to make
    columns = SCHEMA.fieldNames()
    for decode in ("auto", "msgpack", "utf8", "none"):
        for groups, start, end in (("g", 0, 46), ("g,h", 3, 40), ("h", 5, 17)):
            opts = SourceOptions.parse({"endpoint": service.endpoint, "token": service.token,
                                        "group": groups, "decode": decode}, True)
            part = OffsetRange(service.log_id, start, end)
            got = [tuple(r.values()) for b in read_range(opts, SCHEMA, part)
                   for r in b.to_pylist()]
            with MessageLog(service.path) as log:
                rows = log.read(start, end, groups.split(","))
            slow = _Columns(SCHEMA, decode, merge=False).tuples(rows, {})
            expected = [tuple(r) for r in slow]
            assert got == expected, (decode, groups)
            assert len(got) == sum(1 for r in rows) and columns[-1] == "text"


def test_repeated_columns_are_kept_and_sliced() -> None:
    import pyarrow as pa

    from peermesh.spark.columns import _Columns

    columns = _Columns(SCHEMA, "auto", merge=False)
    for value in ("g", "", "capteur-été", "ab" * 16):
        for kind in (pa.string(), pa.binary()):
            expected = [value if kind == pa.string() else value.encode()]
            short = columns.repeat(value, kind, 3)
            long = columns.repeat(value, kind, 5)   # longer than the one kept: made again
            again = columns.repeat(value, kind, 2)  # a slice of the longest kept
            assert (short.to_pylist(), long.to_pylist(), again.to_pylist()) == \
                (expected * 3, expected * 5, expected * 2)
            assert again.buffers()[2].address == long.buffers()[2].address
            short.validate(full=True), long.validate(full=True)


def test_a_task_on_the_drivers_machine_reads_the_file_itself(
        make_service: Callable[..., Any]) -> None:
    from peermesh.spark.client import local_log, log_client

    service = make_service(["g"], channel=False)
    fill(service, ["g"], 30)
    info = log_client(service.endpoint, service.token).info(["g"])
    assert info["path"] == str(service.path)
    local = local_log(info["path"], info["host"], service.log_id)
    assert local is not None and local.fetch(0, 30, ["g"])["resume"] == 30
    assert local_log(info["path"], "another-host", service.log_id) is None
    assert local_log(info["path"], info["host"], "another-log") is None
    assert local_log(str(service.path) + ".gone", info["host"], service.log_id) is None
    assert not (service.path.parent / (service.path.name + ".gone")).exists()  # not made
    plan = reader(service, batch=True).partitions()
    assert [(p.path, p.host) for p in plan] == [(info["path"], info["host"])]
    served = OffsetRange(service.log_id, 0, 30)  # no path: through the service
    assert rows(reader(service), plan[0]) == rows(reader(service), served) == list(range(30))


def test_commits_reach_the_log_in_order_from_a_thread(make_service: Callable[..., Any]) -> None:
    import pickle

    service = make_service(["g"], channel=False)
    fill(service, ["g"], 50)
    stream = reader(service, startingOffsets="earliest")
    start = stream.initialOffset()
    stream.latestOffset(start, ReadAllAvailable())  # registers the query as a consumer
    for offset in range(1, 51):
        stream.commit({**start, "offset": offset})
    assert stream.committed(30)
    assert [(c.id, c.committed) for c in service.consumers()] == [(start["consumer"], 50)]
    copy = pickle.loads(pickle.dumps(stream))  # a reader Spark ships has no thread of ours
    assert copy.committed(0) and copy.latestOffset(start, ReadAllAvailable())["offset"] == 50
