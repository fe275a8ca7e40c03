"""Golden exchanges captured from a real flux-core broker (its local connector), between
flux-core's own tools and the broker: every message decodes, re-encodes to the same
frames and framing, and the bodies are the ones peermesh's services and client use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from peermesh.flux.bodies import ping_answer, publish_body
from peermesh.wire.flux import (
    EventMessage, MsgType, Request, Response, decode, encode, read_json,
)
from peermesh.wire.flux_local import Reader, decode_body, encode as encode_local, encode_body

VECTORS = Path(__file__).parent / "vectors" / "fluxcore-0.88-local.json"
CAPTURE: dict[str, Any] = json.loads(VECTORS.read_text())
RECORDS = [r for r in CAPTURE["records"] if "frames" in r]


def messages(command: str) -> list[tuple[str, Any]]:
    return [(r["dir"], decode([bytes.fromhex(f) for f in r["frames"]]))
            for r in RECORDS if r["command"] == command]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{r['command']}:{r['dir']}")
def test_each_message_decodes_and_encodes_identically(record: dict[str, Any]) -> None:
    frames = [bytes.fromhex(f) for f in record["frames"]]
    assert encode(decode(frames)) == frames
    body = encode_body(frames)
    assert decode_body(body) == frames
    assert Reader(1 << 24).feed(encode_local(frames)) == [frames]


def test_the_broker_accepts_with_a_zero_octet() -> None:
    auths = {r["auth"] for r in CAPTURE["records"] if "auth" in r}
    assert auths == {"00"}


def test_flux_ping_bodies() -> None:
    (_, request), (_, response) = messages("flux ping -c 1 1")[-2:]
    assert isinstance(request, Request) and request.topic == "broker.ping"
    assert request.nodeid == 1 and request.routes == ()          # libflux: ROUTE, no hops
    body = read_json(request.payload)
    assert {"seq", "pad", "time.tv_sec", "time.tv_nsec"} <= set(body)
    assert isinstance(response, Response) and response.matchtag == request.matchtag
    answer = read_json(response.payload)
    assert answer["rank"] == 1 and set(answer) == set(body) | {"route", "userid",
                                                                 "rolemask", "rank"}
    # peermesh answers the same request with the same octets (given the same route)
    hops = answer["route"].split("!")
    ours = ping_answer(request.payload, tuple(h.encode() for h in reversed(hops[:-1])),
                       hops[-1], 1, answer["userid"], answer["rolemask"])
    assert ours == response.payload


def test_flux_event_pub_body_and_answer() -> None:
    exchange = messages("flux event pub -s golden.one {\"n\":1}")
    (request,) = [m for d, m in exchange if isinstance(m, Request)
                  and m.topic == "event.publish"]
    body = read_json(request.payload)
    assert set(body) == {"topic", "flags", "payload"} and body["topic"] == "golden.one"
    assert set(publish_body("golden.one", b'{"n":1}\0')) == set(body)
    (response,) = [m for d, m in exchange if isinstance(m, Response)
                   and m.topic == "event.publish"]
    assert set(read_json(response.payload)) == {"seq"}


def test_an_event_reaches_a_subscriber_with_route_frames() -> None:
    exchange = messages("flux event sub -c 1 golden.")
    events = [m for d, m in exchange if isinstance(m, EventMessage)]
    assert [e.topic for e in events] == ["golden.two"]
    assert events[0].routes is not None     # events carry route frames from a live broker
    assert read_json(events[0].payload) == {"n": 2}
    (subscribe,) = [m for d, m in exchange if isinstance(m, Request)
                    and m.topic == "event.subscribe"]
    assert read_json(subscribe.payload) == {"topic": "golden."}


def test_an_unknown_service_is_enosys_with_a_message() -> None:
    responses = [m for d, m in messages("flux ping -c 1 nosuch") if isinstance(m, Response)]
    assert responses[-1].errnum == 38
    assert responses[-1].payload == b"No service matching nosuch.ping is registered\0"


def test_every_type_is_present() -> None:
    kinds = {decode([bytes.fromhex(f) for f in r["frames"]]).__class__.__name__
             for r in RECORDS}
    assert {"Request", "Response", "EventMessage"} <= kinds
    assert MsgType.REQUEST == 1


OVERLAY: dict[str, Any] = json.loads(
    (Path(__file__).parent / "vectors" / "fluxcore-0.88-overlay.json").read_text())


def overlay_messages() -> list[tuple[str, Any]]:
    return [(r["dir"], decode([bytes.fromhex(f) for f in r["frames"]]))
            for r in OVERLAY["records"]]


@pytest.mark.parametrize("record", OVERLAY["records"], ids=lambda r: r["dir"])
def test_each_tbon_message_encodes_identically(record: dict[str, Any]) -> None:
    frames = [bytes.fromhex(f) for f in record["frames"]]
    assert encode(decode(frames)) == frames


def test_the_tbon_exchange_a_flux_core_parent_accepted() -> None:
    from peermesh.wire.flux import Control, ControlType, Role

    exchange = overlay_messages()
    (way, hello), (back, answer) = exchange[:2]
    assert (way, back) == ("to-parent", "from-parent")
    assert isinstance(hello, Request) and hello.topic == "overlay.hello"
    assert hello.routes == () and hello.rolemask == Role.OWNER   # ROUTE + empty delimiter
    assert set(read_json(hello.payload)) == {"rank", "version", "uuid", "status", "hostname"}
    assert read_json(hello.payload)["version"] >> 8 == 0x58       # 0.88
    assert isinstance(answer, Response) and set(read_json(answer.payload)) == {"uuid"}
    heartbeats = [m for d, m in exchange if isinstance(m, Control)]
    assert heartbeats and all(m.ctype == ControlType.HEARTBEAT and m.routes == ()
                              for m in heartbeats)
    # a request from the parent carries its route stack; the answer goes back with it whole
    requests = {m.topic: m for d, m in exchange if d == "from-parent" and isinstance(m, Request)}
    answers = {m.topic: m for d, m in exchange if d == "to-parent" and isinstance(m, Response)}
    for topic in ("broker.ping", "pm.hello"):
        assert answers[topic].routes == requests[topic].routes and len(requests[topic].routes) == 3
        assert answers[topic].matchtag == requests[topic].matchtag
    assert requests["broker.disconnect"].flags & 0x04 and "broker.disconnect" not in answers
    events = [m for d, m in exchange if isinstance(m, EventMessage)]
    assert [e.topic for e in events] == ["golden.three"] and events[0].routes
    goodbye = [m for d, m in exchange if getattr(m, "topic", None) == "overlay.goodbye"]
    assert [type(m).__name__ for m in goodbye] == ["Request", "Response"]
    assert goodbye[1].errnum == 0
