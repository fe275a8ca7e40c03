"""Bounded queues that carry events from a node to the application.

The node (on its hub) ``put``s; the application ``get``s. When a queue holds
``limit`` events the node stops reading its mailbox until the application has
taken half of them, so a slow application pushes back on its peers instead of
growing memory without bound.

Counting events does not bound memory when the events are large, so a node
also bounds the octets of content waiting (``bound_bytes``): the queue never
holds more than that many octets of WHISPER/SHOUT content. An item that does
not fit in what is left waits beside the queue (with every item put after it,
so order is kept) and the producer stops reading, exactly as for ``limit``,
until consumers have taken enough for it to enter: a slow application pushes
back on its peers, nothing it was sent is dropped. What waits is at most the
rest of one batch the producer was handling. Only an item whose content alone
is larger than the bound can never enter: it is dropped and counted in
``dropped``. Octets are counted on the producer's side only: consumers take
items in order, so the producer learns what they took from the queue's length
(when the count nears the bound, or every ``_RECOUNT`` items), and no lock is
needed; the producer tells consumers the queue length at which it may go on
(``_resume_at``).
``GreenEventQueue`` serves a consumer on the
same hub; ``ThreadEventQueue`` serves consumers in other threads;
``LoopEventQueue`` serves the tasks of an asyncio loop in another thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypeVar

import gevent
import gevent.event
from gevent.hub import Waiter, getcurrent

if TYPE_CHECKING:  # asyncio only where a loop is served: a plain node does not load it
    import asyncio

__all__ = ["GreenEventQueue", "ThreadEventQueue", "LoopEventQueue"]

T = TypeVar("T")


class _ByteBound(Generic[T]):
    """The producer's side of a queue: its bounds in items and in octets of content
    (see the module).

    Every attribute is a slot set in ``__init__`` (none falls back to a class default
    first and lives on the instance later): ``put`` and ``get`` run once per event
    received, and slot reads are the cheapest Python has. ``put`` with the octet bound
    checks every rare case in one test and leaves them to ``_put_checked``.
    """

    __slots__ = ("limit", "max_bytes", "size", "dropped", "admitted", "pauses", "_items",
                 "_room", "_sizes", "_waiting", "_resume_at", "_held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: octets of content the queue may hold (0: no bound in octets)
        self.max_bytes = 0
        #: octets of content held (including items taken since the last recount)
        self.size = 0
        #: items dropped because their content alone is larger than ``max_bytes``
        self.dropped = 0
        #: octets of content admitted, ever (the metrics' bytes received)
        self.admitted = 0
        #: times the queue was full and its producer had to wait (``event_queue``)
        self.pauses = 0
        self._items: deque[T] = deque()
        self._room = gevent.event.Event()
        self._room.set()
        #: the content octets of each item not yet known to be taken, oldest first
        #: (None: no bound in octets)
        self._sizes: Optional[deque[int]] = None
        #: items put while there was no room for them, with their octets, oldest first
        self._waiting: deque[tuple[T, int]] = deque()
        #: the queue length at which a producer waiting for room may go on
        self._resume_at = 0
        self._held = False  # between ``hold`` and ``release``: consumers are woken once

    def bound_bytes(self, limit: int) -> None:
        """Hold at most ``limit`` octets of content (``item.frames``); what does not fit
        waits for room, and the producer's ``full()`` says so."""
        self.max_bytes = limit
        self._sizes = deque()
        self._waiting = deque()

    def _enter(self, item: T) -> None:
        """Append ``item`` to the queue and wake a consumer (each queue's own way); between
        ``hold`` and ``release`` every queue only appends (``put`` does it itself)."""
        raise NotImplementedError

    def put(self, item: T) -> None:
        """Add ``item`` (never blocks; the producer checks ``full`` to pace itself)."""
        sizes = self._sizes
        if sizes is None:
            if self._held:
                self._items.append(item)   # (what ``_enter`` does between hold and release)
            else:
                self._enter(item)
            return
        frames = item.frames  # type: ignore[attr-defined]
        size = len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
        held = self.size + size
        if self._waiting or held > self.max_bytes or len(sizes) - len(self._items) > _RECOUNT:
            self._put_checked(item, size, sizes)
            return
        self.size = held
        self.admitted += size
        sizes.append(size)
        if self._held:
            self._items.append(item)   # (every queue's ``_enter`` between hold and release:
        else:                          # one batch's items wait for ``release`` to wake)
            self._enter(item)

    def put_each(self, items: list[T], octets: list[int]) -> None:
        """``put`` each of ``items`` in order, ``octets`` being the octets of each one's
        content: one call for a batch, the bounds checked once for all of it (an item
        that does not fit, or a recount due, and each is ``put`` on its own)."""
        sizes = self._sizes
        if sizes is not None:
            total = sum(octets)
            held = self.size + total
            if (self._waiting or held > self.max_bytes
                    or len(sizes) - len(self._items) > _RECOUNT):
                for item in items:
                    self.put(item)
                return
            self.size = held
            self.admitted += total
            sizes += octets
        if self._held:
            self._items += items   # (what ``_enter`` does between hold and release)
        else:
            for item in items:
                self._enter(item)

    def _put_checked(self, item: T, size: int, sizes: deque[int]) -> None:
        """``put`` when items wait already, or the count of octets is due (near the
        bound, or ``_RECOUNT`` items taken since the last recount)."""
        waiting = self._waiting
        if waiting:  # behind what waits already: order is kept
            waiting.append((item, size))
            return
        self._recount(sizes)
        if size and self.size + size > self.max_bytes:
            if size > self.max_bytes:  # can never fit
                self.dropped += 1
            else:
                waiting.append((item, size))
            return
        self.size += size
        self.admitted += size
        sizes.append(size)
        self._enter(item)

    def full(self) -> bool:
        """For the producer: True when it should stop until ``wait_room`` returns.

        Moves what waits into the queue as far as there is room first.
        """
        while True:
            items = self._items
            if self._waiting:
                resume_at = self._let_in()
            elif len(items) >= self.limit:
                resume_at = self.limit // 2
            else:
                return False
            self._resume_at = resume_at
            self._room.clear()
            if len(items) > resume_at:  # (checked after clearing: a consumer that took
                self.pauses += 1        # items meanwhile saw the room cleared, or not)
                return True
            self._room.set()

    def _let_in(self) -> int:
        """Move waiting items that fit into the queue; the queue length at which the
        next one fits (-1: none waits, only the count bound is left to check)."""
        sizes = self._sizes
        assert sizes is not None
        self._recount(sizes)
        waiting, items = self._waiting, self._items
        while waiting:
            item, size = waiting[0]
            if self.size + size > self.max_bytes or len(items) >= self.limit:
                break
            waiting.popleft()
            self.size += size
            self.admitted += size
            sizes.append(size)
            self._enter(item)
        if not waiting:
            return self.limit // 2 if len(items) >= self.limit else len(items)
        need, left = self.size + waiting[0][1] - self.max_bytes, len(items)
        for size in sizes:  # the oldest first: how many must go for the next one to fit
            if need <= 0:
                break
            need -= size
            left -= 1
        return min(left, self.limit // 2 if len(items) >= self.limit else left)

    def spill(self) -> None:
        """Queue whatever waits, bounds or not: the producer stops for good."""
        waiting, sizes = self._waiting, self._sizes
        while waiting:
            item, size = waiting.popleft()
            self.size += size
            if sizes is not None:
                sizes.append(size)
            self._enter(item)

    def blocked(self) -> bool:
        """True while the producer waits for consumers to make room."""
        return not self._room.is_set()

    def waiting(self) -> int:
        """Items put that wait for room (not in the queue yet)."""
        return len(self._waiting)

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


class GreenEventQueue(_ByteBound[T]):
    """Producer and consumer are greenlets on one hub.

    A consumer waiting in ``get`` is switched to straight from the hub
    (where the mailbox drains), which saves a trip round the event loop on
    every wake-up; between ``hold`` and ``release`` (one drained batch) it is
    woken once, at the end, so a burst costs one switch, not one per event.
    """

    __slots__ = ("_waiters", "_hub", "_loop", "_timer", "_timer_for")

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._waiters: deque[Waiter] = deque()
        self._hub = gevent.get_hub()
        self._loop = self._hub.loop
        #: the timer of the last ``get`` that waited with a timeout, kept for the next one
        #: of the same timeout (a consumer that waits per event makes no timer each time)
        self._timer: Any = None
        self._timer_for = 0.0   # the timeout it was made for

    def __len__(self) -> int:
        return len(self._items)

    def _enter(self, item: T) -> None:
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

    def wait_room(self) -> None:
        """Block the producer until the consumer has made room (see ``full``)."""
        self._room.wait()

    def get(self, timeout: Optional[float] = None) -> Optional[T]:
        """The next item, or None after ``timeout`` seconds (None: wait for ever)."""
        items = self._items
        started = None   # the hub's clock when the first wait began
        while not items:
            # The usual wait (a consumer that waits per event): one Waiter, the kept timer
            # started and stopped, no clock read; woken for an item another consumer took,
            # it waits for what is left of ``timeout`` on a timer of its own
            if timeout is None:
                timer = None
            elif started is None:
                if timeout <= 0:
                    return None
                timer = self._timer
                if timer is None or self._timer_for != timeout or timer.active:
                    timer = self._keep_timer(timeout)
            else:
                self._loop.update_now()
                left = started + timeout - self._loop.now()
                if left <= 0:
                    return None
                timer = self._loop.timer(left)
            waiter: Waiter = Waiter(self._hub)
            self._waiters.append(waiter)
            if timer is not None:
                if started is None:   # (``again``: the whole timeout, repeated until stopped)
                    timer.again(waiter.switch, _TIMED_OUT, update=True)
                    started = self._loop.now()   # (just updated: no clock read of its own)
                else:
                    timer.start(waiter.switch, _TIMED_OUT, update=True)
            try:
                woken = waiter.get()
            finally:
                if timer is not None:
                    if timer is self._timer:
                        timer.stop()
                    else:
                        timer.close()
                if self._waiters and waiter in self._waiters:  # put() did not take it
                    self._waiters.remove(waiter)
            if woken is _TIMED_OUT and not items:
                return None
        item = items.popleft()
        if len(items) <= self._resume_at and not self._room.is_set():
            self._room.set()
        return item

    def _keep_timer(self, timeout: float) -> Any:
        """The timer for a wait of ``timeout``: one kept for the next wait of the same
        timeout (made anew for another timeout), or one of its own while the kept one
        runs for another consumer. It repeats every ``timeout`` (``again`` restarts it
        from the whole of it: a timer stopped early keeps only what was left)."""
        timer = self._timer
        if timer is not None and timer.active:   # another consumer waits on it
            return self._loop.timer(timeout, timeout)
        if timer is not None:
            timer.close()
        timer = self._timer = self._loop.timer(timeout, timeout)
        self._timer_for = timeout
        return timer


_TIMED_OUT = object()


class _HandOff(_ByteBound[T]):
    """The part every cross-thread queue shares: the producer is a greenlet on a hub,
    consumers are elsewhere.

    ``wake_producer`` must be safe to call from any thread (for instance
    ``loop.run_callback_threadsafe``) and is how consumers release a producer
    that waits for room.
    """

    __slots__ = ("_wake",)

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object]) -> None:
        super().__init__(limit)
        self._wake = wake_producer

    def __len__(self) -> int:
        return len(self._items)

    def wait_room(self) -> None:
        """Block the producer until consumers have made room (see ``full``)."""
        self._room.wait()

    def hold(self) -> None:
        """Queue without waking consumers until ``release`` (one batch)."""
        self._held = True

    def _taken(self) -> None:
        """After a consumer took an item: release a producer waiting for room."""
        if not self._room.is_set() and len(self._items) <= self._resume_at:
            self._wake(self._room.set)


class ThreadEventQueue(_HandOff[T]):
    """Producer is a greenlet on a hub in one thread; consumers are other threads."""

    __slots__ = ("_lock",)

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object]) -> None:
        super().__init__(limit, wake_producer)
        self._lock = threading.Condition(threading.Lock())

    def _enter(self, item: T) -> None:
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

    __slots__ = ("_loop", "_waiters", "_scheduled")

    def __init__(self, limit: int, wake_producer: Callable[[Callable[[], None]], object],
                 loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit, wake_producer)
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []
        self._scheduled = False

    def _enter(self, item: T) -> None:
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
