"""The built-in services answer flux-core's bodies: ``broker.ping`` and ``event.publish``."""

from __future__ import annotations

import pytest

from peermesh.flux.bodies import ping_answer, ping_body, publish_body, route_string
from peermesh.flux.core import FluxCore
from peermesh.wire.flux import (
    USERID_UNKNOWN, Errno, EventMessage, MsgFlag, Role, error_message, json_payload, read_json,
)

from .harness import Tree


def ranks(tree: Tree, count: int) -> dict[int, FluxCore]:
    return {c.rank: c for c in tree.grow(count)}  # type: ignore[misc]


def test_ping_answers_flux_body_with_route_userid_rolemask_rank() -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 4)
    me = cores[0].open_handle()
    tree.rpc(cores[0], me, "broker.ping", json_payload({"seq": 7, "pad": "pp"}), 3)
    (answer,) = tree.taken(cores[0], me)
    assert answer.errnum == 0
    assert read_json(answer.payload) == {
        "seq": 7, "pad": "pp", "route": "@%d!^!^!%s" % (me, cores[3].uuid[:8]),
        "userid": USERID_UNKNOWN, "rolemask": 0, "rank": 3}
    tree.rpc(cores[0], me, "broker.ping", ping_body(1), 0)   # answered on the rank itself
    (here,) = tree.taken(cores[0], me)
    assert read_json(here.payload)["rank"] == 0 and read_json(here.payload)["seq"] == 1


@pytest.mark.parametrize("payload", [b"{not json\0", b"{}", b'{"seq": 1}'])
def test_ping_with_a_broken_json_body_gets_eproto(payload: bytes) -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 3)
    me = cores[0].open_handle()
    tree.rpc(cores[0], me, "broker.ping", payload, 2)
    (answer,) = tree.taken(cores[0], me)
    assert answer.errnum == Errno.EPROTO and error_message(answer.payload)


def test_ping_without_json_is_echoed() -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 3)
    me = cores[0].open_handle()
    tree.rpc(cores[0], me, "broker.ping", b"raw", 2)
    (answer,) = tree.taken(cores[0], me)
    assert (answer.errnum, answer.payload) == (0, b"raw")


def test_route_string_and_answer_follow_flux_core() -> None:
    hop = bytes(range(16))
    assert route_string((b"^", hop), "0123456789abcdef") == "00010203!^!01234567"
    assert route_string((), "abc") == "abc"
    body = read_json(ping_answer(ping_body(3, "p"), (), "u" * 36, 5, 1000, int(Role.OWNER)))
    assert body == {"seq": 3, "pad": "p", "route": "uuuuuuuu", "userid": 1000, "rolemask": 1,
                    "rank": 5}


def test_event_publish_takes_flux_body_and_answers_seq() -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 3)
    listener = cores[2].open_handle()
    cores[2].subscribe(listener, "flux.")
    me = cores[1].open_handle()
    body = json_payload(publish_body("flux.a", b"\x00data"))
    assert read_json(body) == {"topic": "flux.a", "flags": 0, "payload": "AGRhdGE="}
    tree.rpc(cores[1], me, "event.publish", body, 0)
    (answer,) = tree.taken(cores[1], me)
    assert answer.errnum == 0 and read_json(answer.payload) == {"seq": 1}
    (event,) = tree.taken(cores[2], listener)
    assert isinstance(event, EventMessage) and (event.topic, event.payload, event.seq) == (
        "flux.a", b"\x00data", 1)
    tree.rpc(cores[1], me, "event.publish", json_payload(publish_body("flux.b", None)))
    (second,) = tree.taken(cores[1], me)       # NODEID_ANY reaches rank 0 too
    assert read_json(second.payload) == {"seq": 2}
    assert tree.taken(cores[2], listener)[0].payload is None


@pytest.mark.parametrize("body", [{"topic": "x"}, {"topic": "x", "flags": int(MsgFlag.USER1)},
                                  {"topic": "", "flags": 0},
                                  {"topic": "x", "flags": 0, "payload": "%%"}])
def test_event_publish_refuses_what_flux_core_refuses(body: dict) -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 2)
    me = cores[1].open_handle()
    tree.rpc(cores[1], me, "event.publish", json_payload(body), 0)
    (answer,) = tree.taken(cores[1], me)
    assert answer.errnum == Errno.EPROTO


def test_event_publish_on_another_rank_is_eproto_as_in_flux_core() -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 2)
    me = cores[1].open_handle()
    tree.rpc(cores[1], me, "event.publish", json_payload(publish_body("x", None)), 1)
    (answer,) = tree.taken(cores[1], me)
    assert answer.errnum == Errno.EPROTO
    assert error_message(answer.payload) == "this service is only available on rank 0"


def test_peermesh_methods_live_under_their_own_service() -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 2)
    me = cores[1].open_handle()
    for topic in ("event.pub", "overlay.info", "event.replay"):
        tree.rpc(cores[1], me, topic, json_payload({}), 0)
        (answer,) = tree.taken(cores[1], me)
        assert answer.errnum == Errno.ENOSYS, topic
    tree.rpc(cores[1], me, "peermesh.info", None, 0)
    (info,) = tree.taken(cores[1], me)
    assert read_json(info.payload)["rank"] == 0


def test_attr_get_answers_flux_core_form() -> None:
    tree = Tree(k=2)
    cores = ranks(tree, 3)
    me = cores[0].open_handle()
    for name, value in (("rank", "2"), ("size", "3"), ("tbon.topo", "kary:2"),
                        ("broker.uuid", cores[2].uuid)):
        tree.rpc(cores[0], me, "attr.get", json_payload({"name": name}), 2)
        (answer,) = tree.taken(cores[0], me)
        assert read_json(answer.payload) == {"value": value, "flags": 0}
    tree.rpc(cores[0], me, "attr.get", json_payload({"name": "no.such"}), 2)
    (missing,) = tree.taken(cores[0], me)
    assert missing.errnum == Errno.ENOENT
