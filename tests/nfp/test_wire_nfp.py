"""Tests for the NFP codec (../shared/specs/nfp.txt).

The golden frames were written by hand from the spec's frame layouts, not by
calling ``encode``. Frame 0 is the empty delimiter, frame 1 the six-octet
header (NFPC01 / NFPW01 / NFPB01), frame 2 the one-octet command (OPEN %x00,
READY %x01, KEEPALIVE %x02, DISCONNECT %x03, POST %x04, RESPONSE %x05,
GET %x06, DELETE %x07, EVENT %x08), then the command's fields.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.wire import nfp
from peermesh.wire.nfp import (BROKER, CLIENT, WORKER, Delete, Disconnect, EventCommand, Get, Keepalive,
                               Open, Post, Ready, Response, Status, decode, decode_body,
                               decode_status, encode, encode_body, encode_status, format_target,
                               parse_target)

JOB = "4c5e9d1e7a8b4f0c9e2d3b1a0f6e5d4c"

GOLDEN = [
    # OPEN: empty | header | 0x00 | open body (opaque)
    (Open(CLIENT, b"{}"), [b"", b"NFPC01", b"\x00", b"{}"]),
    (Open(WORKER, b""), [b"", b"NFPW01", b"\x00", b""]),
    (Open(BROKER, b"\x00\xff"), [b"", b"NFPB01", b"\x00", b"\x00\xff"]),
    # READY: empty | NFPW01 | 0x01 | service
    (Ready("nornir"), [b"", b"NFPW01", b"\x01", b"nornir"]),
    # KEEPALIVE: empty | NFPB01/NFPW01 | 0x02 | service
    (Keepalive(BROKER, "nornir"), [b"", b"NFPB01", b"\x02", b"nornir"]),
    (Keepalive(WORKER, "nornir"), [b"", b"NFPW01", b"\x02", b"nornir"]),
    # DISCONNECT: empty | NFPB01/NFPW01 | 0x03 | service | body (the layout's 5 frames)
    (Disconnect(BROKER, "nornir", b"bye"), [b"", b"NFPB01", b"\x03", b"nornir", b"bye"]),
    (Disconnect(WORKER, "nornir"), [b"", b"NFPW01", b"\x03", b"nornir", b""]),
    # POST: empty | NFPC01/NFPB01 | 0x04 | service | target | job UUID | body...
    (Post(CLIENT, "nornir", "all", JOB, (b'{"task":"cli"}',)),
     [b"", b"NFPC01", b"\x04", b"nornir", b"all", JOB.encode(), b'{"task":"cli"}']),
    (Post(BROKER, "nornir", "w1,w2", JOB, (b"a", b"b")),
     [b"", b"NFPB01", b"\x04", b"nornir", b"w1,w2", JOB.encode(), b"a", b"b"]),
    # RESPONSE: empty | NFPB01/NFPW01 | 0x05 | service | job UUID | status | body...
    (Response(WORKER, "nornir", JOB, Status.ACCEPTED, (b"{}",)),
     [b"", b"NFPW01", b"\x05", b"nornir", JOB.encode(), b"202", b"{}"]),
    (Response(BROKER, "nornir", JOB, Status.PENDING, (b"",), "still running"),
     [b"", b"NFPB01", b"\x05", b"nornir", JOB.encode(), b"300 still running", b""]),
    # GET: empty | NFPC01/NFPB01 | 0x06 | service | target | job UUID | body...
    (Get(CLIENT, "nornir", "any", JOB),
     [b"", b"NFPC01", b"\x06", b"nornir", b"any", JOB.encode(), b""]),
    # DELETE: empty | NFPC01/NFPB01 | 0x07 | service | target | job UUID | body...
    (Delete(BROKER, "nornir", "w1", JOB, (b"x",)),
     [b"", b"NFPB01", b"\x07", b"nornir", b"w1", JOB.encode(), b"x"]),
    # EVENT: empty | NFPW01 | 0x08 | service | topic | status 200 | body...
    (EventCommand(WORKER, "nornir", JOB, Status.OK, (b'{"p":1}',)),
     [b"", b"NFPW01", b"\x08", b"nornir", JOB.encode(), b"200", b'{"p":1}']),
    (EventCommand(BROKER, "nornir", JOB), [b"", b"NFPB01", b"\x08", b"nornir", JOB.encode(), b"200",
                                    b""]),
]


@pytest.mark.parametrize("msg, frames", GOLDEN, ids=lambda v: type(v).__name__
                         if not isinstance(v, list) else "")
def test_golden(msg: nfp.Message, frames: list[bytes]) -> None:
    assert encode(msg) == frames
    assert decode(frames) == msg


@pytest.mark.parametrize("msg, frames", [g for g in GOLDEN if isinstance(
    g[0], (Post, Get, Delete, Response, EventCommand))], ids=lambda v: type(v).__name__
    if not isinstance(v, list) else "")
def test_frame_builders_give_the_golden_frames(msg: nfp.Message, frames: list[bytes]) -> None:
    if isinstance(msg, Response):
        built = nfp.response_frames(msg.role, msg.service, msg.uuid, msg.status, msg.body,
                                    msg.text)
    elif isinstance(msg, EventCommand):
        built = nfp.event_frames(msg.role, msg.service, msg.topic, msg.status, msg.body,
                                 msg.text)
    else:
        built = nfp.request_frames(nfp._COMMAND_OF[type(msg)], msg.role, msg.service,
                                   msg.target, msg.uuid, msg.body)
    assert built == frames


def test_frame_builders_refuse_what_encode_refuses() -> None:
    with pytest.raises(ValueError):
        nfp.request_frames(nfp.Command.POST, WORKER, "s", "all", "u")
    with pytest.raises(ValueError):
        nfp.request_frames(nfp.Command.RESPONSE, BROKER, "s", "all", "u")
    with pytest.raises(ValueError):
        nfp.response_frames(CLIENT, "s", "u", Status.OK)
    with pytest.raises(ValueError):
        nfp.event_frames(WORKER, "s", "", Status.OK)


def test_reheaded_relays_a_workers_event_as_the_broker() -> None:
    frames = [b"", b"NFPW01", b"\x08", b"nornir", JOB.encode(), b"200 step 1", b"a", b"b"]
    relayed = nfp.reheaded(frames, BROKER)
    assert relayed == [b"", b"NFPB01", *frames[2:]]
    assert decode(relayed) == EventCommand(BROKER, "nornir", JOB, Status.OK, (b"a", b"b"), "step 1")
    with pytest.raises(ValueError):
        nfp.reheaded(frames, CLIENT)     # an EVENT never comes from a client


def test_decoded_names_targeted_again_keep_their_canonical_frame() -> None:
    assert decode([b"", b"NFPC01", b"\x04", b"s", b"w2, w1", b"u", b""]).target == "w2, w1"
    assert decode([b"", b"NFPC01", b"\x04", b"s", b" w3", b"u", b""]).target == " w3"
    assert encode(Post(CLIENT, "s", "w2, w1", "u"))[4] == b"w2,w1"
    assert encode(Post(CLIENT, "s", " w3", "u"))[4] == b"w3"


def test_status_codes_are_the_specs() -> None:
    assert sorted(s.value for s in Status) == [200, 202, 300, 400, 408, 417, 500]
    for status in Status:
        assert encode_status(status) == str(status.value).encode()
        assert decode_status(str(status.value).encode()) == (status, "")
    assert encode_status(400, "no such job") == b"400 no such job"
    assert decode_status(b"500 boom") == (Status.ERROR, "boom")
    assert decode_status(b"202 ") == (Status.ACCEPTED, "")


@pytest.mark.parametrize("frame", [b"", b"20", b"2000", b"201", b"999", b"abc", b"200x",
                                   b"200\tx", b"200 \xff", b"200 a\nb", b" 200"])
def test_bad_status_frames(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_status(frame)


def test_undefined_status_cannot_be_encoded() -> None:
    with pytest.raises(ValueError):
        encode_status(201)


BAD = [
    ([], "no frames"),
    ([b"", b"NFPC01", b"\x00"], "3 frames"),
    ([b"x", b"NFPC01", b"\x00", b""], "frame 0 not empty"),
    ([b"", b"NFPX01", b"\x00", b""], "unknown header"),
    ([b"", b"NFPC0", b"\x00", b""], "short header"),
    ([b"", b"NFPC01", b"\x09", b""], "unknown command"),
    ([b"", b"NFPC01", b"\x00\x00", b""], "two-octet command"),
    ([b"", b"NFPC01", b"", b""], "empty command"),
    ([b"", b"NFPC01", b"\x01", b"svc"], "READY from a client"),
    ([b"", b"NFPW01", b"\x04", b"s", b"all", b"u", b""], "POST from a worker"),
    ([b"", b"NFPC01", b"\x05", b"s", b"u", b"200", b""], "RESPONSE from a client"),
    ([b"", b"NFPC01", b"\x08", b"s", b"u", b"200", b""], "EVENT from a client"),
    ([b"", b"NFPC01", b"\x02", b"s"], "KEEPALIVE from a client"),
    ([b"", b"NFPC01", b"\x00", b"", b""], "OPEN with 5 frames"),
    ([b"", b"NFPW01", b"\x01", b""], "empty service"),
    ([b"", b"NFPW01", b"\x01", b"\xff\xfe"], "service not UTF-8"),
    ([b"", b"NFPW01", b"\x01", b"a\x00b"], "service not printable"),
    ([b"", b"NFPW01", b"\x03", b"svc"], "DISCONNECT with 4 frames"),
    ([b"", b"NFPW01", b"\x03", b"svc", b"", b""], "DISCONNECT with 6 frames"),
    ([b"", b"NFPC01", b"\x04", b"s", b"all", b"u"], "POST without body"),
    ([b"", b"NFPC01", b"\x04", b"s", b"", b"u", b""], "empty target"),
    ([b"", b"NFPC01", b"\x04", b"s", b"w1,,w2", b"u", b""], "blank name in target"),
    ([b"", b"NFPC01", b"\x04", b"s", b"w1,w1", b"u", b""], "duplicate name in target"),
    ([b"", b"NFPC01", b"\x06", b"s", b"all", b"", b""], "empty UUID"),
    ([b"", b"NFPW01", b"\x05", b"s", b"u", b"201", b""], "undefined status"),
    ([b"", b"NFPW01", b"\x05", b"s", b"u", b"ok", b""], "status not digits"),
    ([b"", b"NFPW01", b"\x08", b"s", b"", b"200", b""], "empty topic"),
]


@pytest.mark.parametrize("frames, why", BAD, ids=[why for _, why in BAD])
def test_malformed_is_protocol_error(frames: list[bytes], why: str) -> None:
    with pytest.raises(ProtocolError):
        decode(frames)


def test_one_byte_string_is_not_a_message() -> None:
    with pytest.raises(ProtocolError):
        decode(b"\x00NFPC01")  # type: ignore[arg-type]


def test_encode_refuses_what_decode_would_refuse() -> None:
    with pytest.raises(ValueError):
        encode(Post(WORKER, "s", "all", "u"))       # POST never carries NFPW01
    with pytest.raises(ValueError):
        encode(Ready(""))
    with pytest.raises(ValueError):
        encode(Get(CLIENT, "s", "a,,b", "u"))
    with pytest.raises(TypeError):
        encode(Post(CLIENT, "s", "all", "u", b"not a tuple"))  # type: ignore[arg-type]


def test_memoryview_and_bytearray_frames_decode() -> None:
    frames = [b"", bytearray(b"NFPC01"), memoryview(b"\x04"), b"s", b"any", b"u", bytearray(b"b")]
    assert decode(frames) == Post(CLIENT, "s", "any", "u", (b"b",))


def test_targets() -> None:
    assert parse_target("all") == "all"
    assert parse_target("any") == "any"
    assert parse_target("w1") == ("w1",)
    assert parse_target("w1, w2") == ("w1", "w2")
    assert format_target(("w1", "w2")) == "w1,w2"
    assert format_target("w2, w1") == "w2,w1"
    for bad in ("", ",", "w1,", "all,w1", "w1,w1"):
        with pytest.raises(ValueError):
            parse_target(bad)
    with pytest.raises(ValueError):
        format_target(("a,b",))


def test_bodies() -> None:
    assert decode_body(b"") == {}
    assert decode_body(encode_body({"task": "x", "args": [1, "é"]})) == {"task": "x",
                                                                         "args": [1, "é"]}
    for bad in (b"[1]", b"nul", b"\xff", b"{", b"1" * 10 + b"e999999"):
        with pytest.raises(ProtocolError):
            decode_body(bad)
    with pytest.raises(ProtocolError):
        decode_body(b"[" * 100_000)  # deep nesting is a ProtocolError, not RecursionError


# --------------------------------------------------------------------------
# Properties

printable = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Cf", "Co",
                                                        "Cn", "Zs")),
                    min_size=1, max_size=20)
names = printable.filter(lambda s: "," not in s and s not in ("all", "any"))
targets = st.one_of(st.sampled_from(["all", "any"]),
                    st.lists(names, min_size=1, max_size=4, unique=True).map(",".join))
bodies = st.lists(st.binary(max_size=30), min_size=1, max_size=3).map(tuple)
statuses = st.sampled_from(list(Status))
texts = st.one_of(st.just(""), printable)

messages = st.one_of(
    st.builds(Open, st.sampled_from(list(nfp.Role)), st.binary(max_size=30)),
    st.builds(Ready, printable),
    st.builds(Keepalive, st.sampled_from([BROKER, WORKER]), printable),
    st.builds(Disconnect, st.sampled_from([BROKER, WORKER]), printable, st.binary(max_size=9)),
    st.builds(Post, st.sampled_from([CLIENT, BROKER]), printable, targets, printable, bodies),
    st.builds(Get, st.sampled_from([CLIENT, BROKER]), printable, targets, printable, bodies),
    st.builds(Delete, st.sampled_from([CLIENT, BROKER]), printable, targets, printable, bodies),
    st.builds(Response, st.sampled_from([BROKER, WORKER]), printable, printable, statuses,
              bodies, texts),
    st.builds(EventCommand, st.sampled_from([BROKER, WORKER]), printable, printable, statuses, bodies,
              texts),
)


@given(messages)
@settings(max_examples=300, deadline=None)
def test_roundtrip(msg: nfp.Message) -> None:
    assert decode(encode(msg)) == msg


@given(st.lists(st.binary(max_size=12), max_size=9))
@settings(max_examples=500, deadline=None)
def test_random_frames_only_raise_protocol_error(frames: list[bytes]) -> None:
    try:
        decode(frames)
    except ProtocolError:
        pass


@given(messages, st.data())
@settings(max_examples=300, deadline=None)
def test_mutated_frames_only_raise_protocol_error(msg: nfp.Message, data: st.DataObject) -> None:
    frames = encode(msg)
    index = data.draw(st.integers(0, len(frames) - 1))
    frames[index] = data.draw(st.binary(max_size=10))
    if data.draw(st.booleans()):
        del frames[data.draw(st.integers(0, len(frames) - 1))]
    try:
        decoded = decode(frames)
    except ProtocolError:
        return
    assert type(decoded) in nfp._COMMAND_OF


@given(st.binary(max_size=40))
@settings(max_examples=300, deadline=None)
def test_random_bodies_only_raise_protocol_error(data: bytes) -> None:
    try:
        assert isinstance(decode_body(data), dict)
    except ProtocolError:
        pass


def test_size_limits_count_utf8_bytes() -> None:
    assert nfp.MAX_CONTENT < nfp.MAX_BODY < nfp.MAX_MESSAGE
    nfp.check_size("x" * nfp.MAX_CONTENT, "the job")
    with pytest.raises(ValueError, match=f"it is {nfp.MAX_CONTENT + 1:,} bytes as JSON"):
        nfp.check_size("x" * (nfp.MAX_CONTENT + 1), "the job")
    nfp.check_size("é" * (nfp.MAX_CONTENT // 2), "the job")
    with pytest.raises(ValueError):
        nfp.check_size("é" * (nfp.MAX_CONTENT // 2 + 1), "the job")   # two bytes each in UTF-8
