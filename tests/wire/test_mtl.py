"""Tests for the 11/MTL codec (/work/shared/specs/mtl-11.txt).

The control examples are the spec's own JSON, copied from its text; the data
headers were written by hand from its field list, not produced by ``encode``:

    header = type (1 octet) *field
    integer = 8 octets big-endian, shortint = 2, boolean = 1 (0 or 1),
    short string = 1 length octet + text, table = shortint length + msgpack map
"""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.wire import mtl
from peermesh.wire.mtl import (Authorize, Challenged, Confirm, Content, DataLease, Direction,
                               Dismiss, Failure, InvalidRequest, Lease, LeaseRequest, Ok, Open,
                               Ping, Pong, Ready, Reject, Response, SelectProfile, Summon,
                               Unauthorized, content_frames, decode_data, decode_reply,
                               decode_request, encode_data, encode_reply, encode_request)

# --- control flow: the spec's examples -------------------------------------

SPEC_OPEN = b"""{
    "protocol": {
        "name": "MTL",
        "version": 1
    },
    "virtual-host": "test-env"
}"""

SPEC_AUTHORIZE = b"""{
    "mechanism" : "PLAIN",
    "response" : "AHVzZXIAcGFzcw=="
}"""


def test_spec_open_example() -> None:
    assert decode_request([b"Connection.Open", SPEC_OPEN]) == Open("test-env", "MTL", 1)


@pytest.mark.parametrize("name", [b"connection.open", b"CONNECTION.OPEN", b"CoNnEcTiOn.OpEn"])
def test_command_names_are_case_insensitive(name: bytes) -> None:
    assert decode_request([name, SPEC_OPEN]) == Open("test-env")


def test_spec_authorize_example() -> None:
    assert decode_request([b"Connection.Authorize", SPEC_AUTHORIZE]) == \
        Authorize("PLAIN", b"\x00user\x00pass")


def test_spec_profile_and_lease_examples() -> None:
    assert decode_request([b"Connection.Profile", b'{ "profile" : "test" }']) == \
        SelectProfile("test")
    reader = b'{"resources": [ "a", "b"], "confirm": "none"}'
    writer = b'{"resources": [], "confirm": "FULL"}'
    assert decode_request([b"Connection.Reader", reader]) == \
        LeaseRequest(Direction.READ, ("a", "b"), "none")
    assert decode_request([b"Connection.Writer", writer]) == \
        LeaseRequest(Direction.WRITE, (), "full")
    assert decode_request([b"connection.writer", b"{}"]) == LeaseRequest(Direction.WRITE)


def test_spec_reply_examples() -> None:
    ready = b'{"status": "Ready", "profiles": [ "test", "mesh" ]}'
    unauthorized = b'{"status": "Unauthorized", "mechanisms": [ "SCRAM-SHA-256", "PLAIN" ]}'
    challenged = b'{"status": "Challenged", "mechanism": "SCRAM-SHA-256", "challenge" : "cj0x"}'
    assert decode_reply([b"201", ready]) == Ready(("test", "mesh"))
    assert decode_reply([b"401", unauthorized]) == Unauthorized(("SCRAM-SHA-256", "PLAIN"))
    assert decode_reply([b"402", challenged]) == Challenged("SCRAM-SHA-256", b"r=1")
    assert decode_reply([b"200", b'{"status": "OK"}']) == Ok()
    assert decode_reply([b"501", b'{"status": "Not implemented"}']) == Failure(501)
    # the spec's 202 example is not JSON (no comma after the port): peermesh's is
    assert decode_reply([b"202", b'{"status": "Data Lease", "port": 5555, "lease": "L1"}']) \
        == DataLease(5555, "L1")
    with pytest.raises(ProtocolError):
        decode_reply([b"202", b'{"status": "Data Lease", "port": 5555\n"lease": "L1"}'])


