"""``AsyncNode``: the node for asyncio programs.

How it works
------------
The node lives on a private gevent hub in a thread of its own: the engine
of ``ThreadedNode`` (``peermesh.zre.nodethread.NodeThread``). gevent is
imported but never runs in the loop's thread, so the program needs no
monkey-patching. Calls reach the hub in batches, one wake-up per batch;
results and events come back the same way, one ``call_soon_threadsafe`` per
batch.

Every call is a coroutine. Each task's calls run in the order it made them,
and a call that waits (``flush`` on a slow peer, ``call(fn)``) holds up only
the later calls of its own task. ``whisper`` and ``shout`` return once the
send is checked and queued: what must fail at once (node not running, no
such ready peer, a frame that is not bytes or str, a group name over 255
octets) raises in the awaiting coroutine; a queued send that fails on the
hub (its peer left meanwhile) is logged, and the node reports the peer's
EXIT. Every few hundred sends a task waits until the hub has caught up, so
a task never has more than a bounded number of sends in flight.

    async with AsyncNode("alice", interface="lo", groups=["chat"]) as node:
        async for event in node:
            if event.type is EventType.SHOUT:
                await node.whisper(event.peer, b"got it")
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, AsyncIterator, Callable, Optional, Sequence, TypeVar
from uuid import UUID

import msgpack

from .config import NodeConfig
from .errors import NodeStateError
from .events import Event, EventType
from .zre.eventqueue import LoopEventQueue
from .zre.node import Frame, Node, PeerInfo, PeerRef
from .zre.nodethread import MARK, MARK_EVERY, Attachable, NodeIdentity, NodeThread, Stream

__all__ = ["AsyncNode"]

T = TypeVar("T")


class _LoopPost:
    """Outcomes of calls for one asyncio loop: one ``call_soon_threadsafe`` per batch."""

    __slots__ = ("loop", "done", "scheduled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done: deque[tuple[asyncio.Future[Any], Any, Optional[BaseException]]] = deque()
        self.scheduled = False

    def put(self, future: asyncio.Future[Any], result: Any,
            error: Optional[BaseException]) -> None:
        """On the hub's thread: hand ``future`` its outcome."""
        self.done.append((future, result, error))
        if not self.scheduled:
            self.scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop is closed: nobody awaits any more
                pass

    def _deliver(self) -> None:
        self.scheduled = False
        done = self.done
        while done:
            future, result, error = done.popleft()
            if future.done():  # cancelled by its task
                continue
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)


class _TaskStream(Stream):
    """One task's calls; their outcomes go through the loop's ``_LoopPost``."""

    __slots__ = ("post", "marks", "last_mark")

    def __init__(self, post: _LoopPost) -> None:
        super().__init__()
        self.post = post
        self.marks: deque[asyncio.Future[None]] = deque()  # in flight, oldest first
        self.last_mark: Optional[asyncio.Future[None]] = None  # the task's side

    def finish(self, reply: Any, result: Any, error: Optional[BaseException]) -> None:
        self.post.put(self.marks.popleft() if reply is MARK else reply, result, error)


