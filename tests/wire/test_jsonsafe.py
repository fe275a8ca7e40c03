"""jsonsafe: remote JSON bounded in size and depth; every remote JSON decoder uses it, so a
nesting bomb is malformed input (None, ProtocolError), never a RecursionError."""

from __future__ import annotations

import json
import logging
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.errors import ProtocolError
from peermesh.flux.overlay import FLUX_HEADER, parse_member
from peermesh.mtl.gateway import GATEWAY_HEADER, parse_gateway_header
from peermesh.nfp.mesh import NFP_BROKER_HEADER, parse_broker_endpoint, parse_workers
from peermesh.overlay.contract import MALFORMED_HEADERS, header_json
from peermesh.overlay.election import BROKER_HEADER, parse_candidate
from peermesh.spark.codec import payload_value
from peermesh.wire import jsonsafe
from peermesh.wire import nfp as nfp_wire
from peermesh.wire.flux import read_json
from peermesh.wire.mtl import MAX_REQUEST, decode_reply, decode_request

BOMBS = ["[" * 3000, "{\"a\":" * 3000, "[" * 200_000, "[" * 129 + "]" * 129,
         '{"x":' + "[" * 5000 + "]" * 5000 + "}"]


def test_depth_counts_containers_without_recursion() -> None:
    assert jsonsafe.depth(1) == 0
    assert jsonsafe.depth([]) == 1
    assert jsonsafe.depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert jsonsafe.depth(deep) == 5001


def test_loads_bounds_size_and_depth() -> None:
    assert jsonsafe.loads('{"a":[1,2,{"b":null}]}', 100) == {"a": [1, 2, {"b": None}]}
    assert jsonsafe.loads(b' [1] ', 10) == [1]                     # whitespace: the full path
    assert jsonsafe.loads("[" * 128 + "]" * 128, 1000)              # at the bound
    with pytest.raises(jsonsafe.JsonError, match="deeper than 128"):
        jsonsafe.loads("[" * 129 + "]" * 129, 1000)
    with pytest.raises(jsonsafe.JsonError, match="deeper than 2"):
        jsonsafe.loads('[[["x"]]]', 100, max_depth=2)
    with pytest.raises(jsonsafe.JsonError, match="over 10"):
        jsonsafe.loads("[" + "1," * 10 + "1]", 10)
    with pytest.raises(jsonsafe.JsonError, match="nests too deeply"):
        jsonsafe.loads("[" * 3000, 10_000)
    for bad in ("", "{", "[1,]", "nan-ish", b"\xff\xfe"):
        with pytest.raises(jsonsafe.JsonError):
            jsonsafe.loads(bad, 100)
    # many flat containers are not deep: walked, accepted
    assert len(jsonsafe.loads(json.dumps([{"a": []}] * 1000), 1 << 20)) == 1000


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='[]{}":,1a \\', max_size=400))
def test_loads_raises_only_json_error(text: str) -> None:
    try:
        jsonsafe.loads(text, 300)
    except jsonsafe.JsonError:
        pass


@pytest.mark.parametrize("bomb", BOMBS, ids=lambda b: f"{b[:6]}x{len(b)}")
def test_every_hello_header_parser_drops_a_bomb(bomb: str) -> None:
    assert parse_member({FLUX_HEADER: bomb}, "flux") is None
    assert parse_workers(bomb) == []
    assert parse_broker_endpoint(bomb) is None
    assert parse_gateway_header(bomb) is None
    assert parse_candidate(UUID(int=1), {BROKER_HEADER: bomb}) is None


def test_headers_keep_parsing_what_is_well_formed() -> None:
    member = json.dumps({"instance": "flux", "endpoint": "tcp://127.0.0.1:5", "priority": 2})
    assert parse_member({FLUX_HEADER: member}, "flux") == (2, "tcp://127.0.0.1:5")
    assert parse_broker_endpoint('{"endpoint":"tcp://127.0.0.1:9"}') == "tcp://127.0.0.1:9"
    assert parse_gateway_header('{"control":"tcp://127.0.0.1:7"}') == "tcp://127.0.0.1:7"
    assert parse_workers('[{"service":"s","name":"w","endpoint":"tcp://127.0.0.1:1"}]') == [
        ("s", "w", "tcp://127.0.0.1:1")]
    assert parse_candidate(UUID(int=1), {BROKER_HEADER: '{"mode":"auto","priority":3}'},
                           "n").priority == 3


def test_malformed_headers_are_counted_and_logged_at_debug_rate_limited(
        caplog: pytest.LogCaptureFixture) -> None:
    before = MALFORMED_HEADERS.get(NFP_BROKER_HEADER)
    with caplog.at_level(logging.DEBUG, "peermesh.overlay.contract"):
        for _ in range(100):
            assert parse_broker_endpoint("[" * 3000) is None
            assert header_json("{", GATEWAY_HEADER) is None
    assert MALFORMED_HEADERS.get(NFP_BROKER_HEADER) == before + 100
    lines = [r for r in caplog.records if r.name == "peermesh.overlay.contract"]
    assert len(lines) <= 1                                     # one line per period at most
    assert all(r.levelno == logging.DEBUG and not r.exc_info for r in lines)


@pytest.mark.parametrize("bomb", BOMBS, ids=lambda b: f"{b[:6]}x{len(b)}")
def test_payload_decoders_answer_a_bomb_with_protocol_error(bomb: str) -> None:
    with pytest.raises(ProtocolError):
        read_json(bomb.encode() + b"\0")
    with pytest.raises(ProtocolError):
        nfp_wire.decode_body(bomb.encode())
    assert payload_value(bomb.encode(), "json") is None
    assert payload_value(bomb.encode()) == bomb                  # auto: shown as text


def test_mtl_control_body_bomb_is_a_protocol_error() -> None:
    for bomb in ("[" * 3000, "[" * 200 + "]" * 200, "[" * (MAX_REQUEST + 1)):
        with pytest.raises(ProtocolError):
            decode_request([b"Connection.Open", bomb.encode()])
        with pytest.raises(ProtocolError):
            decode_reply([b"Connection.Open-Ok", bomb.encode()])
