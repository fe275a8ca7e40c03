"""The MTL gateways' replication frames: golden bytes, round trips, and every ill-formed
message refused with ProtocolError (and nothing else)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.mtl.store import CID_BYTES as STORE_CID_BYTES
from peermesh.mtl.store import make_cid
from peermesh.wire import mtl_replication as repl
from peermesh.wire.mtl import encode_table
from peermesh.wire.mtl_replication import (
    CID_BYTES, Forget, Handoff, HandoffEnd, HandoffOk, Mark, MarkOk, Repl, Resync, Sync,
    content_group, decode, split_cids,
)

CID = make_cid(7, 9)
ONE = b"\x00" * 7 + b"\x01"


def test_content_ids_are_the_stores() -> None:
    assert CID_BYTES == STORE_CID_BYTES == len(CID)


@pytest.mark.parametrize("frames, wire", [
    (repl.handoff("jobs", 1, CID, b"", b"body"),
     [b"MTL-HANDOFF", b"jobs", ONE, CID, b"\x00\x00", b"body"]),
    (repl.handoff_end(258, 2),
     [b"MTL-HANDOFF-END", b"\x00" * 6 + b"\x01\x02", b"\x00" * 7 + b"\x02"]),
    (repl.handoff_ok(1), [b"MTL-HANDOFF-OK", ONE]),
    (repl.sync(repl.encode_number(1)), [b"MTL-SYNC", ONE]),
    (repl.mark(1), [b"MTL-MARK", ONE, b""]),
    (repl.mark(1, ONE), [b"MTL-MARK", ONE, ONE]),
    (repl.mark_ok(ONE), [b"MTL-MARK-OK", ONE]),
    (repl.resync(), [b"MTL-RESYNC"]),
])
def test_golden(frames: list[bytes], wire: list[bytes]) -> None:
    assert frames == wire


@pytest.mark.parametrize("frames, message", [
    ([b"MTL-HANDOFF", b"jobs", ONE, CID, b"\x00\x00", b"body"],
     Handoff(b"jobs", 1, CID, b"\x00\x00", b"body")),
    ([b"MTL-HANDOFF-END", ONE, ONE], HandoffEnd(1, 1)),
    ([b"MTL-HANDOFF-OK", ONE], HandoffOk(1)),
    ([b"MTL-SYNC", ONE], Sync(ONE)),
    ([b"MTL-REPL", b"g", CID, b"\x00\x00", b"b"], Repl((b"g", CID, b"\x00\x00", b"b"))),
    ([b"MTL-FORGET", CID + CID], Forget(CID + CID)),
    ([b"MTL-MARK", ONE, b""], Mark(ONE, b"")),
    ([b"MTL-MARK-OK", ONE], MarkOk(1)),
    ([b"MTL-RESYNC"], Resync()),
])
def test_decode(frames: list[bytes], message: object) -> None:
    assert decode(frames) == message


@pytest.mark.parametrize("frames", [
    [],
    [b"MTL-NOTHING", ONE],
    [b"MTL-HANDOFF", b"jobs", ONE, CID, b"\x00\x00"],          # a frame short
    [b"MTL-HANDOFF", b"jobs", b"\x01", CID, b"\x00\x00", b"b"],  # id not 8 octets
    [b"MTL-HANDOFF", b"jobs", ONE, CID[:15], b"\x00\x00", b"b"],  # cid not 16 octets
    [b"MTL-HANDOFF-END", ONE],
    [b"MTL-HANDOFF-END", ONE, b"\x02"],
    [b"MTL-HANDOFF-OK", ONE + b"\x00"],
    [b"MTL-HANDOFF-OK"],
    [b"MTL-SYNC", ONE, ONE],
    [b"MTL-MARK", ONE],
    [b"MTL-MARK", b"\x01", b""],
    [b"MTL-MARK-OK", b""],
    [b"MTL-FORGET", CID, CID],
])
def test_ill_formed_is_refused(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        decode(frames)


def test_split_cids() -> None:
    assert split_cids(CID + make_cid(1, 2)) == [CID, make_cid(1, 2)]
    assert split_cids(b"") == []
    assert split_cids(CID + b"\x00") is None


def test_content_group_checks_name_and_table() -> None:
    table = encode_table({"k": 1})
    assert content_group(b"jobs", table) == "jobs"
    assert content_group(b"jobs", b"\x00\x00") == "jobs"
    assert content_group(b"", table) is None                   # no name
    assert content_group(b"\xff", table) is None               # not UTF-8
    assert content_group(b"a\nb", table) is None               # not a short string's text
    assert content_group(b"jobs", table[:-1]) is None          # length prefix lies
    assert content_group(b"jobs", b"\x00\x01\xc1") is None     # not msgpack


def test_repl_batches_by_count_and_size() -> None:
    rows = [(n, make_cid(1, n), "g", b"", b"x" * 10) for n in range(5)]
    batches = list(repl.repl_batches(rows, 2, 1 << 20))
    assert [len(b) for b in batches] == [9, 9, 5]
    assert batches[0][:5] == [b"MTL-REPL", b"g", make_cid(1, 0), b"\x00\x00", b"x" * 10]
    assert [len(b) for b in repl.repl_batches(rows, 100, 100)] == [9, 9, 5]   # 74 each
    assert list(repl.repl_batches([], 2, 100)) == []
    assert decode(batches[0]) == Repl(tuple(batches[0][1:]))


def test_forget_batches() -> None:
    cids = [make_cid(1, n) for n in range(5)]
    batches = list(repl.forget_batches(cids, 2))
    assert [split_cids(b[1]) for b in batches] == [cids[:2], cids[2:4], cids[4:]]
    assert all(decode(b) == Forget(b[1]) for b in batches)


@given(st.lists(st.binary(max_size=24), max_size=7),
       st.sampled_from(sorted(repl.KINDS) + [b"MTL-X", b""]))
@settings(max_examples=300, deadline=None)
def test_decode_refuses_with_protocol_error_only(rest: list[bytes], kind: bytes) -> None:
    try:
        decode([kind, *rest])
    except ProtocolError:
        return
    assert kind in repl.KINDS


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_numbers_round_trip(last: int, count: int) -> None:
    assert decode(repl.handoff_end(last, count)) == HandoffEnd(last, count)
