"""Bounded queues that carry events from a node to the application.

The node (on its hub) ``put``s; the application ``get``s. When a queue holds
``limit`` events the node stops reading its mailbox until the application has
taken half of them, so a slow application pushes back on its peers instead of
growing memory without bound. ``GreenEventQueue`` serves a consumer on the
same hub; ``ThreadEventQueue`` serves consumers in other threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable, Generic, Optional, TypeVar

import gevent.event

__all__ = ["GreenEventQueue", "ThreadEventQueue"]

T = TypeVar("T")


class GreenEventQueue(Generic[T]):
    """Producer and consumer are greenlets on one hub."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[T] = deque()
        self._ready = gevent.event.Event()
        self._room = gevent.event.Event()
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """Add ``item`` (never blocks; check ``full`` to pace the producer)."""
        self._items.append(item)
        if not self._ready.is_set():
            self._ready.set()

    def full(self) -> bool:
        """True when the producer should wait for ``wait_room``."""
        if len(self._items) >= self.limit:
            self._room.clear()
            return True
        return False

    def wait_room(self) -> None:
        """Block the producer until the consumer has drained half the queue."""
        self._room.wait()

    def get(self, timeout: Optional[float] = None) -> Optional[T]:
        """The next item, or None after ``timeout`` seconds (None: wait for ever)."""
        items = self._items
        if items:
            item = items.popleft()
            if not self._room.is_set() and len(items) <= self.limit // 2:
                self._room.set()
            return item
        deadline = None if timeout is None else time.monotonic() + timeout
        while not items:
            self._ready.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._ready.wait(remaining)
        item = items.popleft()
        if not self._room.is_set() and len(items) <= self.limit // 2:
            self._room.set()
        return item


class ThreadEventQueue(Generic[T]):
    """Producer is a greenlet on a hub in one thread; consumers are other threads.

    ``wake_producer`` must be safe to call from any thread (for instance
    ``loop.run_callback_threadsafe``) and is how consumers release a producer
    that waits for room.
    """

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object]) -> None:
        self.limit = limit
        self._items: deque[T] = deque()
        self._lock = threading.Condition(threading.Lock())
        self._room = gevent.event.Event()
        self._room.set()
        self._wake = wake_producer

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        with self._lock:
            self._items.append(item)
            self._lock.notify()

    def full(self) -> bool:
        if len(self._items) >= self.limit:
            self._room.clear()
            return True
        return False

    def wait_room(self) -> None:
        self._room.wait()

    def get(self, timeout: Optional[float] = None) -> Optional[T]:
        with self._lock:
            if not self._lock.wait_for(lambda: self._items, timeout):
                return None
            item = self._items.popleft()
            release = not self._room.is_set() and len(self._items) <= self.limit // 2
        if release:
            self._wake(self._room.set)
        return item
