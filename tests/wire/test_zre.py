"""Tests for the ZRE v2 codec (spec 36/ZRE, /work/shared/specs/zre-36.txt).

The golden frames below were written by hand from the spec grammar, not produced
by calling ``encode``:

    command frame = %xAA %xA1 | id (1) | version %x02 | sequence (2, big-endian) | fields
    string     = number-1 length (UTF-8 octets) + text
    longstr    = number-4 length (UTF-8 octets) + text
    strings    = number-4 count + count * longstr
    dictionary = number-4 count + count * (string key, longstr value)
    content    = the frames after frame 0 (WHISPER and SHOUT only)
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.wire.zre import (
    Beacon,
    Hello,
    Join,
    Leave,
    Ping,
    PingOk,
    Shout,
    Unknown,
    Elect,
    Leader,
    Goodbye,
    PeerExchange,
    PEX,
    Whisper,
    decode,
    decode_beacon,
    encode,
    encode_beacon,
    encode_string,
    next_sequence,
    shout_header,
    shouts,
)

UUID = bytes.fromhex("00112233445566778899aabbccddeeff")

# --------------------------------------------------------------------------
# Golden bytes: beacon
# --------------------------------------------------------------------------

BEACON_GOLDEN = [
    (
        Beacon(UUID, 0xC001),
        b"ZRE\x01"                                    # header: 'Z' 'R' 'E' %x01
        + bytes.fromhex("00112233445566778899aabbccddeeff")  # UUID, 16 octets
        + b"\xc0\x01",                                 # mailbox port 49153, network order
    ),
    (
        Beacon(UUID, 0),                               # port 0: the peer is leaving
        bytes.fromhex("5a524501" "00112233445566778899aabbccddeeff" "0000"),
    ),
    (
        Beacon(b"\xff" * 16, 0xFFFF),
        bytes.fromhex("5a524501" + "ff" * 16 + "ffff"),
    ),
    (
        Beacon(b"\x00" * 16, 5670),                    # 5670 = 0x1626
        bytes.fromhex("5a524501" + "00" * 16 + "1626"),
    ),
]


@pytest.mark.parametrize("beacon, wire", BEACON_GOLDEN)
def test_beacon_golden(beacon: Beacon, wire: bytes) -> None:
    assert len(wire) == 22
    assert encode_beacon(beacon) == wire
    assert decode_beacon(wire) == beacon


def test_beacon_accepts_bytearray_and_memoryview() -> None:
    wire = BEACON_GOLDEN[0][1]
    assert decode_beacon(bytearray(wire)) == BEACON_GOLDEN[0][0]
    assert decode_beacon(memoryview(wire)) == BEACON_GOLDEN[0][0]


# --------------------------------------------------------------------------
# Golden bytes: mailbox commands
# --------------------------------------------------------------------------

# HELLO with two groups, a status, a non-ASCII name and two headers.
HELLO_FULL = Hello(
    sequence=1,
    endpoint="tcp://192.168.1.10:49152",
    groups=("GLOBAL", "chat"),
    status=5,
    name="Zoë-東京",
    headers={"X-HELLO": "World", "X-ZYRE-PORT": "49152"},
)
HELLO_FULL_FRAME = (
    b"\xaa\xa1"                      # signature
    b"\x01"                          # command id: HELLO
    b"\x02"                          # version 2
    b"\x00\x01"                      # sequence 1
    b"\x18"                          # endpoint: string, 24 octets
    b"tcp://192.168.1.10:49152"
    b"\x00\x00\x00\x02"              # groups: strings, count 2
    b"\x00\x00\x00\x06" b"GLOBAL"    #   longstr, 6 octets
    b"\x00\x00\x00\x04" b"chat"      #   longstr, 4 octets
    b"\x05"                          # status 5
    b"\x0b"                          # name: string, 11 UTF-8 octets (6 characters)
    b"Zo" b"\xc3\xab" b"-"           #   'Z' 'o' U+00EB 'ë' (2 octets) '-'
    b"\xe6\x9d\xb1"                  #   U+6771 '東' (3 octets)
    b"\xe4\xba\xac"                  #   U+4EAC '京' (3 octets)
    b"\x00\x00\x00\x02"              # headers: dictionary, count 2
    b"\x07" b"X-HELLO"               #   key: string, 7 octets
    b"\x00\x00\x00\x05" b"World"     #   value: longstr, 5 octets
    b"\x0b" b"X-ZYRE-PORT"           #   key: string, 11 octets
    b"\x00\x00\x00\x05" b"49152"     #   value: longstr, 5 octets
)

# HELLO with every field empty.
HELLO_EMPTY = Hello(sequence=0, endpoint="", groups=(), status=0, name="", headers={})
HELLO_EMPTY_FRAME = bytes.fromhex(
    "aaa1"        # signature
    "01"          # HELLO
    "02"          # version
    "0000"        # sequence 0
    "00"          # endpoint ""
    "00000000"    # groups: count 0
    "00"          # status 0
    "00"          # name ""
    "00000000"    # headers: count 0
)

# HELLO whose header value and group are non-ASCII longstrs, sequence 65535, status 255.
HELLO_UNICODE = Hello(
    sequence=65535,
    endpoint="ipc://@/zre",
    groups=("été",),
    status=255,
    name="n",
    headers={"k": "€"},
)
HELLO_UNICODE_FRAME = bytes.fromhex(
    "aaa1" "01" "02"
    "ffff"                          # sequence 65535
    "0b" + b"ipc://@/zre".hex() +   # endpoint, 11 octets
    "00000001"                      # groups: count 1
    "00000005" "c3a974c3a9"         #   "été": c3a9 't' c3a9 = 5 octets
    "ff"                            # status 255
    "01" "6e"                       # name "n"
    "00000001"                      # headers: count 1
    "01" "6b"                       #   key "k"
    "00000003" "e282ac"             #   value "€" U+20AC = 3 octets
)

COMMAND_GOLDEN = [
    pytest.param(HELLO_FULL, [HELLO_FULL_FRAME], id="hello-full"),
    pytest.param(HELLO_EMPTY, [HELLO_EMPTY_FRAME], id="hello-empty"),
    pytest.param(HELLO_UNICODE, [HELLO_UNICODE_FRAME], id="hello-unicode"),
    pytest.param(
        Whisper(2, (b"hello", b"", b"\x00\xff\x01")),
        [
            b"\xaa\xa1\x02\x02\x00\x02",  # signature, WHISPER, version 2, sequence 2
            b"hello",                     # content frame 1
            b"",                          # content frame 2 (empty)
            b"\x00\xff\x01",              # content frame 3 (binary)
        ],
        id="whisper-multi",
    ),
    pytest.param(
        Whisper(0, ()),
        [bytes.fromhex("aaa1" "02" "02" "0000")],  # no content frames at all
        id="whisper-empty",
    ),
    pytest.param(
        Whisper(1, (b"x",)),
        [bytes.fromhex("aaa1" "02" "02" "0001"), b"x"],
        id="whisper-single",
    ),
    pytest.param(
        Shout(65535, "chat", (b"part-1", b"part-2")),
        [
            b"\xaa\xa1\x03\x02\xff\xff"   # signature, SHOUT, version 2, sequence 65535
            b"\x04chat",                  # group: string, 4 octets
            b"part-1",
            b"part-2",
        ],
        id="shout-multi",
    ),
    pytest.param(
        Shout(1, "東京", ()),
        [bytes.fromhex("aaa1" "03" "02" "0001" "06" "e69db1" "e4baac")],
        id="shout-unicode-no-content",
    ),
    pytest.param(
        Join(0, "GLOBAL", 1),
        [bytes.fromhex("aaa1" "04" "02" "0000" "06" + b"GLOBAL".hex() + "01")],
        id="join",
    ),
    pytest.param(
        Join(1, "", 0),
        [bytes.fromhex("aaa1" "04" "02" "0001" "00" "00")],
        id="join-empty-group",
    ),
    pytest.param(
        Leave(3, "chat", 255),
        [b"\xaa\xa1\x05\x02\x00\x03\x04chat\xff"],
        id="leave",
    ),
    pytest.param(
        Leave(65535, "Zoë", 7),
        [bytes.fromhex("aaa1" "05" "02" "ffff" "04" "5a6fc3ab" "07")],
        id="leave-unicode",
    ),
    pytest.param(Ping(0), [bytes.fromhex("aaa1" "06" "02" "0000")], id="ping-0"),
    pytest.param(Ping(1), [bytes.fromhex("aaa1" "06" "02" "0001")], id="ping-1"),
    pytest.param(Ping(65535), [bytes.fromhex("aaa1" "06" "02" "ffff")], id="ping-65535"),
    pytest.param(PingOk(0), [bytes.fromhex("aaa1" "07" "02" "0000")], id="ping-ok-0"),
    pytest.param(PingOk(1), [bytes.fromhex("aaa1" "07" "02" "0001")], id="ping-ok-1"),
    pytest.param(PingOk(65535), [bytes.fromhex("aaa1" "07" "02" "ffff")], id="ping-ok-65535"),
    # Zyre's three (zre_msg.xml): group and UUID as ``string`` fields
    pytest.param(Elect(7, "g", "0A" * 16),
                 [bytes.fromhex("aaa1" "08" "02" "0007" "01" "67" "20") + b"0A" * 16],
                 id="elect"),
    pytest.param(Leader(65535, "chat", "FF" * 16),
                 [bytes.fromhex("aaa1" "09" "02" "ffff" "04") + b"chat\x20" + b"FF" * 16],
                 id="leader"),
    pytest.param(Goodbye(3), [bytes.fromhex("aaa1" "0a" "02" "0003")], id="goodbye"),
    pytest.param(Unknown(7000, 11), [bytes.fromhex("aaa1" "0b" "02" "1b58")],
                 id="unknown-11"),
]


@pytest.mark.parametrize("message, frames", COMMAND_GOLDEN)
def test_command_golden(message, frames: list[bytes]) -> None:
    assert encode(message) == frames
    assert decode(frames) == message


def test_hello_golden_lengths_are_utf8_octets() -> None:
    # Cross-check of the hand-written frame: the name has 6 characters but 11 octets.
    assert len("Zoë-東京") == 6
    assert HELLO_FULL_FRAME.count(b"\x0bZo\xc3\xab-") == 1
    assert len(HELLO_FULL_FRAME) == 6 + 25 + 4 + 10 + 8 + 1 + 12 + 4 + 8 + 9 + 12 + 9


def test_decode_accepts_tuple_and_non_bytes_frames() -> None:
    frames = (bytearray(b"\xaa\xa1\x02\x02\x00\x02"), b"hello")
    assert decode(frames) == Whisper(2, (b"hello",))
    assert decode([memoryview(HELLO_FULL_FRAME)]) == HELLO_FULL


def test_unknown_command_keeps_sequence_with_body_and_content() -> None:
    # Commands this codec does not know may carry fields it does not parse.
    assert decode([b"\xaa\xa1\x0c\x02\x00\x2a" + b"\x05group\x00"]) == Unknown(42, 12)
    assert decode([b"\xaa\xa1\x0d\x02\xff\xff", b"extra"]) == Unknown(65535, 13)


@pytest.mark.parametrize("frames", [
    [b"\xaa\xa1\x08\x02\x00\x05"],                         # ELECT without its fields
    [b"\xaa\xa1\x08\x02\x00\x05\x01g"],                     # ELECT without a challenger
    [b"\xaa\xa1\x09\x02\x00\x05\x01g\x01A\x00"],            # LEADER with a trailing octet
    [b"\xaa\xa1\x09\x02\x00\x05\x01g\x01A", b"content"],    # LEADER with content
    [b"\xaa\xa1\x0a\x02\x00\x05\x00"],                      # GOODBYE with a field
])
def test_zyre_commands_malformed(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        decode(frames)


def test_next_sequence() -> None:
    assert next_sequence(0) == 1
    assert next_sequence(1) == 2
    assert next_sequence(65534) == 65535
    assert next_sequence(65535) == 0


def test_shouts_number_a_batch_and_wrap() -> None:
    group = encode_string("g")
    batch = shouts(65534, group, [b"a", b"b", b"c"])
    assert batch == [(shout_header(65534, group), b"a"), (shout_header(65535, group), b"b"),
                     (shout_header(0, group), b"c")]
    assert [decode(frames) for frames in batch] == [
        Shout(65534, "g", (b"a",)), Shout(65535, "g", (b"b",)), Shout(0, "g", (b"c",))]
    assert shouts(1, group, []) == []


# --------------------------------------------------------------------------
# Rejections
# --------------------------------------------------------------------------

VALID_BEACON = b"ZRE\x01" + UUID + b"\xc0\x01"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(VALID_BEACON[:21], id="21-octets"),
        pytest.param(VALID_BEACON + b"\x00", id="23-octets"),
        # Zyre's CURVE beacon: 'ZRE' %x03 + UUID + port + 32-octet public key = 54 octets.
        pytest.param(b"ZRE\x03" + UUID + b"\xc0\x01" + bytes(range(32)), id="54-octets-curve-v3"),
        pytest.param(b"ZRE\x01" + UUID + b"\xc0\x01" + bytes(range(32)), id="54-octets-v1-header"),
        pytest.param(b"ZRF\x01" + UUID + b"\xc0\x01", id="wrong-prefix"),
        pytest.param(b"zre\x01" + UUID + b"\xc0\x01", id="lowercase-prefix"),
        pytest.param(b"\x00RE\x01" + UUID + b"\xc0\x01", id="wrong-first-octet"),
        pytest.param(b"ZRE\x00" + UUID + b"\xc0\x01", id="version-0"),
        pytest.param(b"ZRE\x02" + UUID + b"\xc0\x01", id="version-2"),
        pytest.param(b"ZRE\x03" + UUID + b"\xc0\x01", id="version-3"),
        pytest.param(b"ZRE\xff" + UUID + b"\xc0\x01", id="version-255"),
    ],
)
def test_beacon_rejected(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_beacon(data)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 20, 21, 23, 24, 44, 54, 255, 1500])
def test_beacon_wrong_sizes_rejected(size: int) -> None:
    data = (VALID_BEACON * 100)[:size]
    with pytest.raises(ProtocolError):
        decode_beacon(data)


def test_empty_message_rejected() -> None:
    with pytest.raises(ProtocolError):
        decode([])
    with pytest.raises(ProtocolError):
        decode(())


@pytest.mark.parametrize("frame", [b"", b"\xaa", b"\xaa\xa1", b"\xaa\xa1\x06", b"\xaa\xa1\x06\x02",
                                   b"\xaa\xa1\x06\x02\x00"])
def test_short_header_rejected(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode([frame])
    with pytest.raises(ProtocolError):
        decode([frame, b"content"])


def test_every_truncation_of_hello_rejected() -> None:
    for frame in (HELLO_FULL_FRAME, HELLO_EMPTY_FRAME, HELLO_UNICODE_FRAME):
        for length in range(len(frame)):
            with pytest.raises(ProtocolError):
                decode([frame[:length]])


@pytest.mark.parametrize("frame", [
    b"\xaa\xa1\x03\x02\xff\xff\x04chat",        # SHOUT
    b"\xaa\xa1\x04\x02\x00\x00\x06GLOBAL\x01",  # JOIN
    b"\xaa\xa1\x05\x02\x00\x03\x04chat\xff",    # LEAVE
    b"\xaa\xa1\x06\x02\x00\x01",                # PING
    b"\xaa\xa1\x07\x02\x00\x01",                # PING_OK
    b"\xaa\xa1\x02\x02\x00\x01",                # WHISPER
])
def test_every_truncation_of_other_commands_rejected(frame: bytes) -> None:
    decode([frame])  # the full frame is valid
    for length in range(len(frame)):
        with pytest.raises(ProtocolError):
            decode([frame[:length]])


@pytest.mark.parametrize("signature", [b"\xaa\xa0", b"\xa1\xaa", b"\x00\x00", b"\xff\xff",
                                       b"\xab\xa1", b"ZR"])
@pytest.mark.parametrize("command", [1, 2, 3, 4, 5, 6, 7, 8, 11])
def test_wrong_signature_rejected(signature: bytes, command: int) -> None:
    valid = {
        1: HELLO_EMPTY_FRAME,
        2: bytes.fromhex("aaa1" "02" "02" "0001"),
        3: bytes.fromhex("aaa1" "03" "02" "0001" "00"),
        4: bytes.fromhex("aaa1" "04" "02" "0001" "00" "00"),
        5: bytes.fromhex("aaa1" "05" "02" "0001" "00" "00"),
        6: bytes.fromhex("aaa1" "06" "02" "0001"),
        7: bytes.fromhex("aaa1" "07" "02" "0001"),
        8: bytes.fromhex("aaa1" "08" "02" "0001" "01" "67" "01" "41"),
        11: bytes.fromhex("aaa1" "0b" "02" "0001"),
    }[command]
    decode([valid])
    with pytest.raises(ProtocolError):
        decode([signature + valid[2:]])


def test_hello_with_version_1_rejected() -> None:
    # AA A1 | 01 (HELLO) | 01 (version 1) | 00 01 (sequence 1): a 6-octet frame.
    with pytest.raises(ProtocolError):
        decode([bytes.fromhex("aa a1 01 01 00 01")])


@pytest.mark.parametrize("version", [0, 1, 3, 0x20, 0xFF])
@pytest.mark.parametrize("command", [1, 2, 3, 4, 5, 6, 7, 8])
def test_wrong_version_rejected(version: int, command: int) -> None:
    frame = bytes([0xAA, 0xA1, command, version, 0x00, 0x01])
    with pytest.raises(ProtocolError):
        decode([frame])
    # ...even when the rest of a valid HELLO follows the header
    with pytest.raises(ProtocolError):
        decode([HELLO_FULL_FRAME[:3] + bytes([version]) + HELLO_FULL_FRAME[4:]])


@pytest.mark.parametrize("frame", [
    pytest.param(HELLO_FULL_FRAME + b"\x00", id="hello"),
    pytest.param(HELLO_EMPTY_FRAME + b"garbage", id="hello-empty"),
    pytest.param(b"\xaa\xa1\x02\x02\x00\x01" + b"\x00", id="whisper"),
    pytest.param(b"\xaa\xa1\x03\x02\x00\x01\x04chat" + b"!", id="shout"),
    pytest.param(b"\xaa\xa1\x04\x02\x00\x01\x04chat\x01" + b"\x00", id="join"),
    pytest.param(b"\xaa\xa1\x05\x02\x00\x01\x04chat\x01" + b"\x01\x02", id="leave"),
    pytest.param(b"\xaa\xa1\x06\x02\x00\x01" + b"\x00", id="ping"),
    pytest.param(b"\xaa\xa1\x07\x02\x00\x01" + b"\xff", id="ping-ok"),
])
def test_trailing_garbage_rejected(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode([frame])


@pytest.mark.parametrize("bad", [
    b"\xff",              # never valid in UTF-8
    b"\xc3",              # truncated 2-octet sequence
    b"\xc0\x80",          # overlong encoding of NUL
    b"\xed\xa0\x80",      # encoded surrogate U+D800
    b"\xe6\x9d",          # truncated 3-octet sequence
    b"\x80abc",           # lone continuation octet
])
def test_invalid_utf8_rejected(bad: bytes) -> None:
    n1 = bytes([len(bad)])
    n4 = len(bad).to_bytes(4, "big")
    frames = [
        # JOIN / LEAVE / SHOUT group (string)
        [b"\xaa\xa1\x04\x02\x00\x01" + n1 + bad + b"\x01"],
        [b"\xaa\xa1\x05\x02\x00\x01" + n1 + bad + b"\x01"],
        [b"\xaa\xa1\x03\x02\x00\x01" + n1 + bad, b"content"],
        # HELLO endpoint (string)
        [b"\xaa\xa1\x01\x02\x00\x01" + n1 + bad + b"\x00\x00\x00\x00" b"\x00" b"\x00"
         b"\x00\x00\x00\x00"],
        # HELLO group (longstr in strings)
        [b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x01" + n4 + bad + b"\x00" b"\x00"
         b"\x00\x00\x00\x00"],
        # HELLO name (string)
        [b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x00" b"\x00" + n1 + bad
         + b"\x00\x00\x00\x00"],
        # HELLO header key (string)
        [b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x00" b"\x00" b"\x00"
         b"\x00\x00\x00\x01" + n1 + bad + b"\x00\x00\x00\x00"],
        # HELLO header value (longstr)
        [b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x00" b"\x00" b"\x00"
         b"\x00\x00\x00\x01" b"\x01k" + n4 + bad],
    ]
    for message in frames:
        with pytest.raises(ProtocolError):
            decode(message)


def test_invalid_utf8_templates_are_otherwise_valid() -> None:
    # The same templates as above with valid text decode fine, so the rejections
    # above are caused by the UTF-8 alone.
    assert decode([b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x00" b"\x00" b"\x00"
                   b"\x00\x00\x00\x01" b"\x01k" b"\x00\x00\x00\x01v"]) == Hello(1, "", (), 0, "",
                                                                             {"k": "v"})
    assert decode([b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x01" b"\x00\x00\x00\x01g"
                   b"\x00" b"\x00" b"\x00\x00\x00\x00"]) == Hello(1, "", ("g",), 0, "", {})


@pytest.mark.parametrize("count", [1, 2, 3, 0x7FFFFFFF, 0xFFFFFFFF])
def test_strings_count_larger_than_frame_rejected(count: int) -> None:
    # groups claims `count` entries but the frame holds none (or fewer).
    frame = (b"\xaa\xa1\x01\x02\x00\x01" b"\x00" + count.to_bytes(4, "big")
             + b"\x00\x00\x00\x00" * min(count - 1, 2) + b"\x00" b"\x00" b"\x00\x00\x00\x00")
    with pytest.raises(ProtocolError):
        decode([frame])


@pytest.mark.parametrize("count", [1, 2, 0x7FFFFFFF, 0xFFFFFFFF])
def test_dictionary_count_larger_than_frame_rejected(count: int) -> None:
    frame = (b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x00" b"\x00" b"\x00"
             + count.to_bytes(4, "big") + b"\x01k\x00\x00\x00\x01v")
    if count == 1:
        frame = frame[:-1]  # the one entry is itself truncated
    with pytest.raises(ProtocolError):
        decode([frame])


def test_huge_longstr_length_rejected() -> None:
    frame = (b"\xaa\xa1\x01\x02\x00\x01" b"\x00" b"\x00\x00\x00\x01" b"\xff\xff\xff\xff" b"abc")
    with pytest.raises(ProtocolError):
        decode([frame])


@pytest.mark.parametrize("frame", [
    pytest.param(HELLO_FULL_FRAME, id="hello"),
    pytest.param(b"\xaa\xa1\x04\x02\x00\x00\x06GLOBAL\x01", id="join"),
    pytest.param(b"\xaa\xa1\x05\x02\x00\x00\x06GLOBAL\x01", id="leave"),
    pytest.param(b"\xaa\xa1\x06\x02\x00\x00", id="ping"),
    pytest.param(b"\xaa\xa1\x07\x02\x00\x00", id="ping-ok"),
])
@pytest.mark.parametrize("content", [[b"x"], [b""], [b"a", b"b"]])
def test_content_frames_on_non_content_commands_rejected(frame: bytes,
                                                         content: list[bytes]) -> None:
    decode([frame])
    with pytest.raises(ProtocolError):
        decode([frame, *content])


def test_unknown_command_11_decodes() -> None:
    assert decode([b"\xaa\xa1\x0b\x02\x00\x05"]) == Unknown(5, 11)
    assert decode([b"\xaa\xa1\x0b\x02\xff\xff"]) == Unknown(65535, 11)


# --------------------------------------------------------------------------
# encode: string fields over 255 UTF-8 octets
# --------------------------------------------------------------------------

LONG_ASCII = "a" * 256
LONG_UTF8 = "é" * 128            # only 128 characters, but 256 octets
MAX_UTF8 = "é" * 127 + "a"       # exactly 255 octets: allowed


@pytest.mark.parametrize("text", [LONG_ASCII, LONG_UTF8, "東" * 86])
@pytest.mark.parametrize("build", [
    pytest.param(lambda s: Hello(1, "tcp://x:1", name=s), id="hello-name"),
    pytest.param(lambda s: Hello(1, s), id="hello-endpoint"),
    pytest.param(lambda s: Hello(1, "tcp://x:1", headers={s: "v"}), id="hello-header-key"),
    pytest.param(lambda s: Shout(1, s, (b"x",)), id="shout-group"),
    pytest.param(lambda s: Join(1, s, 0), id="join-group"),
    pytest.param(lambda s: Leave(1, s, 0), id="leave-group"),
])
def test_encode_rejects_long_string_fields(build, text: str) -> None:
    assert len(text.encode("utf-8")) > 255
    with pytest.raises(ValueError):
        encode(build(text))
    # 255 octets is the maximum and is accepted
    message = build(MAX_UTF8)
    assert decode(encode(message)) == message


def test_longstr_fields_are_not_limited_to_255_octets() -> None:
    message = Hello(1, "tcp://x:1", groups=(LONG_UTF8 * 3,), headers={"k": LONG_ASCII * 10})
    assert decode(encode(message)) == message


# --------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=300, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])
SECONDARY_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=100)

utf8_chars = st.characters(codec="utf-8")


def _fit_255(text: str) -> str:
    """Drop trailing characters until the UTF-8 form is at most 255 octets."""
    while len(text.encode("utf-8")) > 255:
        text = text[:-1]
    return text


# `string` fields: UTF-8 form of 0..255 octets, including near the boundary.
short_strings = st.one_of(
    st.text(utf8_chars, max_size=40),
    st.text(utf8_chars, min_size=60, max_size=260).map(_fit_255),
    st.text(st.sampled_from("aé東\U0001F600"), min_size=60, max_size=260).map(_fit_255),
)
# `longstr` fields: any text.
long_strings = st.text(utf8_chars, max_size=100)
sequences = st.integers(0, 0xFFFF)
statuses = st.integers(0, 0xFF)
contents = st.lists(st.binary(max_size=64), max_size=6).map(tuple)

hellos = st.builds(
    Hello,
    sequence=sequences,
    endpoint=short_strings,
    groups=st.lists(long_strings, max_size=4).map(tuple),
    status=statuses,
    name=short_strings,
    headers=st.dictionaries(short_strings, long_strings, max_size=4),
)
non_content_messages = st.one_of(
    hellos,
    st.builds(Join, sequence=sequences, group=short_strings, status=statuses),
    st.builds(Leave, sequence=sequences, group=short_strings, status=statuses),
    st.builds(Ping, sequence=sequences),
    st.builds(PingOk, sequence=sequences),
    st.builds(Elect, sequence=sequences, group=short_strings, challenger=short_strings),
    st.builds(Leader, sequence=sequences, group=short_strings, leader=short_strings),
    st.builds(Goodbye, sequence=sequences),
)
known_messages = st.one_of(
    non_content_messages,
    st.builds(Whisper, sequence=sequences, content=contents),
    st.builds(Shout, sequence=sequences, group=short_strings, content=contents),
)
messages = st.one_of(
    known_messages,
    st.builds(Unknown, sequence=sequences,
              command=st.integers(11, 255).filter(lambda c: c != PEX)),
    st.builds(PeerExchange, sequence=sequences, peers=st.lists(st.text(), max_size=5).map(tuple)),
)
beacons = st.builds(Beacon, uuid=st.binary(min_size=16, max_size=16), port=sequences)


@PROPERTY_SETTINGS
@given(messages)
def test_roundtrip(message) -> None:
    frames = encode(message)
    assert all(isinstance(frame, bytes) for frame in frames)
    assert decode(frames) == message


@SECONDARY_SETTINGS
@given(hellos)
def test_hello_roundtrip(message: Hello) -> None:
    decoded = decode(encode(message))
    assert decoded == message
    assert isinstance(decoded, Hello)
    assert list(decoded.headers.items()) == list(message.headers.items())


@PROPERTY_SETTINGS
@given(beacons)
def test_beacon_roundtrip(beacon: Beacon) -> None:
    wire = encode_beacon(beacon)
    assert len(wire) == 22 and wire[:4] == b"ZRE\x01"
    assert decode_beacon(wire) == beacon


def _decode_or_protocol_error(frames) -> None:
    try:
        result = decode(frames)
    except ProtocolError:
        return
    assert isinstance(result, (Hello, Whisper, Shout, Join, Leave, Ping, PingOk, Elect, Leader,
                               Goodbye, PeerExchange, Unknown))


def _decode_beacon_or_protocol_error(data: bytes) -> None:
    try:
        result = decode_beacon(data)
    except ProtocolError:
        return
    assert isinstance(result, Beacon)
    assert len(data) == 22


# Frame 0 candidates that often get past the signature/version checks.
header_like = st.builds(
    lambda command, version, sequence, rest: (bytes([0xAA, 0xA1, command, version])
                                              + sequence.to_bytes(2, "big") + rest),
    st.one_of(st.integers(1, 8), st.integers(0, 255)),
    st.sampled_from([2, 2, 2, 1, 0, 255]),
    sequences,
    st.binary(max_size=80),
)
any_frames = st.lists(st.one_of(st.binary(max_size=80), header_like), max_size=5)


@PROPERTY_SETTINGS
@given(any_frames)
def test_decode_arbitrary_frames_never_crashes(frames: list[bytes]) -> None:
    _decode_or_protocol_error(frames)


@PROPERTY_SETTINGS
@given(st.one_of(st.binary(max_size=64), st.binary(min_size=22, max_size=22),
                 st.binary(min_size=18, max_size=18).map(lambda b: b"ZRE\x01" + b)))
def test_decode_beacon_arbitrary_bytes_never_crashes(data: bytes) -> None:
    _decode_beacon_or_protocol_error(data)


@st.composite
def mutated_encodings(draw) -> list[bytes]:
    frames = encode(draw(messages))
    index = draw(st.integers(0, len(frames) - 1))
    frame = bytearray(frames[index])
    kind = draw(st.sampled_from(["truncate", "flip", "append", "combo"]))
    if kind in ("truncate", "combo") and frame:
        del frame[draw(st.integers(0, len(frame) - 1)):]
    if kind in ("flip", "combo") and frame:
        for _ in range(draw(st.integers(1, 4))):
            position = draw(st.integers(0, len(frame) - 1))
            frame[position] ^= draw(st.integers(1, 255))
    if kind in ("append", "combo"):
        frame += draw(st.binary(min_size=1, max_size=16))
    frames[index] = bytes(frame)
    if draw(st.booleans()):
        frames.extend(draw(st.lists(st.binary(max_size=8), max_size=2)))
    return frames


@PROPERTY_SETTINGS
@given(mutated_encodings())
def test_decode_mutated_encodings_never_crashes(frames: list[bytes]) -> None:
    _decode_or_protocol_error(frames)


@SECONDARY_SETTINGS
@given(hellos, st.data())
def test_truncated_hello_always_rejected(message: Hello, data) -> None:
    frame = encode(message)[0]
    length = data.draw(st.integers(0, len(frame) - 1))
    with pytest.raises(ProtocolError):
        decode([frame[:length]])


@PROPERTY_SETTINGS
@given(beacons, st.data())
def test_mutated_beacon_never_crashes(beacon: Beacon, data) -> None:
    wire = bytearray(encode_beacon(beacon))
    kind = data.draw(st.sampled_from(["truncate", "flip", "append"]))
    if kind == "truncate":
        del wire[data.draw(st.integers(0, 21)):]
    elif kind == "flip":
        wire[data.draw(st.integers(0, 21))] ^= data.draw(st.integers(1, 255))
    else:
        wire += data.draw(st.binary(min_size=1, max_size=40))
    if kind != "flip":
        with pytest.raises(ProtocolError):
            decode_beacon(bytes(wire))
    else:
        _decode_beacon_or_protocol_error(bytes(wire))


@SECONDARY_SETTINGS
@given(non_content_messages,
       st.lists(st.binary(max_size=8), min_size=1, max_size=3))
def test_content_frames_rejected_on_non_content_commands(message, content) -> None:
    with pytest.raises(ProtocolError):
        decode(encode(message) + content)


@SECONDARY_SETTINGS
@given(known_messages, st.binary(min_size=1, max_size=8))
def test_trailing_bytes_rejected(message, extra: bytes) -> None:
    frames = encode(message)
    with pytest.raises(ProtocolError):
        decode([frames[0] + extra, *frames[1:]])


def test_pex_golden_bytes():
    # pex = signature %x50 version sequence peers; peers = strings (number-4 count, longstrs)
    entry = "0123456789abcdef0123456789abcdef tcp://10.0.0.5:49200"
    frame = (bytes.fromhex("aaa1" "50" "02" "0003") + bytes.fromhex("00000001")
             + len(entry).to_bytes(4, "big") + entry.encode())
    assert encode(PeerExchange(3, (entry,))) == [frame]
    assert decode([frame]) == PeerExchange(3, (entry,))
    with pytest.raises(ProtocolError):
        decode([frame[:-1]])
    with pytest.raises(ProtocolError):
        decode([frame, b"content"])
    with pytest.raises(ValueError):
        encode(Unknown(1, PEX))


# --- the hot paths' header helpers -------------------------------------------------

@given(st.integers(0, 0xFFFF))
def test_header_helpers_match_the_codec(sequence: int) -> None:
    from peermesh.wire import zre
    frame = zre.pack_header(zre.SIGNATURE, 2, zre.VERSION, sequence)
    assert frame == zre.whisper_header(sequence) == zre.encode(zre.Whisper(sequence, ()))[0]
    assert frame[:4] == zre.WHISPER_PREFIX
    assert zre.shout_header(sequence, b"\x01g")[:4] == zre.SHOUT_PREFIX
    assert zre.peek_header(frame + b"fields") == (zre.SIGNATURE, 2, zre.VERSION, sequence)