REPLY_GOLDEN = [
    (Ok(), [b"200", b'{"status":"OK"}']),
    (Ready(("test",)), [b"201", b'{"status":"Ready","profiles":["test"]}']),
    (Ready((), b"v=x", ("tcp://127.0.0.1:1",)),
     [b"201", b'{"status":"Ready","profiles":[],"additional":"dj14",'
              b'"gateways":["tcp://127.0.0.1:1"]}']),
    (DataLease(5555, "abc"), [b"202", b'{"status":"Data Lease","port":5555,"lease":"abc"}']),
    (Unauthorized(("SCRAM-SHA-256",)),
     [b"401", b'{"status":"Unauthorized","mechanisms":["SCRAM-SHA-256"]}']),
    (Unauthorized(("PLAIN",), "wrong"),
     [b"401", b'{"status":"Unauthorized","mechanisms":["PLAIN"],"reason":"wrong"}']),
    (Challenged("SCRAM-SHA-256", b"\x00\xff"),
     [b"402", b'{"status":"Challenged","mechanism":"SCRAM-SHA-256","challenge":"AP8="}']),
    (Failure(501), [b"501", b'{"status":"Not implemented"}']),
    (Failure(400, "no"), [b"400", b'{"status":"Bad Request","reason":"no"}']),
    (Failure(403, "ro"), [b"403", b'{"status":"Forbidden","reason":"ro"}']),
]


@pytest.mark.parametrize("reply, frames", REPLY_GOLDEN)
def test_reply_golden(reply: mtl.Reply, frames: list[bytes]) -> None:
    assert encode_reply(reply) == frames
    assert decode_reply(frames) == reply


REQUEST_GOLDEN = [
    (Open("vh"), [b"Connection.Open",
                  b'{"protocol":{"name":"MTL","version":1},"virtual-host":"vh"}']),
    (Authorize("PLAIN", b"\x00u\x00p"),
     [b"Connection.Authorize", b'{"mechanism":"PLAIN","response":"AHUAcA=="}']),
    (SelectProfile("mesh"), [b"Connection.Profile", b'{"profile":"mesh"}']),
    (LeaseRequest(Direction.READ, ("a",), "full"),
     [b"Connection.Reader", b'{"resources":["a"],"confirm":"full"}']),
    (LeaseRequest(Direction.WRITE), [b"Connection.Writer", b'{"resources":[],"confirm":"none"}']),
]


@pytest.mark.parametrize("request_, frames", REQUEST_GOLDEN)
def test_request_golden(request_: mtl.Request, frames: list[bytes]) -> None:
    assert encode_request(request_) == frames
    assert decode_request(frames) == request_


# --- control flow: ill-formed (dropped) versus invalid (answered) -----------

ILL_FORMED_REQUESTS = [
    [],                                              # no frames
    [b"Connection.Open"],                            # one frame
    [b"Connection.Open", SPEC_OPEN, b""],            # three frames
    [b"Connection.Open", b"{not json"],              # not JSON
    [b"Connection.Open", b"\xff\xfe"],               # not UTF-8
    [b"\xff", b"{}"],                                # command not UTF-8
    [b"", b"{}"],                                    # empty command
    [b"Connection\x00Open", b"{}"],                  # unprintable command
    [b"x" * 256, b"{}"],                             # command too long
    [b"Connection.Open", b" " * (mtl.MAX_REQUEST + 1)],  # over the bound
    [b"Connection.Open", b"[" * 100_000],            # nesting past the recursion limit
    ["Connection.Open", "{}"],                       # str frames
    [b"Connection.Open", 7],                         # not bytes
    b"Connection.Open",                              # one byte string
    None,                                            # not a list
]


@pytest.mark.parametrize("frames", ILL_FORMED_REQUESTS)
def test_ill_formed_requests_raise_protocol_error(frames: object) -> None:
    with pytest.raises(ProtocolError):
        decode_request(frames)  # type: ignore[arg-type]


