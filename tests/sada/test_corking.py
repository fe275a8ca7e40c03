"""Corking: a channel sends the requests its callers make in one hub turn together, at the
turn's end or once one server has ``_CORK_LIMIT`` of them, and a server the replies of one
turn; nothing held is lost or left waiting
(a channel stopping fails what it holds, a server stopping sends what it holds first, a
server gone with requests held for it has them answered elsewhere)."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
import pytest

from peermesh.sada import ChannelClosed, Service
from peermesh.sada.channel import _CORK_LIMIT

from .conftest import WAIT, Loopback, wait_until
from .test_inprocess import RawPeer


@pytest.mark.usefixtures("native_path")
def test_requests_made_in_one_turn_go_out_together_a_limit_at_a_time_and_all_are_answered(
        loop: Loopback) -> None:
    channel = loop.channel()
    server = loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    driver = channel._driver
    assert driver is not None
    before, sent = server.stats["requests"], driver.stats["sent"]
    results = [channel.request_async("echo", "echo", i) for i in range(50)]   # one turn
    # the first alone, then _CORK_LIMIT at a time (one server) as the turn goes on
    went, held = divmod(49, _CORK_LIMIT)
    assert went >= 2 and held
    assert len(driver.corked) == held and driver.stats["sent"] == sent + 1 + went * _CORK_LIMIT
    assert [r.get(WAIT) for r in results] == list(range(50))
    assert server.stats["requests"] == before + 50 and server.stats["unsent"] == 0
    assert not channel._driver.corked


def test_the_only_request_in_flight_goes_out_at_once(loop: Loopback) -> None:
    channel = loop.channel()
    loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    assert channel.request("echo", "echo", "one") == "one"
    result = channel.request_async("echo", "echo", "alone")
    assert not channel._driver.corked   # (no other caller could join it in this turn)
    assert result.get(WAIT) == "alone"


def test_requests_held_when_the_channel_stops_fail_closed(loop: Loopback) -> None:
    channel = loop.channel()
    server = loop.server(channel)
    assert channel.wait_for("echo", timeout=WAIT)
    results = [channel.request_async("echo", "echo", i) for i in range(5)]
    channel.stop()
    for result in results:
        with pytest.raises(ChannelClosed):
            result.get(WAIT)
    assert server.running


def test_requests_held_for_a_server_that_goes_are_answered_by_another(
        loop: Loopback) -> None:
    channel = loop.channel(ping_interval=30.0)   # the disconnect or the failed send tells
    gone = RawPeer().connect(channel.endpoint)
    try:
        gone.send(channel.endpoint.encode(), b"", b"SADA1", b"INTR", b"echo", b"1.0")
        loop.server(channel)
        assert channel.wait_for("echo", count=2, timeout=WAIT)
        results = [channel.request_async("echo", "echo", i, retries=1) for i in range(20)]
        gone.close()   # (in the same turn: its requests are still held)
        assert [r.get(WAIT) for r in results] == list(range(20))
        assert channel.wait_until(lambda ch: len(ch.servers()) == 1, WAIT)
    finally:
        gone.close()


def test_replies_of_one_turn_all_arrive_and_a_stopping_server_sends_what_it_holds(
        loop: Loopback) -> None:
    channel = loop.channel()
    gate = gevent.event.Event()
    work = Service("work", "1.0")
    work.add("run", lambda n: gate.wait(WAIT) and n)   # in workers: all answer in one turn
    server = loop.server(channel, services=[work])
    assert channel.wait_for("work", timeout=WAIT)
    results = [channel.request_async("work", "run", i) for i in range(30)]
    wait_until(lambda: server.stats["requests"] == 30)
    stopper = gevent.spawn(server.stop, WAIT)
    gevent.sleep(0)   # (the server stops: its handlers run on)
    gate.set()
    assert [r.get(WAIT) for r in results] == list(range(30))
    stopper.join(WAIT)
    assert server.stats["unsent"] == 0 and not server._driver.corked


def test_inline_replies_of_a_batch_all_arrive(loop: Loopback) -> None:
    channel = loop.channel()
    fast = Service("fast", "1.0")
    fast.add("twice", lambda n: 2 * n, inline=True)
    server = loop.server(channel, services=[fast])
    assert channel.wait_for("fast", timeout=WAIT)
    results: list[Any] = [channel.request_async("fast", "twice", i) for i in range(200)]
    assert [r.get(WAIT) for r in results] == [2 * i for i in range(200)]
    assert server.stats["replies"] == 200 and server.stats["unsent"] == 0
