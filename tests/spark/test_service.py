"""The driver-side service with real mesh peers on loopback, reached over PMLOG1 (no Spark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import msgpack
import pytest
import zmq

from peermesh.spark import protocol
from peermesh.spark.client import LogClient, log_client
from peermesh.spark.codec import pack_value, payload_text, payload_value
from peermesh.spark.protocol import LogServiceError

from .conftest import meet, shout_all, wait_until


def test_import_peermesh_spark_needs_no_pyspark() -> None:
    code = ("import sys, peermesh, peermesh.spark, peermesh.spark.service, peermesh.spark.log;"
            "assert 'pyspark' not in sys.modules, 'pyspark imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_shouts_become_an_ordered_log_served_over_the_socket(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    service = make_service(["tele", "other"], channel=False, trim=True)
    alice, bob = make_peer("alice"), make_peer("bob")
    for peer in (alice, bob):
        meet(peer, "tele")
    shout_all(alice, "tele", [{"from": "alice", "i": i} for i in range(300)])
    shout_all(bob, "other", [{"from": "bob", "i": i} for i in range(100)])
    shout_all(bob, "tele", [{"from": "bob", "i": i} for i in range(100)])
    assert service.wait_for_offset(500, 10)

    client = LogClient(service.endpoint, timeout=5, token=service.token)
    info = client.info()
    assert (info["earliest"], info["next"]) == (0, 500)
    assert sorted(info["groups"]) == ["other", "tele"]
    # executors get the driver's network, not its interface's name (absent on other hosts)
    assert info["mesh"]["interface"] == "127.0.0.0/8"

    from peermesh.spark.log import Chunk, rows_of
    reply = client.fetch(["tele"], 0, 500)
    assert reply["resume"] == 500
    rows = sorted(rows_of([Chunk(*c) for c in reply["chunks"]], 0, 500), key=lambda r: r[0])
    assert len(rows) == 400
    assert [r[0] for r in rows] == sorted(set(r[0] for r in rows))
    values = [msgpack.unpackb(r[5]) for r in rows]
    assert [v["i"] for v in values if v["from"] == "alice"] == list(range(300))
    assert [v["i"] for v in values if v["from"] == "bob"] == list(range(100))
    assert {r[3] for r in rows} == {"alice", "bob"}
    assert {r[2] for r in rows} == {alice.uuid.hex, bob.uuid.hex}
    uuids = {"alice": alice.uuid.hex, "bob": bob.uuid.hex}
    assert [(r[2], r[3]) for r in rows] == [(uuids[v["from"]], v["from"]) for v in values]

    # admission: the end offset after at most N messages of the groups asked for
    assert client.latest(["tele"], 0)["end"] == 500
    assert client.latest(["tele"], 0, max_rows=10)["end"] == 10
    assert client.latest(["other"], 0, max_rows=10)["end"] == 310
    assert client.latest(["other"], 400)["end"] == 400  # nothing of "other" there
    assert client.latest(["tele"], 0, ceiling=250)["end"] == 250

    # commits trim, group by group, the whole chunks every consumer of the group processed
    client.register("q1", ["tele"], 0)
    client.register("q2", ["other"], 0)
    tele = client.commit("q1", ["tele"], 200)["earliest"]
    other = client.commit("q2", ["other"], 150)["earliest"]
    assert tele <= 200 and other <= 150
    assert client.fetch(["tele"], 0, 500)["earliest"] == tele  # q2 trims only "other"
    assert service.forget_consumer("q2")
    assert service.bounds(["other"])[0] == other  # no live consumer left: "other" is kept
    assert {c.id for c in service.consumers()} == {"q1"}

    # joining a group on request (what a query for a new group does)
    assert "more" in client.join(["more"])["groups"]
    wait_until(lambda: alice.peers_by_group("more"), 5, "the service to join 'more'")
    shout_all(alice, "more", [{"x": 1}])
    assert service.wait_for_offset(501, 5)


def test_errors_are_answered_not_fatal(make_service: Callable[..., Any]) -> None:
    service = make_service(["g"], channel=False)
    client = LogClient(service.endpoint, timeout=5, token=service.token)
    with pytest.raises(LogServiceError) as info:
        client.call(protocol.Op.FETCH, {"start": "x"})
    assert info.value.kind == "bad-request"
    # an unknown op and garbage: the service answers the first and drops the second
    context = zmq.Context.instance()
    with context.socket(zmq.DEALER) as sock:
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(service.endpoint)
        sock.send_multipart([b"garbage"])
        sock.send_multipart([b"PMLOG1", b"1", b"EXPLODE", msgpack.packb({})])
        assert sock.poll(5000)
        reply = protocol.decode_reply(sock.recv_multipart())
        assert not reply.ok and reply.body["kind"] == "unknown-op"
    assert client.info()["next"] == 0
    assert service.stats.errors == 3


def test_a_restarted_service_keeps_its_log(make_service: Callable[..., Any],
                                           make_peer: Callable[..., Any],
                                           tmp_path: Path) -> None:
    first = make_service(["g"], directory=tmp_path / "keep", channel=False)
    peer = make_peer("p")
    meet(peer, "g")
    shout_all(peer, "g", list(range(20)))
    assert first.wait_for_offset(20, 5)
    log_id = first.log_id
    first.stop()
    second = make_service(["g"], directory=tmp_path / "keep", channel=False)
    assert second.log_id == log_id and second.bounds() == (0, 20)
    # (a member that leaves while a flush waits fails the flush: wait for the first to go)
    wait_until(lambda: peer.peers_by_group("g") == [second.node.uuid], 10,
               "the restarted service to take the first one's place")
    shout_all(peer, "g", [20])
    assert second.wait_for_offset(21, 5)


def test_unreachable_service_fails_clearly() -> None:
    client = LogClient("tcp://127.0.0.1:9", timeout=0.2)
    with pytest.raises(LogServiceError, match="start_service"):
        client.info()
    assert log_client("tcp://127.0.0.1:9") is log_client("tcp://127.0.0.1:9")
    with pytest.raises(ValueError):
        LogClient("127.0.0.1:9")


@pytest.mark.parametrize("payload, text", [
    (msgpack.packb({"t": 21.5, "h": "a"}), '{"t":21.5,"h":"a"}'),
    (msgpack.packb([1, "x", None, True]), '[1,"x",null,true]'),
    (msgpack.packb({"b": b"\x00\x01"}), '{"b":"AAE="}'),
    (msgpack.packb({1: "int key"}), '{"1":"int key"}'),
    (b"hello world", "hello world"),
    (b"1", "1"),                      # one printable octet is text, not a msgpack fixint
    (b'{"a": 1}', '{"a": 1}'),
    (b"\xff\xfe\x00", None),
    (b"", ""),
])
def test_text_column(payload: bytes, text: Any) -> None:
    assert payload_text(payload) == text


def test_payload_values_and_packing() -> None:
    import datetime
    import decimal

    assert payload_value(msgpack.packb({"a": 1})) == {"a": 1}
    assert payload_value(b'{"a": 2}') == {"a": 2}
    assert payload_value(b"plain") == "plain"
    assert payload_value(b"\xff\xfe\x00") is None
    when = datetime.datetime(2024, 1, 2, 3, 4, 5)
    packed = pack_value({"when": when, "price": decimal.Decimal("1.50"), "raw": b"\x00"})
    assert msgpack.unpackb(packed) == {"when": "2024-01-02T03:04:05", "price": "1.50",
                                       "raw": b"\x00"}


@pytest.mark.parametrize("channel", [False, True])
def test_the_driver_node_advertises_the_log_and_its_roles(
        make_service: Callable[..., Any], make_peer: Callable[..., Any], channel: bool) -> None:
    from peermesh.errors import NodeStateError
    from peermesh.overlay import Lifecycle, roles_of
    from peermesh.spark.service import HEADER_LOG

    service = make_service(["tele"], channel=channel)
    assert service.lifecycle is Lifecycle.RUNNING and service.running
    with pytest.raises(NodeStateError, match="service is running; a service starts once"):
        service.start()
    peer = make_peer("reader")
    meet(peer, "tele")
    driver = peer.peers_by_group("tele")[0]
    headers = peer.peer_headers(driver)
    assert headers[HEADER_LOG] == service.endpoint
    assert roles_of(headers) == (["sada-channel", "spark-log"] if channel else ["spark-log"])
    service.stop(0.2)
    assert service.lifecycle is Lifecycle.STOPPED and not service.running
    service.stop(0.2)                       # twice is fine


def test_the_service_node_serves_log_offsets_and_consumer_lag_as_metrics(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from peermesh.spark.log import MessageLog

    service = make_service(["tele"], channel=False, metrics="127.0.0.1:0")
    alice = make_peer("alice")
    meet(alice, "tele")
    shout_all(alice, "tele", [{"i": i} for i in range(10)])
    assert service.wait_for_offset(10, 10)
    with MessageLog(service.path) as log:
        log.commit("query-1", 4, ["tele"])
    with urllib.request.urlopen(service.metrics.url, timeout=10) as answer:
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}

    def value(name: str, **labels: str) -> float:
        (found,) = [s.value for s in families[name].samples
                    if all(s.labels.get(k) == v for k, v in labels.items())]
        return found
    assert value("peermesh_spark_log_next_offset") == 10
    assert value("peermesh_spark_consumer_lag", consumer="query-1", groups="tele") == 6
    assert value("peermesh_spark_log", what="messages") == 10
    assert value("peermesh_peers") == 1