INVALID_REQUESTS = [
    [b"Connection.Close", b"{}"],                                      # unknown command
    [b"Connection.Open", b"[]"],                                       # JSON, not an object
    [b"Connection.Open", b"{}"],                                       # fields missing
    [b"Connection.Open", b'{"protocol": "MTL", "virtual-host": "x"}'],
    [b"Connection.Open", b'{"protocol": {"name": "MTL", "version": "1"}, "virtual-host": "x"}'],
    [b"Connection.Open", b'{"protocol": {"name": "MTL", "version": true}, "virtual-host": "x"}'],
    [b"Connection.Authorize", b'{"mechanism": "PLAIN", "response": "***"}'],
    [b"Connection.Authorize", b'{"response": ""}'],
    [b"Connection.Profile", b'{"profile": 1}'],
    [b"Connection.Reader", b'{"resources": "a"}'],
    [b"Connection.Reader", b'{"resources": [1]}'],
    [b"Connection.Reader", b'{"resources": [""]}'],
    [b"Connection.Reader", b'{"resources": ["a\\u0000"]}'],
    [b"Connection.Reader", json.dumps({"resources": ["x" * 256]}).encode()],
    [b"Connection.Reader", b'{"resources": ["a", "a"]}'],
    [b"Connection.Reader", json.dumps({"resources": [str(i) for i in range(1025)]}).encode()],
    [b"Connection.Writer", b'{"confirm": 1}'],
]


@pytest.mark.parametrize("frames", INVALID_REQUESTS)
def test_invalid_requests_are_returned_not_raised(frames: list[bytes]) -> None:
    result = decode_request(frames)
    assert isinstance(result, InvalidRequest)
    assert result.reason


