"""The ``text`` column's codec: the fast column path agrees with the per-payload one."""

from __future__ import annotations

import math

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.spark.codec import (DECODE_MODES, TEXT_NULL, TEXT_STORED, payload_text, payload_texts,
                                  stored_texts)

values = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64 - 1)
    | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5), inner, max_size=4),
    max_leaves=10)
payloads = (values.map(lambda v: msgpack.packb(v, use_bin_type=True))
            | st.binary(max_size=40) | st.text(max_size=20).map(str.encode))


@settings(max_examples=200, deadline=None)
@given(st.lists(payloads, max_size=8), st.sampled_from(DECODE_MODES))
def test_the_column_path_gives_the_same_text(batch: list[bytes], mode: str) -> None:
    expected = [payload_text(p, mode) for p in batch]
    got = [None if t is None else t.decode("utf-8") for t in payload_texts(batch, mode)]
    assert got == expected


def test_known_payloads() -> None:
    batch = [msgpack.packb({"a": 1, "b": [1.5, None]}), b"7", b"plain text", b"\xff\xfe",
             msgpack.packb(math.inf), msgpack.packb({1: b"\x00"})]
    assert payload_texts(batch) == [b'{"a":1,"b":[1.5,null]}', b"7", b"plain text", None,
                                    payload_text(batch[4]).encode(),
                                    payload_text(batch[5]).encode()]


maps = st.dictionaries(st.text(max_size=8), values, min_size=1, max_size=4).map(
    lambda v: msgpack.packb(v, use_bin_type=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(maps | payloads, max_size=8))
def test_stored_texts_are_the_texts_readers_would_make(batch: list[bytes]) -> None:
    data, ends, states = stored_texts(batch)
    assert len(ends) == len(batch) + 1 and len(states) == len(batch)
    for i, payload in enumerate(batch):
        expected = payload_text(payload)
        stored = data[ends[i]:ends[i + 1]]
        if expected is None:
            assert (states[i], stored) == (TEXT_NULL, b"")
        else:
            assert (states[i], stored.decode("utf-8")) == (TEXT_STORED, expected)


def test_stored_texts_of_string_keyed_maps_take_the_column_path() -> None:
    batch = [msgpack.packb({"seq": i, "temp": 20.5, "tags": ["a", None]}) for i in range(3)]
    data, ends, states = stored_texts(batch)
    assert data == b"".join(b'{"seq":%d,"temp":20.5,"tags":["a",null]}' % i for i in range(3))
    assert list(ends) == [0, 39, 78, 117] and states == bytes([TEXT_STORED]) * 3
