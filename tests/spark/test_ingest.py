"""The driver service's ingest and retention, with real mesh peers (no Spark session).

A SHOUT too large to store is dropped with a reason and never holds up the
ones after it; the log is bounded by age or size with no query running.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from sqlitefiles import other_view

from .conftest import meet, spark_unavailable, wait_until

if spark_unavailable():
    pytest.skip(spark_unavailable(), allow_module_level=True)


def test_a_message_too_large_to_store_never_blocks_the_others(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    service = make_service(["big"], channel=False, max_record_bytes=200_000)
    peer = make_peer("sender")
    meet(peer, "big")
    medium = [b"m" * 60_000 for _ in range(12)]     # together too large for one chunk
    huge = [b"h" * 300_000, b"h" * 250_000]         # each too large to store at all
    small = [b"s%d" % i for i in range(10)]

    def send(node: Any) -> bool:
        for message in medium + huge + small:
            node.shout("big", message)
        return node.flush(5.0)

    assert peer.call(send), "the service did not confirm the shouts"
    assert service.wait_for_offset(len(medium) + len(small), 10)
    wait_until(lambda: service.stats.rejected == 2, 10, "two rejected shouts")
    from peermesh.spark.log import MessageLog

    with MessageLog(service.path) as log:
        payloads = [row[5] for row in log.read(0, 100, ["big"])]
    assert payloads == medium + small


def test_every_shout_the_driver_confirmed_is_in_the_log_after_a_burst(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    # 40 shouts of 50 MiB then 10 small ones logged 10 big and 0 small, and one at a time
    # with a flush after each 19 of 40, every flush True: the driver's node dropped what
    # did not fit in its event queue (64 MiB). The same burst, scaled down.
    service = make_service(["burst"], channel=False, event_queue_bytes=3_000_000,
                           max_message=1_100_000)
    peer = make_peer("sender")
    meet(peer, "burst")
    big = [bytes([i]) * 1_000_000 for i in range(20)]
    small = [b"s%d" % i for i in range(10)]

    def send(node: Any) -> bool:
        for message in big + small:
            node.shout("burst", message)
        return node.flush(30.0)

    from peermesh.spark.log import MessageLog

    def logged() -> list[bytes]:
        with MessageLog(service.path) as log:
            return [row[5] for row in log.read(0, 100, ["burst"])]

    assert peer.call(send), "the service did not confirm the burst"
    assert logged() == big + small  # confirmed: in the log already, not on its way
    one_by_one = [bytes([100 + i]) * 1_000_000 for i in range(10)]
    for i, message in enumerate(one_by_one):
        assert peer.call(lambda node: (node.shout("burst", message), node.flush(30.0))[1])
        assert len(logged()) == len(big) + len(small) + i + 1
    stats = service.node.stats()
    assert stats["events_dropped"] == 0 and stats["event_queue_bytes"] <= 3_000_000
    assert service.stats.rejected == 0


def test_flush_is_true_only_once_the_log_holds_what_was_sent(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    service = make_service(["held"], channel=False)
    peer = make_peer("sender")
    meet(peer, "held")
    with other_view(service.path, isolation_level=None) as lock:
        lock.execute("BEGIN EXCLUSIVE")  # the log cannot be written meanwhile
        try:
            assert not peer.call(lambda node: (node.shout("held", b"one"), node.flush(1.0))[1])
            assert service.stats.messages == 0
        finally:
            lock.execute("COMMIT")
    assert peer.call(lambda node: node.flush(30.0)), "confirmed once written"
    from peermesh.spark.log import MessageLog

    with MessageLog(service.path) as log:
        assert [row[5] for row in log.read(0, 10, ["held"])] == [b"one"]


def test_a_message_that_fits_only_without_its_text_is_stored_without_it(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    from peermesh.spark.codec import TEXT_LATER
    from peermesh.spark.log import MessageLog, decode_chunk

    service = make_service(["fit"], channel=False, max_record_bytes=100_000)
    peer = make_peer("sender")
    meet(peer, "fit")
    message = b"m" * 60_000     # its text as long again: the two are over 100,000 octets

    def send(node: Any) -> bool:
        node.shout("fit", message)
        return node.flush(5.0)

    assert peer.call(send), "the service did not confirm the shout"
    assert service.wait_for_offset(1, 10)
    with MessageLog(service.path) as log:
        chunks, _ = log.chunks(0, 1, ["fit"])
    decoded = decode_chunk(chunks[0])
    assert decoded.payloads(0, 1) == [message]
    assert decoded.text_states == bytes([TEXT_LATER])   # readers make it
    assert service.stats.rejected == 0


def test_retention_bounds_the_log_with_no_query_running(
        make_service: Callable[..., Any], make_peer: Callable[..., Any]) -> None:
    service = make_service(["kept"], channel=False, retention_bytes=50_000)
    peer = make_peer("sender")
    meet(peer, "kept")
    for round_ in range(10):  # ten appends of ~20 KB
        assert peer.call(lambda node: [node.shout("kept", b"x" * 2_000) for _ in range(10)]
                         and node.flush(5.0))
        assert service.wait_for_offset((round_ + 1) * 10, 10)
    wait_until(lambda: service.stats.trimmed > 0, 10, "a retention pass")
    wait_until(lambda: service.bounds(["kept"])[0] > 0, 10, "the oldest chunks to go")
    earliest, nxt = service.bounds(["kept"])
    assert nxt == 100 and 0 < earliest < 100
    assert service.consumers() == []


def test_retention_settings_are_checked(make_service: Callable[..., Any]) -> None:
    with pytest.raises(ValueError, match="retention must be a positive number"):
        make_service(["x"], channel=False, retention=-1)
    with pytest.raises(ValueError, match="retention_bytes must be a positive number"):
        make_service(["x"], channel=False, retention_bytes=0)


def test_executors_get_the_network_not_the_interface_name(
        make_service: Callable[..., Any]) -> None:
    from peermesh.net.interfaces import select_interface

    service = make_service(["x"], channel=False)
    where = service.options()["interface"]
    assert where == "127.0.0.0/8"
    assert select_interface(where).name == select_interface("lo").name


def test_the_log_service_answers_only_with_its_token(make_service: Callable[..., Any],
                                                     make_peer: Callable[..., Any]) -> None:
    from peermesh.spark.client import LogClient
    from peermesh.spark.protocol import LogServiceError

    service = make_service(["x"], channel=False)
    peer = make_peer("sender")
    meet(peer, "x")
    assert peer.call(lambda node: [node.shout("x", b"m%d" % i) for i in range(5)]
                     and node.flush(5.0))
    assert service.wait_for_offset(5, 10)
    for token in (None, "guess", service.token[:-1]):
        stranger = LogClient(service.endpoint, timeout=5, token=token)
        with pytest.raises(LogServiceError, match="unauthorised"):
            stranger.trim(2 ** 62)
        with pytest.raises(LogServiceError, match="unauthorised"):
            stranger.fetch(["x"], 0, 5)
        stranger.close()
    assert service.bounds(["x"]) == (0, 5)  # nothing was trimmed
    assert service.options()["token"] == service.token
    owner = LogClient(service.endpoint, timeout=5, token=service.token)
    assert owner.info(["x"])["next"] == 5
    owner.close()


def test_a_log_server_on_every_address_advertises_a_reachable_one(
        make_service: Callable[..., Any]) -> None:
    service = make_service(["x"], channel=False, bind="0.0.0.0")
    assert service.endpoint.startswith("tcp://127.0.0.1:")  # the mesh interface's address
    named = make_service(["y"], channel=False, bind="127.0.0.1", advertise="localhost")
    assert named.endpoint.startswith("tcp://localhost:")


def test_an_oversized_request_is_refused_and_the_service_goes_on(
        make_service: Callable[..., Any]) -> None:
    import zmq

    from peermesh.spark import protocol
    from peermesh.spark.client import LogClient
    from peermesh.spark.protocol import Op, Request

    service = make_service(["x"], channel=False)
    context = zmq.Context()
    try:
        hostile = context.socket(zmq.DEALER)
        hostile.setsockopt(zmq.LINGER, 0)
        hostile.connect(service.endpoint)
        hostile.send_multipart(protocol.encode_request(
            Request(b"1", Op.INFO, {"token": service.token, "pad": "x" * 2_000_000})))
        assert not hostile.poll(500)  # cut off, not answered
        hostile.close()
    finally:
        context.destroy(linger=0)
    client = LogClient(service.endpoint, timeout=5, token=service.token)
    assert client.info(["x"])["next"] == 0
    client.close()