@pytest.mark.parametrize("frames", [
    [b"20", b"{}"], [b"600", b"{}"], [b"199", b"{}"], [b"2x0", b"{}"], [b"200", b"[]"],
    [b"200", b"nope"], [b"202", b'{"port": 0, "lease": "x"}'], [b"202", b'{"lease": "x"}'],
    [b"401", b'{"mechanisms": [1]}'], [b"402", b'{"challenge": "AA=="}'],
    [b"402", b'{"mechanism": "X", "challenge": "!"}'], [b"201", b'{"additional": 5}'],
    [b"200"], [b"200", "{}"],
])
def test_malformed_replies(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        decode_reply(frames)


# --- data flow: golden headers ------------------------------------------------

SEQ = bytes.fromhex("0000000000000102")  # integer 258, eight octets big-endian

DATA_GOLDEN = [
    (Lease(258, "L1"), [b"\x01" + SEQ + b"\x02L1", b""]),
    (Response(258, 200), [b"\x02" + SEQ, b"200"]),
    (Response(1, 403), [b"\x02" + bytes(7) + b"\x01", b"403"]),
    (Summon(258, "news"), [b"\x03" + SEQ + b"\x04news", b""]),
    (Dismiss(258, "news"), [b"\x04" + SEQ + b"\x04news", b""]),
    (Content(258, "", b"hello"), [b"\x05" + SEQ + b"\x00" + b"\x00\x00", b"hello"]),
    (Content(258, "n", b"", {"a": 1}),
     [b"\x05" + SEQ + b"\x01n" + b"\x00\x04" + b"\x81\xa1a\x01", b""]),  # fixmap{fixstr a: 1}
    (Content(2**64 - 1, "é", b"\x00"),
     [b"\x05" + b"\xff" * 8 + b"\x02\xc3\xa9\x00\x00", b"\x00"]),
    (Confirm(258, True), [b"\x06" + SEQ + b"\x01", b""]),
    (Confirm(0, False), [b"\x06" + bytes(8) + b"\x00", b""]),
    (Reject(258, False, True), [b"\x07" + SEQ + b"\x00\x01", b""]),
    (Reject(258, True, False), [b"\x07" + SEQ + b"\x01\x00", b""]),
    (Ping(), [b"\x08", b""]),
    (Pong(), [b"\x09", b""]),
]


@pytest.mark.parametrize("command, frames", DATA_GOLDEN)
def test_data_golden(command: mtl.DataCommand, frames: list[bytes]) -> None:
    assert encode_data(command) == frames
    assert decode_data(frames) == command


def test_content_frames_hot_path_matches_encode() -> None:
    assert content_frames(258, b"\x04news", b"x") == encode_data(Content(258, "news", b"x"))


def test_unused_body_is_ignored() -> None:
    assert decode_data([b"\x08", b"anything"]) == Ping()
    assert decode_data([bytearray(b"\x01" + SEQ + b"\x00"), memoryview(b"")]) == Lease(258, "")


ILL_FORMED_DATA = [
    [b"\x08"],                                       # one frame
    [b"\x08", b"", b""],                             # three frames
    [b"", b""],                                      # empty header
    [b"\x0a", b""],                                  # unknown type
    [b"\x00", b""],
    [b"\x01" + SEQ[:4], b""],                        # truncated integer
    [b"\x01" + SEQ, b""],                            # missing short string
    [b"\x01" + SEQ + b"\x05abc", b""],               # short string past the end
    [b"\x01" + SEQ + b"\x01a!", b""],                # octets after the fields
    [b"\x03" + SEQ + b"\x02\xff\xfe", b""],          # not UTF-8
    [b"\x03" + SEQ + b"\x01\n", b""],                # unprintable
    [b"\x05" + SEQ + b"\x00", b""],                  # missing table
    [b"\x05" + SEQ + b"\x00\x00\x05\x80", b""],      # table length mismatch
    [b"\x05" + SEQ + b"\x00\x00\x01\x01", b""],      # table not a map
    [b"\x05" + SEQ + b"\x00\x00\x03\x81\x01\x01", b""],  # non-string key
    [b"\x05" + SEQ + b"\x00\x00\x01\xc1", b""],      # not msgpack (reserved 0xc1)
    [b"\x05" + SEQ + b"\x00\x00\x05\x81\xa1a\xd4\x03", b""],  # truncated ext
    [b"\x05" + SEQ + b"\x00\x00\x06\x81\xa1a\xd4\x03\x00", b""],  # extension type 3
    [b"\x06" + SEQ + b"\x02", b""],                  # boolean 2
    [b"\x06" + SEQ, b""],                            # missing boolean
    [b"\x07" + SEQ + b"\x01", b""],                  # missing recycle
    [b"\x07" + SEQ + b"\x01\x00\x00", b""],          # extra octet
    [b"\x02" + SEQ, b"20"],                          # response code not three digits
    [b"\x02" + SEQ, b"999"],
    [b"\x08\x00", b""],                              # Ping with a field
    ["\x08", b""],                                   # str frame
    [b"\x08", None],
    b"\x08",
    42,
]


@pytest.mark.parametrize("frames", ILL_FORMED_DATA)
def test_ill_formed_data_raises_protocol_error(frames: object) -> None:
    with pytest.raises(ProtocolError):
        decode_data(frames)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", [
    Lease(-1, "x"), Lease(2**64, "x"), Summon(1, "x" * 256), Summon(1, "a\nb"),
    Response(1, 99), Content(1, "", b"", {1: 2}),  # type: ignore[dict-item]
    Content(1, "", b"", {"k": b"x" * 70_000}),
    Content(1, "", b"", {"k": 2**64}), Content(1, "", b"", {"k": object()}),
])
def test_encode_refuses_what_cannot_go_on_the_wire(command: mtl.DataCommand) -> None:
    with pytest.raises(ValueError):
        encode_data(command)


# --- properties -------------------------------------------------------------

short_strings = st.text(st.characters(categories=("L", "N", "P", "S", "Zs")), max_size=60) \
    .filter(mtl.valid_string)
sequences = st.integers(0, mtl.MAX_INTEGER)
leaves = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=20) \
    | st.binary(max_size=20) | st.floats(allow_nan=False)
tables = st.dictionaries(st.text(max_size=10), st.recursive(
    leaves, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                        inner, max_size=3),
    max_leaves=8), max_size=4)
data_commands = st.one_of(
    st.builds(Lease, sequences, short_strings),
    st.builds(Response, sequences, st.integers(200, 599)),
    st.builds(Summon, sequences, short_strings),
    st.builds(Dismiss, sequences, short_strings),
    st.builds(Content, sequences, short_strings, st.binary(max_size=200), tables),
    st.builds(Confirm, sequences, st.booleans()),
    st.builds(Reject, sequences, st.booleans(), st.booleans()),
    st.just(Ping()), st.just(Pong()),
)


