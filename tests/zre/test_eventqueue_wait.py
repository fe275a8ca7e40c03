"""``GreenEventQueue.get`` waiting: with and without a timeout, one consumer or several,
a timer kept from one wait to the next of the same timeout (real gevent hub, no network)."""

from __future__ import annotations

import time

import gevent

from peermesh.zre.eventqueue import GreenEventQueue


def test_a_wait_is_ended_by_a_put_and_a_timeout_ends_one_with_nothing() -> None:
    queue: GreenEventQueue[int] = GreenEventQueue(100)
    for i in range(50):   # a consumer waiting per item, as a round trip does
        gevent.get_hub().loop.run_callback(queue.put, i)
        assert queue.get(10.0) == i
    start = time.monotonic()
    assert queue.get(0.05) is None
    assert time.monotonic() - start >= 0.05
    start = time.monotonic()
    assert queue.get(0.05) is None   # the same timeout again (the kept timer)
    assert time.monotonic() - start >= 0.05
    assert queue.get(0) is None and queue.get(-1) is None   # no wait at all
    queue.put(7)
    assert queue.get(0) == 7


def test_a_wait_without_a_timeout_before_any_with_one_is_ended_by_a_put() -> None:
    queue: GreenEventQueue[int] = GreenEventQueue(100)
    for i in range(3):   # (no timer made yet, none kept)
        gevent.get_hub().loop.run_callback(queue.put, i)
        assert queue.get() == i
    gevent.get_hub().loop.run_callback(queue.put, 3)
    assert queue.get(10.0) == 3
    gevent.get_hub().loop.run_callback(queue.put, 4)
    assert queue.get() == 4


def test_consumers_waiting_together_each_get_their_item_or_their_timeout() -> None:
    queue: GreenEventQueue[int] = GreenEventQueue(100)
    got: list[object] = []
    waiting = [gevent.spawn(lambda: got.append(queue.get(0.2))) for _ in range(3)]
    gevent.sleep(0.01)
    queue.put(1)
    queue.put(2)
    gevent.joinall(waiting, timeout=5)
    assert all(g.dead for g in waiting)
    assert sorted(got, key=repr) == [1, 2, None]
    assert len(queue) == 0
    shorter = gevent.spawn(queue.get, 0.05)   # another timeout while one is kept
    longer = gevent.spawn(queue.get, 0.3)
    start = time.monotonic()
    shorter.join(5)
    assert shorter.value is None and 0.05 <= time.monotonic() - start < 0.3
    queue.put(3)
    longer.join(5)
    assert longer.value == 3


def test_a_consumer_killed_while_waiting_leaves_the_queue_usable() -> None:
    queue: GreenEventQueue[int] = GreenEventQueue(100)
    waiting = gevent.spawn(queue.get, 10.0)
    gevent.sleep(0.01)
    waiting.kill(block=True, timeout=5)
    assert waiting.dead
    queue.put(4)
    assert queue.get(1.0) == 4
    assert queue.get(0.02) is None


def test_a_consumer_whose_item_another_took_waits_for_what_is_left_of_its_timeout() -> None:
    queue: GreenEventQueue[int] = GreenEventQueue(100)
    waiting = gevent.spawn(queue.get, 0.3)
    gevent.sleep(0)                    # (it runs, and waits in get)
    queue.put(1)
    assert queue.get(0) == 1           # taken before the woken consumer runs
    gevent.sleep(0)                    # (its wake-up, queued before us, runs)
    assert not waiting.dead            # it waits again, for what is left
    queue.put(2)
    waiting.join(5)
    assert waiting.value == 2
    again = gevent.spawn(queue.get, 0.3)
    gevent.sleep(0)
    queue.put(3)
    assert queue.get(0) == 3
    again.join(5)
    assert again.dead and again.value is None   # its timeout, after the stolen wake-up
