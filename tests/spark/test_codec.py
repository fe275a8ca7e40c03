"""The ``text`` column's codec: the fast column path agrees with the per-payload one."""

from __future__ import annotations

import math

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.spark.codec import DECODE_MODES, payload_text, payload_texts

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
