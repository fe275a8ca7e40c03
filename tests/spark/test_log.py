"""``MessageLog`` (SQLite, chunks) and the ``PMLOG1`` codec: no Spark, no sockets."""

from __future__ import annotations

from array import array
from pathlib import Path

import msgpack
import pytest

from sqlitefiles import journal_mode
from peermesh.errors import ProtocolError
from peermesh.spark import protocol
from peermesh.spark.codec import STORED_TEXT_MAX, TEXT_LATER, TEXT_NULL, TEXT_STORED
from peermesh.spark.log import Chunk, MessageLog, decode_chunk, encode_chunk, rows_of
from peermesh.spark.protocol import DataLossError, LogServiceError, Op, Reply, Request

SENDER = "ab" * 16


def records(count: int, group: str = "g", start: int = 0) -> list[tuple]:
    return [(group, SENDER, "p1", 1000.0 + i, msgpack.packb({"i": start + i}))
            for i in range(count)]


def test_offsets_grow_across_appends_and_reopening(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    with MessageLog(path) as log:
        assert log.bounds() == (0, 0)
        assert log.append(records(3)) == (0, 3)
        assert log.append([]) == (3, 3)
        assert log.append(records(2, start=3)) == (3, 5)
        log_id = log.log_id
    with MessageLog(path) as log:  # durable: same id, offsets go on
        assert log.log_id == log_id
        assert log.append(records(1, start=5)) == (5, 6)
        rows = log.read(0, 10)
        assert [r[0] for r in rows] == list(range(6))
        assert [msgpack.unpackb(r[5])["i"] for r in rows] == list(range(6))
        assert rows[0][1:5] == ("g", SENDER, "p1", 1000.0)
    assert journal_mode(path) == "wal"


def test_a_new_file_is_a_new_log(tmp_path: Path) -> None:
    with MessageLog(tmp_path / "a.sqlite") as a, MessageLog(tmp_path / "b.sqlite") as b:
        assert a.log_id != b.log_id


def test_groups_filter_and_interleave(tmp_path: Path) -> None:
    with MessageLog(tmp_path / "log.sqlite") as log:
        mixed = []
        for i in range(30):
            mixed.append(("a" if i % 3 else "b", SENDER, "p", float(i), b"%d" % i))
        log.append(mixed)
        log.append(mixed)
        assert log.groups() == ["a", "b"]
        b_offsets = [r[0] for r in log.read(0, 60, ["b"])]
        assert b_offsets == [i for i in range(60) if i % 30 % 3 == 0]
        both = [r[0] for r in log.read(5, 50, ["a", "b"])]
        assert both == list(range(5, 50))
        assert log.count(0, 60, ["a"]) == 40
        assert log.count(10, 20, ["b"]) == len([i for i in range(10, 20) if i % 3 == 0])
        assert log.last_offset(0, 60, ["b"]) == 57
        assert log.last_offset(0, 57, ["b"]) == 54
        assert log.last_offset(58, 60, ["b"]) is None
        assert log.nth_offset(0, 60, 1, ["b"]) == 0
        assert log.nth_offset(1, 60, 3, ["b"]) == 9
        assert log.nth_offset(0, 60, 25, ["a", "b"]) == 24
        assert log.nth_offset(0, 60, 61) is None
        assert log.read(0, 60, ["a"], limit=2) == log.read(0, 3, ["a"])


def test_trim_and_consumers(tmp_path: Path) -> None:
    with MessageLog(tmp_path / "log.sqlite") as log:
        for start in range(0, 100, 10):
            log.append(records(10, start=start))
        assert log.trim_committed() == 0  # no consumer: nothing trimmed
        log.register("q1", 0, ["g"], now=100.0)
        log.register("q2", 0, ["g"], now=100.0)
        log.commit("q1", 45, ["g"], now=101.0)
        assert log.trim_committed(now=102.0) == 0  # q2 holds the group
        log.commit("q2", 35, ["g"], now=103.0)
        assert log.trim_committed(now=104.0) == 30  # whole chunks below 35: 0-29
        assert log.bounds(["g"]) == (30, 100)
        assert [r[0] for r in log.read(0, 42)] == list(range(30, 42))
        log.register("q1", 10, ["g"], now=105.0)  # a restart never moves a consumer back
        assert {c.id: c.committed for c in log.consumers()} == {"q1": 45, "q2": 35}
        # q2 silent for longer than the ttl: it no longer holds the log back
        assert log.trim_committed(consumer_ttl=2.0, now=106.0) == 10
        assert log.bounds(["g"]) == (40, 100)
        assert log.forget("q2") and not log.forget("q2")
        assert log.trim(1000) == 100  # never past the end
        assert log.read(0, 100) == []
        assert log.append(records(1)) == (100, 101)


def test_retention_is_per_group(tmp_path: Path) -> None:
    """A query on one group never trims another's unread messages, a quiet group never
    pins the log, and its consumer never sees a loss of offsets that were not its own."""
    with MessageLog(tmp_path / "log.sqlite") as log:
        for start in range(0, 50, 10):
            log.append(records(5, "busy", start) + records(5, "other", start))
        log.append(records(1, "quiet"))  # offset 50
        for start in range(51, 101, 10):
            log.append(records(10, "busy", start))
        log.register("busy-query", 0, ["busy"], now=10.0)
        log.register("quiet-query", 50, ["quiet"], now=10.0)  # has not read offset 50 yet
        log.commit("busy-query", 101, ["busy"], now=11.0)
        assert log.trim_committed(now=12.0) == 75  # every "busy" message, nothing else
        assert log.count(0, 101, ["other"]) == 25 and log.count(0, 101, ["quiet"]) == 1
        assert log.bounds(["other"])[0] == 0          # (a) unread "other" kept
        assert log.bounds(["quiet"])[0] == 0          # (b) and (c): nothing of "quiet" went
        assert log.bounds(["busy"])[0] == 101
        # the quiet query, silent past the ttl, still has lost nothing of its group
        log.trim_committed(consumer_ttl=5.0, now=1000.0)
        assert log.bounds(["quiet"])[0] == 0 and log.count(0, 101, ["quiet"]) == 1


def test_bounds_are_per_group_for_a_read_of_several(tmp_path: Path) -> None:
    # A stream on A trimmed A; a read of A and B then raised DataLossError (or, with
    # failOnDataLoss=false, returned 10 rows of 60): one earliest offset for the set.
    with MessageLog(tmp_path / "log.sqlite") as log:
        for start in range(0, 60, 20):
            log.append(records(10, "A", start) + records(10, "B", start + 10))
        log.register("on-A", 0, ["A"], now=1.0)
        log.commit("on-A", 60, ["A"], now=2.0)
        assert log.trim_committed(now=3.0) == 30
        floors, nxt = log.group_bounds(["A", "B"])
        assert floors == {"A": 50, "B": 0} and nxt == 60   # A's last chunk ends at 49
        assert log.bounds(["A", "B"]) == (0, 60)
        assert [r[0] for r in log.read(0, 60, ["A", "B"])] == \
            [o for s in range(0, 60, 20) for o in range(s + 10, s + 20)]
        reply = log.fetch(0, 60, ["A", "B"])
        assert reply["floors"] == {"A": 50, "B": 0} and reply["earliest"] == 0
        assert log.count(0, 60, ["A", "B"]) == 30


def test_a_trim_that_cuts_inside_a_chunk_hides_what_is_below(tmp_path: Path) -> None:
    # service.trim(n, groups=[g]) removed nothing when n fell inside a stored chunk
    with MessageLog(tmp_path / "log.sqlite") as log:
        log.append(records(10, "g") + records(10, "h", 10))  # g: 0-9, h: 10-19, one chunk each
        assert log.trim(5, ["g"]) == 5
        assert [r[0] for r in log.read(0, 20, ["g"])] == list(range(5, 10))
        assert log.count(0, 20, ["g"]) == 5 and log.group_bounds(["g", "h"])[0] == \
            {"g": 5, "h": 0}
        assert log.trim(15, ["h"]) == 15
        assert [r[0] for r in log.read(0, 20, ["g", "h"])] == \
            list(range(5, 10)) + list(range(15, 20))
        assert log.trim(3, ["g"]) == 5   # never back down
        log.append(records(2, "g", 20))  # offsets 20, 21
        # the chunk 0-9 goes whole; g holds nothing in 10-19, so nothing of it is lost there
        assert log.trim(20, ["g"]) == 10 and log.count(0, 22, ["g"]) == 2


def test_queries_sharing_a_name_commit_apart(tmp_path: Path) -> None:
    # Two queries with one consumerName: the log kept the higher commit of the two, so
    # the fast one trimmed what the slow one had not read.
    with MessageLog(tmp_path / "log.sqlite") as log:
        for start in range(0, 200, 20):
            log.append(records(20, start=start))
        log.register("etl#fast", 0, ["g"], now=1.0)
        log.register("etl#slow", 0, ["g"], now=1.0)
        log.commit("etl#fast", 180, ["g"], now=2.0)
        log.commit("etl#slow", 20, ["g"], now=2.0)
        assert log.trim_committed(now=3.0) == 20   # what both have read, no more
        assert log.bounds(["g"])[0] == 20
        assert log.forget("etl") and log.consumers() == []  # a name forgets all of its own


def test_retention_by_age_and_size_with_no_query(tmp_path: Path) -> None:
    with MessageLog(tmp_path / "log.sqlite") as log:
        for i in range(10):  # ten chunks of 10 messages, received at 1000+i*10 ...
            log.append([("g", SENDER, "p", 1000.0 + i * 10 + j, b"x" * 1000)
                        for j in range(10)])
        assert log.retain(max_age=50.0, now=1100.0) == 50  # newest below 1050: chunks 0-4
        assert log.bounds(["g"]) == (50, 100)
        size = sum(len(c.data) + len(c.seqs) for c in log.chunks(0, 100)[0])
        assert log.retain(max_bytes=size // 2) == 30     # oldest first, down to half
        assert log.bounds(["g"]) == (80, 100)
        assert log.retain(max_age=1e9, max_bytes=10 ** 9, now=1100.0) == 0
        assert [r[0] for r in log.read(0, 100)] == list(range(80, 100))


def test_chunks_resume_after_a_byte_limit(tmp_path: Path) -> None:
    with MessageLog(tmp_path / "log.sqlite") as log:
        for start in range(0, 50, 10):
            log.append([("a", SENDER, "p", 0.0, b"x" * 100) for _ in range(5)] +
                       [("b", SENDER, "p", 0.0, b"y" * 100) for _ in range(5)])
        chunks, resume = log.chunks(0, 50, ["a", "b"], max_bytes=1500)
        assert 0 < resume < 50
        got = sorted(r[0] for r in rows_of(chunks, 0, resume))
        assert got == list(range(resume))
        rest, end = log.chunks(resume, 50, ["a", "b"], max_bytes=10 ** 6)
        assert end == 50
        assert sorted(r[0] for r in rows_of(rest, resume, 50)) == list(range(resume, 50))


def test_chunk_codec_round_trip() -> None:
    rows = [("g", "s1", "one", 1.5, msgpack.packb({"a": 1})), ("g", "s2", "two", 2.5, b"b"),
            ("g", "s1", "one", 3.5, b""), ("g", "s1", "one", 4.5, b"\xff\xfe"),
            ("g", "s2", "two", 5.5, b"x" * (STORED_TEXT_MAX + 1))]
    seqs, data = encode_chunk([4, 7, 9, 11, 12], rows)
    decoded = decode_chunk(Chunk("g", seqs, data))
    assert list(decoded.offsets) == [4, 7, 9, 11, 12]
    assert decoded.peers == [["s1", "one"], ["s2", "two"]]
    assert list(decoded.peer_index) == [0, 1, 0, 0, 1]
    assert list(decoded.received) == [1.5, 2.5, 3.5, 4.5, 5.5]
    assert list(rows_of([Chunk("g", seqs, data)], 5, 10)) == [
        (7, "g", "s2", "two", 2.5, b"b"), (9, "g", "s1", "one", 3.5, b"")]
    # each text made once, at ingest: none for what is not text, left to readers when large
    ends, texts = decoded.text_ends, decoded.text_data
    assert decoded.text_states == bytes([TEXT_STORED] * 3 + [TEXT_NULL, TEXT_LATER])
    assert [texts[ends[i]:ends[i + 1]] for i in range(3)] == [b'{"a":1}', b"b", b""]
    assert ends[3] == ends[4] == ends[5]
    bare = decode_chunk(Chunk("g", *encode_chunk([4, 7, 9, 11, 12], rows, texts=False)))
    assert bare.text_states == bytes([TEXT_LATER] * 5) and bare.text_data == b""


def test_chunks_of_the_older_format_are_read() -> None:
    data = msgpack.packb([[["s1", "one"]], [0, 0], [1.5, 2.5], [b"a", b"bc"]],
                         use_bin_type=True)
    chunk = Chunk("g", array("q", [3, 5]).tobytes(), data)
    assert list(rows_of([chunk], 0, 10)) == [(3, "g", "s1", "one", 1.5, b"a"),
                                             (5, "g", "s1", "one", 2.5, b"bc")]
    assert decode_chunk(chunk).text_ends is None


# --- the PMLOG1 codec -----------------------------------------------------------


def test_request_and_reply_frames() -> None:
    frames = protocol.encode_request(Request(b"7", Op.FETCH, {"start": 1, "end": 2}))
    assert frames[:3] == [b"PMLOG1", b"7", b"FETCH"]
    assert msgpack.unpackb(frames[3]) == {"start": 1, "end": 2}
    assert protocol.decode_request(frames) == Request(b"7", Op.FETCH, {"start": 1, "end": 2})
    ok = protocol.encode_reply(Reply(b"7", True, {"end": 3}))
    assert ok[:3] == [b"PMLOG1", b"7", b"OK"]
    assert protocol.decode_reply(ok).value() == {"end": 3}
    err = protocol.decode_reply(protocol.encode_reply(
        protocol.error_reply(b"8", "data-loss", "gone")))
    with pytest.raises(DataLossError, match="gone"):
        err.value()
    other = protocol.decode_reply(protocol.encode_reply(
        protocol.error_reply(b"9", "bad-request", "no")))
    with pytest.raises(LogServiceError) as info:
        other.value()
    assert info.value.kind == "bad-request"


@pytest.mark.parametrize("frames, reason", [
    ([b"PMLOG1", b"1", b"FETCH"], "4 frames"),
    ([b"PMLOG2", b"1", b"FETCH", msgpack.packb({})], "not PMLOG1"),
    ([b"PMLOG1", b"", b"FETCH", msgpack.packb({})], "request id"),
    ([b"PMLOG1", b"x" * 17, b"FETCH", msgpack.packb({})], "request id"),
    ([b"PMLOG1", b"1", b"EXPLODE", msgpack.packb({})], "unknown op"),
    ([b"PMLOG1", b"1", b"FETCH", b"\xc1"], "not msgpack"),
    ([b"PMLOG1", b"1", b"FETCH", msgpack.packb([1])], "not a map"),
])
def test_malformed_requests_raise_protocol_error(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        protocol.decode_request(frames)


def test_malformed_replies_raise_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="status"):
        protocol.decode_reply([b"PMLOG1", b"1", b"MAYBE", msgpack.packb({})])


def test_offset_at_a_time(tmp_path: Path) -> None:
    with MessageLog(tmp_path / "log.sqlite") as log:
        log.append(records(10, "a"))                     # received 1000-1009, offsets 0-9
        log.append(records(10, "b", start=10))           # received 1000-1009, offsets 10-19
        assert log.offset_at(1004.5, ["a"]) == 5
        assert log.offset_at(1004.5, ["b"]) == 15
        assert log.offset_at(1004.5, ["a", "b"]) == 5
        assert log.offset_at(0.0) == 0
        assert log.offset_at(2000.0, ["a"]) == 20        # none: the next offset
        log.trim(3, ["a"])                               # "a" chunk straddles 3: kept
        log.trim(10, ["a"])                              # now gone
        assert log.offset_at(0.0, ["a"]) == 20 and log.offset_at(0.0, ["b"]) == 10
