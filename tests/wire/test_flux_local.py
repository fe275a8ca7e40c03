"""flux-core's local connector framing (``peermesh.wire.flux_local``): table tests."""

from __future__ import annotations

import sys

import pytest

from peermesh.errors import LocalProtocolError, RemoteProtocolError
from peermesh.wire.flux import NODEID_ANY, Request, decode, encode as encode_flux
from peermesh.wire.flux_local import HEADER_SIZE, Reader, decode_body, encode, encode_body

MAGIC = bytes.fromhex("1200eeff") if sys.byteorder == "little" else bytes.fromhex("ffee0012")
#: libflux's attr.get request as flux-core 0.88 sent it (LAB-NOTES): empty route
#: stack (ROUTE), topic, payload, PROTO with nodeid ANY and matchtag 10
ATTR_GET_BODY = (b"\x00" + b"\x08attr.get" + b'\x10{"name":"rank"}\x00'
                 + b"\x14" + bytes.fromhex("8e01010bffffffff00000000ffffffff0000000a"))

FRAMES = [
    ([b"\x8e" * 20], b"\x14" + b"\x8e" * 20),
    ([b"", b"t", b"\x8e" * 20], b"\x00\x01t\x14" + b"\x8e" * 20),
    ([b"x" * 254], b"\xfe" + b"x" * 254),                          # the last short form
    ([b"x" * 255], b"\xff\x00\x00\x00\xff" + b"x" * 255),          # the first long form
    ([b"y" * 70000], b"\xff\x00\x01\x11\x70" + b"y" * 70000),
]


@pytest.mark.parametrize("frames,body", FRAMES)
def test_frames_and_bodies(frames: list[bytes], body: bytes) -> None:
    assert encode_body(frames) == body
    assert decode_body(body) == frames
    whole = encode(frames)
    assert whole[:4] == MAGIC and int.from_bytes(whole[4:8], "big") == len(body)
    assert whole[HEADER_SIZE:] == body


def test_a_real_request_decodes_and_encodes_identically() -> None:
    frames = decode_body(ATTR_GET_BODY)
    message = decode(frames)
    assert message == Request("attr.get", b'{"name":"rank"}\0', NODEID_ANY, 10, routes=())
    assert encode_body(encode_flux(message)) == ATTR_GET_BODY


@pytest.mark.parametrize("cut", [1, 3, 8, 9, 20, len(ATTR_GET_BODY) + HEADER_SIZE - 1])
def test_reader_takes_messages_in_any_pieces(cut: int) -> None:
    stream = encode(decode_body(ATTR_GET_BODY)) * 2
    reader = Reader(1 << 20)
    got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
    assert got == [decode_body(ATTR_GET_BODY)] * 2 and reader.pending == 0
    pieces = Reader(1 << 20)
    assert sum((pieces.feed(stream[i:i + 1]) for i in range(len(stream))), []) == got


BAD = [
    (b"\x00\x00\xee\xff" + bytes(4), "magic"),
    (MAGIC + (100).to_bytes(4, "big"), "over the limit"),
    (MAGIC + (3).to_bytes(4, "big") + b"\x05ab", "overruns"),
    (MAGIC + (3).to_bytes(4, "big") + b"\xff\x00\x00", "cut short"),
    (MAGIC + (0).to_bytes(4, "big"), "empty"),
]


@pytest.mark.parametrize("stream,why", BAD)
def test_reader_refuses_malformed_streams(stream: bytes, why: str) -> None:
    with pytest.raises(RemoteProtocolError, match=why):
        Reader(64).feed(stream)


def test_reader_holds_a_partial_message_within_its_limit() -> None:
    reader = Reader(64)
    assert reader.feed(MAGIC + (64).to_bytes(4, "big") + b"\x3f") == []
    assert reader.pending == HEADER_SIZE + 1


def test_encode_refuses_what_is_not_frames_as_a_local_error() -> None:
    for bad in (b"one string", ["text"], 5, [b"ok", None]):
        with pytest.raises(LocalProtocolError):
            encode(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("body", [b"", b"\x05ab", "text", None])
def test_decode_body_refuses_as_a_remote_error(body: object) -> None:
    with pytest.raises(RemoteProtocolError):
        decode_body(body)  # type: ignore[arg-type]
