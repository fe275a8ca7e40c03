"""The SADA1 codec (spec: ../shared/specs/safir-darbaan.txt), sans-io.

The golden frames are copied from the spec's drawings by hand, not produced
by ``encode``. Frame 0 (the routing id) belongs to the transport; the codec
handles frames 1 onwards, the empty delimiter first.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.wire import sada
from peermesh.wire.sada import (Command, Intr, Ping, Pong, Rep, Req, Rintr, ServiceId, Status,
                                decode, encode, parse_rep, parse_req)

PAYLOAD = bytes([0x81, 0xA4]) + b"name" + bytes([0xA3]) + b"Ali"   # msgpack {"name": "Ali"}

GOLDEN = [
    # ===INTR Command Message===
    (Intr((ServiceId("example-service", "1.2"), ServiceId("another-service", "1"))),
     [b"",                      # frame 1: empty frame
      b"SADA1",                 # frame 2: "SADA1"
      b"INTR",                  # frame 3: "INTR"
      b"example-service",       # frame 4: name of the service
      b"1.2",                   # frame 5: version of the example-service
      b"another-service",       # frame 6
      b"1"]),                   # frame 7
    # ===RINTR Command Message===
    (Rintr(), [b"", b"SADA1", b"RINTR"]),
    # ===REQ Command Message===
    (Req(b"12345678", "customer-management", "1", "customer", "registerNewCustomer", PAYLOAD),
     [b"", b"SADA1", b"REQ",
      b"12345678",              # frame 4: request id
      b"customer-management",   # frame 5: name of the service
      b"1",                     # frame 6: version of the service
      b"customer",              # frame 7: category of the action
      b"registerNewCustomer",   # frame 8: action name
      PAYLOAD]),                # frame 9: request payload
    # ===REP Command Message===
    (Rep(b"12345678", 200, PAYLOAD),
     [b"", b"SADA1", b"REP",
      b"12345678",              # frame 4: request id
      b"200",                   # frame 5: status code (three ASCII digits)
      PAYLOAD]),                # frame 6: reply payload
    # ===PING Command Message=== / ===PONG Command Message===
    (Ping(), [b"", b"SADA1", b"PING"]),
    (Pong(), [b"", b"SADA1", b"PONG"]),
    # edge cases
    (Intr(()), [b"", b"SADA1", b"INTR"]),                               # an empty catalog
    (Req(b"c-1", "s", "1", "", "a", b""),                               # no category
     [b"", b"SADA1", b"REQ", b"c-1", b"s", b"1", b"", b"a", b""]),
    (Rep(b"\x00\xff", 503, b"server is stopping"),
     [b"", b"SADA1", b"REP", b"\x00\xff", b"503", b"server is stopping"]),
    (Req(b"r", "caf\u00e9", "2.0", "k", "\u2615", b"x"),
     [b"", b"SADA1", b"REQ", b"r", b"caf\xc3\xa9", b"2.0", b"k", b"\xe2\x98\x95", b"x"]),
]


@pytest.mark.parametrize("message, frames", GOLDEN, ids=lambda v: type(v).__name__
                         if not isinstance(v, list) else "")
def test_golden(message: sada.Message, frames: list[bytes]) -> None:
    assert encode(message) == frames
    assert decode(frames) == message


def test_command_frames_and_statuses() -> None:
    assert [c.frame for c in Command] == [b"INTR", b"RINTR", b"REQ", b"REP", b"PING", b"PONG"]
    assert Command.REQ == "REQ"
    assert sada.status_frame(Status.OK) == b"200"
    assert sada.status_frame(404) == b"404"
    for bad in (99, 600, "200", None):
        with pytest.raises(ValueError):
            sada.status_frame(bad)  # type: ignore[arg-type]


def test_prose_signature_is_accepted_on_input() -> None:
    """The prose says "SADA" then the octet %x01; the drawings say "SADA1". Both decode."""
    assert decode([b"", b"SADA\x01", b"PING"]) == Ping()
    assert encode(Ping())[1] == b"SADA1"


def test_fast_parsers_agree_with_decode() -> None:
    req = GOLDEN[2][1]
    assert parse_req(req) == tuple(getattr(GOLDEN[2][0], f) for f in
                                   ("request_id", "service", "version", "category", "action",
                                    "payload"))
    assert parse_rep(GOLDEN[3][1]) == (b"12345678", 200, PAYLOAD)


BAD = [
    ([], "too short"),
    ([b"", b"SADA1"], "too short"),
    ([b"x", b"SADA1", b"PING"], "delimiter"),
    ([b"", b"SADA2", b"PING"], "version"),
    ([b"", b"ZRE", b"PING"], "not a SADA1"),
    ([b"", b"SADA1", b"HELLO"], "unknown command"),
    ([b"", b"SADA1", b"ping"], "unknown command"),
    ([b"", b"SADA1", b"PING", b"extra"], "PING has 1"),
    ([b"", b"SADA1", b"RINTR", b""], "RINTR"),
    ([b"", b"SADA1", b"INTR", b"lonely-name"], "odd"),
    ([b"", b"SADA1", b"INTR", b"", b"1"], "empty service name"),
    ([b"", b"SADA1", b"INTR", b"svc", b""], "empty service version"),
    ([b"", b"SADA1", b"INTR", b"\xff", b"1"], "UTF-8"),
    ([b"", b"SADA1", b"INTR", b"x" * 256, b"1"], "exceeds"),
    ([b"", b"SADA1", b"REQ", b"id", b"s", b"1", b"", b"a"], "REQ has 5"),
    ([b"", b"SADA1", b"REQ", b"id", b"s", b"1", b"", b"a", b"p", b"q"], "REQ has 7"),
    ([b"", b"SADA1", b"REQ", b"", b"s", b"1", b"", b"a", b"p"], "request id"),
    ([b"", b"SADA1", b"REQ", b"i" * 256, b"s", b"1", b"", b"a", b"p"], "request id"),
    ([b"", b"SADA1", b"REQ", b"id", b"", b"1", b"", b"a", b"p"], "empty service name"),
    ([b"", b"SADA1", b"REQ", b"id", b"s", b"1", b"", b"", b"p"], "empty action name"),
    ([b"", b"SADA1", b"REQ", b"id", b"s", b"\xc3", b"", b"a", b"p"], "UTF-8"),
    ([b"", b"SADA1", b"REP", b"id", b"200"], "REP has 2"),
    ([b"", b"SADA1", b"REP", b"id", b"2000", b"p"], "three ASCII digits"),
    ([b"", b"SADA1", b"REP", b"id", b"20x", b"p"], "three ASCII digits"),
    ([b"", b"SADA1", b"REP", b"id", b"\xd9\xa2\xd9", b"p"], "three ASCII digits"),
    ([b"", b"SADA1", b"REP", b"id", b"099", b"p"], "outside 100-599"),
    ([b"", b"SADA1", b"REP", b"id", b"600", b"p"], "outside 100-599"),
    ([b"", b"SADA1", b"REP", b"", b"200", b"p"], "request id"),
    ([b"", b"SADA1", 5, b"x"], "bytes"),
    ([b"", "SADA1", b"PING"], "bytes"),
    (None, "bytes"),
]


@pytest.mark.parametrize("frames, reason", BAD)
def test_malformed_commands_raise_protocol_error(frames: object, reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frames)  # type: ignore[arg-type]
    assert reason in info.value.reason


def test_encode_rejects_bad_fields() -> None:
    with pytest.raises(ValueError):
        encode(Req(b"", "s", "1", "", "a", b""))
    with pytest.raises(ValueError):
        encode(Req(b"r", "", "1", "", "a", b""))
    with pytest.raises(ValueError):
        encode(Intr((ServiceId("s" * 256, "1"),)))
    with pytest.raises(TypeError):
        encode(Req(b"r", "s", "1", "", "a", "text"))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode(Rep(b"r", 700, b""))
    with pytest.raises(TypeError):
        encode(("REQ",))  # type: ignore[arg-type]


def test_accepts_bytearray_and_memoryview_frames() -> None:
    frames = [bytearray(f) if i % 2 else memoryview(f) for i, f in enumerate(GOLDEN[2][1])]
    assert decode(frames) == GOLDEN[2][0]


# --------------------------------------------------------------------------
# Properties

text = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 255)
maybe_empty = st.text(max_size=40)
rid = st.binary(min_size=1, max_size=64)
messages = st.one_of(
    st.builds(Req, rid, text, text, maybe_empty, text, st.binary(max_size=200)),
    st.builds(Rep, rid, st.integers(100, 599), st.binary(max_size=200)),
    st.builds(Intr, st.lists(st.builds(ServiceId, text, text), max_size=8).map(tuple)),
    st.just(Rintr()), st.just(Ping()), st.just(Pong()),
)


@given(messages)
def test_round_trip(message: sada.Message) -> None:
    assert decode(encode(message)) == message


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=20), max_size=12))
def test_random_frames_only_ever_raise_protocol_error(frames: list[bytes]) -> None:
    try:
        decode(frames)
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(messages, st.data())
def test_mutated_frames_only_ever_raise_protocol_error(message: sada.Message,
                                                       data: st.DataObject) -> None:
    frames = encode(message)
    op = data.draw(st.sampled_from(["truncate", "drop", "flip", "extend"]))
    if op == "truncate":
        frames = frames[:data.draw(st.integers(0, len(frames)))]
    elif op == "drop" and frames:
        del frames[data.draw(st.integers(0, len(frames) - 1))]
    elif op == "flip":
        i = data.draw(st.integers(0, len(frames) - 1))
        frames[i] = data.draw(st.binary(max_size=12))
    else:
        frames.append(data.draw(st.binary(max_size=8)))
    try:
        decoded = decode(frames)
    except ProtocolError:
        return
    if frames[1] == b"SADA\x01":      # the prose's spelling decodes; encode writes "SADA1"
        frames[1] = b"SADA1"
    assert encode(decoded) == frames