class AsyncNode(NodeIdentity):
    """The ``Node`` API as coroutines, for asyncio; the node lives in its own thread.

    Use it from the loop that started it. ``async for event in node`` reads
    events up to and including STOP.
    """

    def __init__(self, name: Optional[str] = None, *, config: Optional[NodeConfig] = None,
                 setup: Optional[Callable[[Node], None]] = None,
                 overlays: Sequence[Attachable] = (), **settings: Any) -> None:
        """Arguments as for ``ThreadedNode``: ``setup(node)`` and ``overlays`` run on
        the node's hub (attached before it starts, started after, stopped before)."""
        self._engine = NodeThread(name, config, settings, setup, overlays, self._make_events)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._post: Optional[_LoopPost] = None
        self._streams: dict[Optional[asyncio.Task[Any]], _TaskStream] = {}

    def _make_events(self, limit: int, wake: Callable[[Callable[[], None]], object]) -> Any:
        assert self._loop is not None
        return LoopEventQueue(limit, wake, self._loop)

    # --- life cycle -----------------------------------------------------

    async def start(self) -> "AsyncNode":
        """Start the node's thread, the node and its overlays; raises what they raise."""
        if self._engine.started:
            raise NodeStateError("a node starts once")
        self._loop = asyncio.get_running_loop()
        self._post = _LoopPost(self._loop)
        await asyncio.wrap_future(self._engine.start())
        return self

    async def stop(self, timeout: float = 1.0) -> None:
        """Stop the overlays, then the node (port-0 beacon, flush up to ``timeout``), then
        its thread. Sends this task queued before go out first."""
        engine = self._engine
        if not engine.running:
            return
        try:
            await self._call(engine.quit, timeout)
        except NodeStateError:
            pass  # stopped meanwhile
        await asyncio.wait([asyncio.wrap_future(engine.finished)], timeout=timeout + 5)
        engine.join(0.1)  # it has ended or is just returning

    async def __aenter__(self) -> "AsyncNode":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._engine.running

    # --- marshalling ------------------------------------------------------

    def _stream(self) -> _TaskStream:
        task = asyncio.current_task()
        stream = self._streams.get(task)
        if stream is None:
            if self._post is None:
                raise NodeStateError("node is new; call start() first")
            stream = self._streams[task] = _TaskStream(self._post)
            if task is not None:
                task.add_done_callback(self._streams.pop)
        return stream

    def _send(self, call: tuple[Any, tuple[Any, ...]]) -> Optional[asyncio.Future[None]]:
        """Queue a send; every ``MARK_EVERY`` sends, the mark to wait for."""
        stream = self._stream()
        stream.sent += 1
        if stream.sent < MARK_EVERY:
            self._engine.submit((stream, call[0], call[1], None))
            return None
        stream.sent = 0
        assert self._loop is not None
        mark = self._loop.create_future()
        stream.marks.append(mark)
        try:
            self._engine.submit((stream, call[0], call[1], MARK))
        except BaseException:
            stream.marks.pop()
            raise
        previous, stream.last_mark = stream.last_mark, mark
        return previous

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        stream = self._stream()
        assert self._loop is not None
        future: asyncio.Future[T] = self._loop.create_future()
        self._engine.submit((stream, fn, args, future))
        return await future

    # --- the Node API -----------------------------------------------------

    async def call(self, fn: Callable[[Node], T]) -> T:
        """Run ``fn(node)`` on the node's hub and return its result (or raise its error)."""
        return await self._call(fn, self._started())

    async def whisper(self, peer: PeerRef, *frames: Frame) -> None:
        """Queue ``Node.whisper``; raises at once what it would raise at once."""
        mark = self._send(self._engine.whisper(peer, frames))
        if mark is not None:
            await mark

    async def shout(self, group: str, *frames: Frame) -> None:
        """Queue ``Node.shout``; raises at once what it would raise at once."""
        mark = self._send(self._engine.shout(group, frames))
        if mark is not None:
            await mark

    async def whisper_packed(self, peer: PeerRef, obj: Any) -> None:
        """``whisper`` one msgpack-encoded object (read it with ``Event.unpack``)."""
        await self.whisper(peer, msgpack.packb(obj, use_bin_type=True))

    async def shout_packed(self, group: str, obj: Any) -> None:
        """``shout`` one msgpack-encoded object (read it with ``Event.unpack``)."""
        await self.shout(group, msgpack.packb(obj, use_bin_type=True))

    async def join(self, group: str) -> None:
        """See ``Node.join``."""
        await self._call(self._started().join, group)

    async def leave(self, group: str) -> None:
        """See ``Node.leave``."""
        await self._call(self._started().leave, group)

    async def groups(self) -> list[str]:
        """See ``Node.groups``."""
        return await self._call(self._started().groups)

    async def contest(self, group: str) -> None:
        """See ``Node.contest``."""
        await self._call(self._started().contest, group)

    async def contested(self) -> list[str]:
        """See ``Node.contested``."""
        return await self._call(self._started().contested)

    async def leader(self, group: str) -> Optional[UUID]:
        """See ``Node.leader``."""
        return await self._call(self._started().leader, group)

    async def flush(self, timeout: float = 1.0) -> bool:
        """See ``Node.flush`` (after the sends this task queued)."""
        return await self._call(self._started().flush, timeout)

    async def peers(self) -> list[UUID]:
        """See ``Node.peers``."""
        return await self._call(self._started().peers)

    async def stats(self) -> dict[str, int]:
        """See ``Node.stats``."""
        return await self._call(self._started().stats)

    async def peers_by_group(self, group: str) -> list[UUID]:
        """See ``Node.peers_by_group``."""
        return await self._call(self._started().peers_by_group, group)

    async def peer_info(self, peer: PeerRef) -> PeerInfo:
        """See ``Node.peer_info``."""
        return await self._call(self._started().peer_info, peer)

    async def peer_infos(self) -> list[PeerInfo]:
        """See ``Node.peer_infos``."""
        return await self._call(self._started().peer_infos)

    async def peer_name(self, peer: PeerRef) -> str:
        """See ``Node.peer_name``."""
        return await self._call(self._started().peer_name, peer)

    async def peer_address(self, peer: PeerRef) -> str:
        """See ``Node.peer_address``."""
        return await self._call(self._started().peer_address, peer)

    async def peer_headers(self, peer: PeerRef) -> dict[str, str]:
        """See ``Node.peer_headers``."""
        return await self._call(self._started().peer_headers, peer)

    async def peer_header_value(self, peer: PeerRef, key: str) -> Optional[str]:
        """See ``Node.peer_header_value``."""
        return await self._call(self._started().peer_header_value, peer, key)

    async def peer_groups(self, peer: PeerRef) -> list[str]:
        """See ``Node.peer_groups``."""
        return await self._call(self._started().peer_groups, peer)

    async def known_groups(self) -> list[str]:
        """See ``Node.known_groups``."""
        return await self._call(self._started().known_groups)

    async def find_peer(self, text: str) -> UUID:
        """See ``Node.find_peer``."""
        return await self._call(self._started().find_peer, text)

    # --- events ---------------------------------------------------------

    async def recv(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or None after ``timeout`` seconds (None: wait for ever)."""
        self._started()
        events: LoopEventQueue[Event] = self._engine.events
        if self._engine.finished.done() and not len(events):
            return None
        return await events.get(timeout)

    async def events(self, timeout: Optional[float] = None) -> AsyncIterator[Event]:
        """Events up to and including STOP, or until none came for ``timeout`` seconds."""
        while True:
            event = await self.recv(timeout)
            if event is None:
                return
            yield event
            if event.type is EventType.STOP:
                return

    def __aiter__(self) -> AsyncIterator[Event]:
        return self.events()

    def __repr__(self) -> str:
        return f"<AsyncNode {self._engine.node!r}>"
