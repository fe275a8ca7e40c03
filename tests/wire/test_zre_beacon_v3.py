"""Version-3 ZRE beacons (Zyre's CURVE beacon): 54 octets, 'ZRE' %x03 UUID port key."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.wire.zre import BEACON_SIZE_V3, Beacon, decode_beacon, encode_beacon

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UUID = bytes.fromhex("00112233445566778899aabbccddeeff")
KEY = bytes(range(1, 33))

# Zyre's beacon_t: protocol[3] "ZRE", version 0x03, uuid[16], port (network order), key[32]
GOLDEN = [
    (Beacon(UUID, 0xC001, KEY),
     bytes.fromhex("5a524503" "00112233445566778899aabbccddeeff" "c001"
                   "0102030405060708090a0b0c0d0e0f10" "1112131415161718191a1b1c1d1e1f20")),
    (Beacon(b"\xff" * 16, 0, b"\xee" * 32),          # leaving
     bytes.fromhex("5a524503" + "ff" * 16 + "0000" + "ee" * 32)),
]


@pytest.mark.parametrize("beacon, wire", GOLDEN)
def test_v3_golden(beacon: Beacon, wire: bytes) -> None:
    assert len(wire) == BEACON_SIZE_V3 == 54
    assert encode_beacon(beacon) == wire
    assert decode_beacon(wire, 3) == beacon


def test_each_mode_hears_only_its_own_version() -> None:
    v1 = bytes.fromhex("5a524501" "00112233445566778899aabbccddeeff" "c001")
    v3 = GOLDEN[0][1]
    assert decode_beacon(v1) == Beacon(UUID, 0xC001) and decode_beacon(v1).key is None
    with pytest.raises(ProtocolError):
        decode_beacon(v3)       # a plain node drops CURVE beacons (as Zyre does)
    with pytest.raises(ProtocolError):
        decode_beacon(v1, 3)    # and a node with a keypair drops plain ones


@pytest.mark.parametrize("data", [
    pytest.param(b"ZRE\x01" + UUID + b"\xc0\x01" + KEY, id="v1-header-54-octets"),
    pytest.param(b"ZRE\x03" + UUID + b"\xc0\x01", id="v3-header-22-octets"),
    pytest.param(b"ZRE\x02" + UUID + b"\xc0\x01" + KEY, id="version-2"),
    pytest.param(b"ZRF\x03" + UUID + b"\xc0\x01" + KEY, id="wrong-prefix"),
    pytest.param(b"ZRE\x03" + UUID + b"\xc0\x01" + KEY[:31], id="53-octets"),
    pytest.param(b"ZRE\x03" + UUID + b"\xc0\x01" + KEY + b"\x00", id="55-octets"),
])
def test_v3_malformed_rejected(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_beacon(data, 3)


def test_key_must_be_32_octets() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        encode_beacon(Beacon(UUID, 1, b"\x01" * 31))


v3_beacons = st.builds(Beacon, uuid=st.binary(min_size=16, max_size=16),
                       port=st.integers(0, 0xFFFF), key=st.binary(min_size=32, max_size=32))


@SETTINGS
@given(v3_beacons)
def test_v3_roundtrip(beacon: Beacon) -> None:
    wire = encode_beacon(beacon)
    assert len(wire) == 54 and wire[:4] == b"ZRE\x03" and wire[22:] == beacon.key
    assert decode_beacon(wire, 3) == beacon


@SETTINGS
@given(st.one_of(st.binary(min_size=54, max_size=54),
                 st.binary(min_size=50, max_size=50).map(lambda b: b"ZRE\x03" + b),
                 st.binary(max_size=80)))
def test_arbitrary_datagrams_decode_or_raise_protocol_error(data: bytes) -> None:
    try:
        beacon = decode_beacon(data, 3)
    except ProtocolError:
        return
    assert len(data) == 54 and data[:4] == b"ZRE\x03" and beacon.key == data[22:]
