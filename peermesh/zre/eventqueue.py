"""Bounded queues that carry events from a node to the application.

The node (on its hub) ``put``s; the application ``get``s. When a queue holds
``limit`` events the node stops reading its mailbox until the application has
taken half of them, so a slow application pushes back on its peers instead of
growing memory without bound.

Counting events does not bound memory when the events are large (and ZeroMQ
buffers behind a mailbox that is not read, up to its high-water mark in
messages, not octets), so a node also bounds the octets of content waiting
(``bound_bytes``): while they are over the bound, new events with content
(WHISPER, SHOUT) are dropped and counted in ``dropped``; events without
content (ENTER, EXIT, JOIN...) are always kept. Octets are counted on the
producer's side only: consumers take items in order, so the producer learns
what they took from the queue's length (when the count nears the bound, or
every ``_RECOUNT`` items), and no lock is needed.
``GreenEventQueue`` serves a consumer on the
same hub; ``ThreadEventQueue`` serves consumers in other threads;
``LoopEventQueue`` serves the tasks of an asyncio loop in another thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Callable, Generic, Optional, TypeVar

import gevent
import gevent.event
from gevent.hub import Waiter, getcurrent

if TYPE_CHECKING:  # asyncio only where a loop is served: a plain node does not load it
    import asyncio

__all__ = ["GreenEventQueue", "ThreadEventQueue", "LoopEventQueue"]

T = TypeVar("T")


class _ByteBound:
    """The octets of content a queue holds, counted by the producer (see the module)."""

    _items: deque
    #: octets of content beyond which new items with content are dropped
    max_bytes = 0
    #: octets of content held (including items taken since the last recount)
    size = 0
    #: items dropped for ``max_bytes``
    dropped = 0
    #: octets of content admitted, ever (the metrics' bytes received)
    admitted = 0
    #: times the queue was full and its producer had to wait (``event_queue``)
    pauses = 0
    #: the content octets of each item not yet known to be taken, oldest first
    #: (None: no bound in octets)
    _sizes: Optional[deque[int]] = None

    def bound_bytes(self, limit: int) -> None:
        """Drop new items with content (``item.frames``) while ``limit`` octets wait."""
        self.max_bytes = limit
        self._sizes = deque()

    def _admit(self, item: object, sizes: deque[int]) -> bool:
        """For the producer, before it appends ``item``: False if it is to be dropped.

        ``size`` counts taken items too until ``_recount`` subtracts them, which
        happens only when it reaches the bound or enough were taken: cheap per item.
        """
        frames = item.frames  # type: ignore[attr-defined]
        size = len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
        if self.size >= self.max_bytes or len(sizes) - len(self._items) > _RECOUNT:
            self._recount(sizes)
            if size and self.size >= self.max_bytes:
                self.dropped += 1
                return False
        self.size += size
        self.admitted += size
        sizes.append(size)
        return True

    def octets(self) -> int:
        """Octets of content held now (for the producer's thread)."""
        if self._sizes is not None:
            self._recount(self._sizes)
        return self.size

    def _recount(self, sizes: deque[int]) -> None:
        """Subtract the octets of the items consumers took (the oldest ones)."""
        popleft = sizes.popleft
        self.size -= sum([popleft() for _ in range(len(sizes) - len(self._items))])


_RECOUNT = 1024  # items taken before the producer subtracts their octets


class GreenEventQueue(_ByteBound, Generic[T]):
    """Producer and consumer are greenlets on one hub.

    A consumer waiting in ``get`` is switched to straight from the hub
    (where the mailbox drains), which saves a trip round the event loop on
    every wake-up; between ``hold`` and ``release`` (one drained batch) it is
    woken once, at the end, so a burst costs one switch, not one per event.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: deque[T] = deque()
        self._waiters: deque[Waiter] = deque()
        self._room = gevent.event.Event()
        self._room.set()
        self._paused = False  # the producer waits for room
        self._hub = gevent.get_hub()
        self._held = False

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: T) -> None:
        """Add ``item`` (never blocks; check ``full`` to pace the producer)."""
        sizes = self._sizes
        if sizes is not None and not self._admit(item, sizes):
            return
        self._items.append(item)
        if self._waiters and not self._held:
            self._wake()

    def hold(self) -> None:
        """Queue without waking the consumer until ``release``."""
        self._held = True

    def release(self) -> None:
        """Wake the consumer if anything came since ``hold``."""
        self._held = False
        if self._items and self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiters.popleft()
        if getcurrent() is self._hub:
            waiter.switch(None)
        else:
            self._hub.loop.run_callback(waiter.switch, None)

    def full(self) -> bool:
        """True when the producer should wait for ``wait_room``."""
        if len(self._items) >= self.limit:
            self._room.clear()
            self._paused = True
            self.pauses += 1
            return True
        return False

    def wait_room(self) -> None:
        """Block the producer until the consumer has drained half the queue."""
        self._room.wait()

    def get(self, timeout: Optional[float] = None) -> Optional[T]:
        """The next item, or None after ``timeout`` seconds (None: wait for ever)."""
        items = self._items
        deadline = None
        while not items:
            if timeout is not None:
                if deadline is None:
                    deadline = time.monotonic() + timeout
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
            waiter: Waiter = Waiter(self._hub)
            self._waiters.append(waiter)
            timer = None
            if timeout is not None:
                timer = self._hub.loop.timer(remaining)
                timer.start(waiter.switch, _TIMED_OUT)
            try:
                waiter.get()
            finally:
                if timer is not None:
                    timer.close()
                if self._waiters and waiter in self._waiters:  # put() did not take it
                    self._waiters.remove(waiter)
        item = items.popleft()
        if self._paused and len(items) <= self.limit // 2:
            self._paused = False
            self._room.set()
        return item


_TIMED_OUT = object()


class _HandOff(_ByteBound, Generic[T]):
    """The part every cross-thread queue shares: the producer is a greenlet on a hub,
    consumers are elsewhere.

    ``wake_producer`` must be safe to call from any thread (for instance
    ``loop.run_callback_threadsafe``) and is how consumers release a producer
    that waits for room.
    """

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object]) -> None:
        self.limit = limit
        self._items: deque[T] = deque()
        self._room = gevent.event.Event()
        self._room.set()
        self._wake = wake_producer
        self._held = False

    def __len__(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        """True when the producer should wait for ``wait_room``."""
        if len(self._items) >= self.limit:
            self._room.clear()
            self.pauses += 1
            return True
        return False

    def wait_room(self) -> None:
        """Block the producer until consumers have drained half the queue."""
        self._room.wait()

    def hold(self) -> None:
        """Queue without waking consumers until ``release`` (one batch)."""
        self._held = True

    def _taken(self) -> None:
        """After a consumer took an item: release a waiting producer at half the limit."""
        if not self._room.is_set() and len(self._items) <= self.limit // 2:
            self._wake(self._room.set)


class ThreadEventQueue(_HandOff[T]):
    """Producer is a greenlet on a hub in one thread; consumers are other threads."""

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object]) -> None:
        super().__init__(limit, wake_producer)
        self._lock = threading.Condition(threading.Lock())

    def put(self, item: T) -> None:
        """Add ``item`` (never blocks; the producer checks ``full``)."""
        sizes = self._sizes
        if sizes is not None and not self._admit(item, sizes):
            return
        if self._held:
            self._items.append(item)  # deque appends are atomic; release() notifies
            return
        with self._lock:
            self._items.append(item)
            self._lock.notify()

    def release(self) -> None:
        """Notify consumers of what came since ``hold``."""
        self._held = False
        with self._lock:
            if self._items:
                self._lock.notify_all()

    def get(self, timeout: Optional[float] = None) -> Optional[T]:
        """The next item, or None after ``timeout`` seconds (None: wait for ever)."""
        try:
            item = self._items.popleft()  # atomic: no lock while items wait
        except IndexError:
            with self._lock:
                if not self._lock.wait_for(self._items.__len__, timeout):
                    return None
                item = self._items.popleft()
        self._taken()
        return item


class LoopEventQueue(_HandOff[T]):
    """Producer is a greenlet on a hub in one thread; consumers are tasks of an asyncio loop.

    A consumer waiting in ``get`` is woken by one ``loop.call_soon_threadsafe``
    per batch (per ``hold``/``release``), and only while some consumer waits.
    """

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object],
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit, wake_producer)
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []
        self._scheduled = False

    def put(self, item: T) -> None:
        """Add ``item`` (never blocks; the producer checks ``full``)."""
        sizes = self._sizes
        if sizes is not None and not self._admit(item, sizes):
            return
        self._items.append(item)
        if not self._held and self._waiters:
            self._notify()

    def release(self) -> None:
        """Wake a waiting consumer if anything came since ``hold``."""
        self._held = False
        if self._items and self._waiters:
            self._notify()

    def _notify(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            try:
                self._loop.call_soon_threadsafe(self._wake_waiters)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def _wake_waiters(self) -> None:
        self._scheduled = False
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def get(self, timeout: Optional[float] = None) -> Optional[T]:
        """The next item, or None after ``timeout`` seconds (None: wait for ever)."""
        import asyncio  # (loaded already: this runs on a loop)

        items = self._items
        if not items:
            try:
                async with asyncio.timeout(timeout):
                    while not items:
                        waiter = self._loop.create_future()
                        self._waiters.append(waiter)
                        try:
                            if not items:  # an item put before we were listed
                                await waiter
                        finally:
                            self._waiters.remove(waiter)
            except TimeoutError:
                return None
        item = items.popleft()
        self._taken()
        return item
