"""Tests for the Flux RFC 3 codec (20-byte PROTO of flux-core's current code).

Golden vectors come from flux-core's own tests (src/common/libflux/test/message.c)
and from an exchange captured on a live flux-core broker (frames as the
local connector carries them, its header stripped).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.errors import LocalProtocolError, ProtocolError, RemoteProtocolError
from peermesh.wire.flux import (
    NODEID_ANY, NODEID_UPSTREAM, USERID_UNKNOWN, Control, ControlType, Errno, EventMessage, MsgFlag,
    MsgType, Proto, Request, Response, Role, decode, decode_proto, encode, encode_proto,
    error_message, json_payload, read_json, read_string, service_of, string_payload,
)

H = bytes.fromhex


def test_ascending_fields_vector() -> None:
    proto = decode_proto(H("8e01abcd000102030405060708090a0b0c0d0e0f"))
    assert proto == Proto(0xAB, 0xCD, 0x00010203, 0x04050607, 0x08090A0B, 0x0C0D0E0F)
    assert encode_proto(proto) == H("8e01abcd000102030405060708090a0b0c0d0e0f")


def test_control_disconnect_vector() -> None:
    frame = H("8e01080000000064000000010000000200000000")
    message = decode([frame])
    assert message == Control(ControlType.DISCONNECT, 0, userid=100, rolemask=Role.OWNER)
    assert encode(message) == [frame]


def test_hello_request_and_response_vectors() -> None:
    request = H("8e01010b0000006400000001ffffffff00000000")
    frames = [b"", b"overlay.hello", b'{"rank":1}\0', request]
    message = decode(frames)
    assert message == Request("overlay.hello", b'{"rank":1}\0', NODEID_ANY, 0, MsgFlag(0), (),
                              100, Role.OWNER)
    assert encode(message) == frames
    response = request[:2] + b"\x02" + request[3:]
    reply = decode([b"", b"overlay.hello", b"{}\0", response])
    assert isinstance(reply, Response) and reply.errnum == 0xFFFFFFFF and reply.routes == ()
    assert encode(reply)[-1] == response


def test_live_broker_exchange() -> None:
    request = [b"", b"attr.get", b'{"name":"rank"}\0',
               H("8e01010b" "ffffffff" "00000000" "ffffffff" "0000000a")]
    message = decode(request)
    assert isinstance(message, Request)
    assert (message.topic, message.nodeid, message.matchtag, message.userid) == \
        ("attr.get", NODEID_ANY, 10, USERID_UNKNOWN)
    assert read_json(message.payload) == {"name": "rank"}
    assert encode(message) == request
    reply = decode([b"", b"attr.get", b'{"value":"0"}\0',
                    H("8e01020b" "00000000" "00000005" "00000000" "0000000a")])
    assert isinstance(reply, Response)
    assert (reply.errnum, reply.matchtag, reply.userid, reply.rolemask) == \
        (0, 10, 0, Role.OWNER | Role.LOCAL)


def test_request_without_route_and_error_with_message() -> None:
    frames = [b"attr.get", H("8e010103ffffffff00000000ffffffff0000000a")[:3] + b"\x01" +
              H("8e010103ffffffff00000000ffffffff0000000a")[4:]]
    message = decode(frames)
    assert isinstance(message, Request) and message.routes is None and message.payload is None
    error = Response("nosuch.x", b"No service matching nosuch.x is registered\0",
                     Errno.ENOSYS, 7, routes=())
    back = decode(encode(error))
    assert back == error and back.errnum == 38
    assert error_message(back.payload) == "No service matching nosuch.x is registered"


def test_event_with_route_frames_is_accepted() -> None:
    frames = [b"abc", b"def", b"", b"fluxlab.x", b"{}\0",
              H("8e01040b" "00000000" "00000005" "00000003" "00000000")]
    message = decode(frames)
    assert message == EventMessage("fluxlab.x", b"{}\0", 3, MsgFlag(0), (b"abc", b"def"), 0, 5)
    assert encode(message) == frames


GOOD = H("8e01010b0000006400000001ffffffff00000000")


@pytest.mark.parametrize("frames, reason", [
    ([], "no frames"),
    ([GOOD[:19]], "19 octets"),
    ([GOOD + b"\0"], "21 octets"),
    ([b"\x8f" + GOOD[1:]], "magic"),
    ([GOOD[:1] + b"\x02" + GOOD[2:]], "version"),
    ([b"", b"t", b"p", GOOD[:2] + b"\x03" + GOOD[3:]], "type"),
    ([b"t", b"p", GOOD], "delimiter"),
    ([b"", GOOD], "topic"),
    ([b"", b"", b"p", GOOD], "topic frame is empty"),
    ([b"", b"\xff", b"p", GOOD], "UTF-8"),
    ([b"", b"t", GOOD], "payload"),
    ([b"", b"t", b"p", b"x", GOOD], "no flag announces"),
    ([b"", b"t", b"p", GOOD[:3] + b"\x4f" + GOOD[4:]], "NORESPONSE with STREAMING"),
    ([b"", b"t", b"p", GOOD[:12] + b"\xff\xff\xff\xfe" + GOOD[16:]], "NODEID_UPSTREAM"),
    ([b"", b"p", GOOD[:3] + b"\x0a" + GOOD[4:]], "request has no topic"),
    ([b"", b"t", "p", GOOD], "type str"),
    ([b"", b"t", 5, GOOD], "type int"),
    (GOOD, "not one byte string"),
    (None, "list of frames"),
])
def test_malformed_is_a_remote_protocol_error(frames: object, reason: str) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode(frames)  # type: ignore[arg-type]
    assert reason in info.value.reason


def test_bytearray_and_memoryview_frames_are_read() -> None:
    frames = [bytearray(b""), memoryview(b"t.x"), GOOD[:3] + b"\x09" + GOOD[4:]]
    assert decode(frames) == Request("t.x", None, NODEID_ANY, 0, MsgFlag(0), (), 100, 1)


def test_encode_refuses_what_the_wire_cannot_carry() -> None:
    for message in (Request("a.b", nodeid=NODEID_UPSTREAM),
                    Request("a.b", flags=MsgFlag.NORESPONSE | MsgFlag.STREAMING),
                    Request("a.b", matchtag=1 << 32), Request(""),
                    Request("a.b", routes=(b"",)), Request("a.b", "text"),  # type: ignore[arg-type]
                    "not a message"):
        with pytest.raises(LocalProtocolError):
            encode(message)  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        encode_proto(Proto(1, 0, 1 << 32))
    for frame in (b"\x8e" * 19, b"\x8f" + bytes(19), b"\x8e\x02" + bytes(18), None):
        with pytest.raises(RemoteProtocolError):
            decode_proto(frame)  # type: ignore[arg-type]


def test_payload_conventions() -> None:
    assert string_payload("hi") == b"hi\0" and read_string(b"hi\0") == "hi"
    assert read_json(json_payload({"a": 1})) == {"a": 1}
    for bad in (None, b"", b"{}", b"[1]\0", b"{\0", b"\xff\0"):
        with pytest.raises(RemoteProtocolError):
            read_json(bad)
    with pytest.raises(RemoteProtocolError):
        read_string(b"\xff\0")
    with pytest.raises(LocalProtocolError):
        json_payload([1])  # type: ignore[arg-type]
    assert error_message(None) == "" and service_of("kvs.get.x") == "kvs"


u32 = st.integers(0, 0xFFFFFFFF)
topics = st.text(min_size=1, max_size=20).filter(lambda t: "\0" not in t)
payloads = st.none() | st.binary(max_size=40)
routes = st.none() | st.lists(st.binary(min_size=1, max_size=8), max_size=4).map(tuple)
flags = st.sampled_from([0, MsgFlag.NORESPONSE, MsgFlag.STREAMING, MsgFlag.UPSTREAM,
                         MsgFlag.PRIVATE | MsgFlag.USER1]).map(MsgFlag)
messages = st.one_of(
    st.builds(Request, topics, payloads, u32.filter(lambda n: n != NODEID_UPSTREAM), u32, flags,
              routes, u32, u32),
    st.builds(Response, topics, payloads, u32, u32, flags, routes, u32, u32),
    st.builds(EventMessage, topics, payloads, u32, flags, routes, u32, u32),
    st.builds(Control, u32, u32, flags, routes, st.none() | topics, payloads, u32, u32),
)


@settings(max_examples=300, deadline=None)
@given(messages)
def test_round_trip(message: object) -> None:
    assert decode(encode(message)) == message  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=24), max_size=6))
def test_any_frames_decode_or_raise_protocol_error(frames: list[bytes]) -> None:
    try:
        message = decode(frames)
    except ProtocolError:
        return
    assert decode(encode(message)) == message


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=4), max_size=4), st.tuples(
    st.sampled_from([1, 2, 4, 8]), st.integers(0, 255), u32, u32, u32, u32))
def test_valid_proto_with_random_frames(frames: list[bytes], fields: tuple) -> None:
    proto = encode_proto(Proto(*fields))
    try:
        message = decode(frames + [proto])
    except ProtocolError:
        return
    assert message.userid == fields[2] and decode(encode(message)) == message
    assert MsgType(fields[0])


# --- the hot paths' PROTO helpers --------------------------------------------------

@given(st.sampled_from([1, 2, 4, 8]), st.integers(0, 0xFF), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_proto_helpers_match_the_codec(kind: int, flags: int, userid: int, rolemask: int,
                                       aux1: int, aux2: int) -> None:
    from peermesh.wire import flux
    frame = flux.pack_proto(flux.MAGIC, flux.VERSION, kind, flags, userid, rolemask, aux1, aux2)
    assert frame == encode_proto(Proto(kind, flags, userid, rolemask, aux1, aux2))
    assert flux.unpack_proto(frame) == (flux.MAGIC, flux.VERSION, kind, flags, userid,
                                        rolemask, aux1, aux2)
    assert flux.peek_proto(frame) == (flux.MAGIC_VERSION, kind, flags, aux1, aux2)
    assert flux.peek_credentials(frame) == (userid, rolemask)


def test_plain_flag_ints_are_msgflag() -> None:
    from peermesh.wire import flux
    assert (flux.FLAG_TOPIC, flux.FLAG_PAYLOAD, flux.FLAG_NORESPONSE, flux.FLAG_ROUTE,
            flux.FLAG_UPSTREAM, flux.FLAG_PRIVATE, flux.FLAG_STREAMING) == (
        MsgFlag.TOPIC, MsgFlag.PAYLOAD, MsgFlag.NORESPONSE, MsgFlag.ROUTE, MsgFlag.UPSTREAM,
        MsgFlag.PRIVATE, MsgFlag.STREAMING)
    assert flux.FRAME_BITS == flux.FRAME_FLAGS