def _plain(value: object) -> object:
    """Tuples as lists: msgpack round-trips sequences as lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@given(data_commands)
def test_data_round_trip(command: mtl.DataCommand) -> None:
    decoded = decode_data(encode_data(command))
    if isinstance(command, Content):
        assert decoded == Content(command.sequence, command.resource, command.body,
                                  _plain(command.properties))  # type: ignore[arg-type]
    else:
        assert decoded == command


requests = st.one_of(
    st.builds(Open, st.text(max_size=20), st.text(max_size=5), st.integers(0, 10)),
    st.builds(Authorize, st.text(max_size=20), st.binary(max_size=50)),
    st.builds(SelectProfile, st.text(max_size=20)),
    st.builds(LeaseRequest, st.sampled_from(Direction),
              st.lists(short_strings.filter(bool), max_size=5, unique=True).map(tuple),
              st.sampled_from(["none", "full", "some"])),
)


@given(requests)
def test_request_round_trip(request_: mtl.Request) -> None:
    assert decode_request(encode_request(request_)) == request_


replies = st.one_of(
    st.just(Ok()),
    st.builds(Ready, st.lists(st.text(max_size=10), max_size=3).map(tuple),
              st.none() | st.binary(max_size=40), st.lists(st.text(max_size=10), max_size=2)
              .map(tuple)),
    st.builds(DataLease, st.integers(1, 65535), st.text(max_size=30)),
    st.builds(Unauthorized, st.lists(st.text(max_size=10), max_size=3).map(tuple),
              st.text(max_size=10)),
    st.builds(Challenged, st.text(max_size=10), st.binary(max_size=50)),
    st.builds(Failure, st.sampled_from([400, 403, 429, 500, 501, 503]), st.text(max_size=20)),
)


@given(replies)
def test_reply_round_trip(reply: mtl.Reply) -> None:
    assert decode_reply(encode_reply(reply)) == reply


frame_lists = st.lists(st.binary(max_size=40), max_size=4)


@settings(max_examples=300)
@given(frame_lists)
def test_decoders_raise_only_protocol_error(frames: list[bytes]) -> None:
    for decode in (decode_data, decode_reply):
        try:
            decode(frames)
        except ProtocolError:
            pass
    try:
        decode_request(frames)
    except ProtocolError:
        pass


@settings(max_examples=300)
@given(st.sampled_from([c.value for c in mtl.DataType]), st.binary(max_size=40),
       st.binary(max_size=5))
def test_typed_headers_raise_only_protocol_error(kind: int, rest: bytes, body: bytes) -> None:
    try:
        decode_data([bytes((kind,)) + rest, body])
    except ProtocolError:
        pass


@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.integers(-2**63, 2**64 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3), max_leaves=6),
    max_size=4), st.binary(max_size=8))
def test_mutated_tables_raise_only_protocol_error(table: dict, noise: bytes) -> None:
    packed = msgpack.packb(table) + noise
    header = b"\x05" + SEQ + b"\x00" + len(packed).to_bytes(2, "big") + packed
    try:
        decode_data([header, b""])
    except ProtocolError:
        pass


# --- the hot paths' data-command helpers ---------------------------------------------

@given(st.integers(0, 2**64 - 1), st.integers(200, 599))
def test_data_helpers_match_the_codec(sequence: int, code: int) -> None:
    from peermesh.wire import mtl
    assert mtl.response_frames(sequence, code) == encode_data(Response(sequence, code))
    assert decode_data(mtl.response_frames(sequence, code)) == Response(sequence, code)
    head = mtl.pack_command_head(5, sequence)
    assert len(head) == mtl.COMMAND_HEAD_SIZE and head[:1] == mtl.CONTENT_TYPE
    assert content_frames(sequence, b"\x01r", b"body")[0] == head + b"\x01r" + mtl.EMPTY_TABLE
    assert mtl.PING_FRAMES == encode_data(Ping()) and mtl.PONG_FRAMES == encode_data(Pong())
