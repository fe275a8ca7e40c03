"""The engine under both faces of a node for programs outside gevent: ``NodeThread``.

How it works
------------
``NodeThread`` runs a ``Node`` on a private gevent hub in a thread of its
own; callers in other threads need neither gevent nor monkey-patching.

* **Calls in batches.** Callers append calls to one queue (a ``deque``:
  appends are atomic). The call that finds no wake-up pending schedules one
  hub callback (``loop.run_callback_threadsafe``), which runs every call
  queued by then, in order: a burst costs one wake-up, and no greenlet is
  spawned per call.
* **Blocking calls.** The calls of a batch run in one plain greenlet. If a
  call blocks (a slow peer's send queue is full, ``flush`` waits for its
  PING-OKs, ``call(fn)`` waits on something), that greenlet is left to
  finish it, and a fresh one runs the rest of the batch: a call that waits on
  one slow peer holds up only the calls queued behind it by the same caller.
* **Streams.** Each caller (a thread, or an asyncio task) is a ``Stream``: its
  calls run in the order it made them, and it learns their results through a
  light wake-up of its own (a lock for a thread; one ``call_soon_threadsafe``
  per batch for the tasks of a loop).
* **Sends do not wait.** ``whisper`` and ``shout`` check in the caller what
  must fail at once (node not running, no such ready peer, a frame that is
  not bytes or str, a group name over 255 octets) against the peers the hub
  publishes, copy the frames and queue the send. Every ``MARK_EVERY`` sends the
  caller waits until the hub has done its sends up to the previous mark, so
  a caller never has more than ``2 * MARK_EVERY`` sends in flight. A queued send
  that fails on the hub (its peer left meanwhile or stopped responding, which
  the node reports as EXIT) is logged at debug level.

``ThreadedNode`` (``peermesh.zre.threaded``) is the face for threads;
``peermesh.aio.AsyncNode`` the face for asyncio. Both start overlays
(``overlays=[...]``, see ``peermesh.overlay``) on the hub: attached before the
node starts, started after it, stopped in reverse order before it stops. Each
face is a ``NodeIdentity`` over a ``NodeThread`` and brings its own ``Stream``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Optional, Protocol, Sequence
from uuid import UUID

import gevent
import gevent.event
from greenlet import greenlet, getcurrent

from ..config import NodeConfig
from ..errors import NodeStateError, UnknownPeerError
from ..events import Event, EventType
from ..net.interfaces import Interface
from .node import _NO_CONTENT, Frame, Node, PeerRef, _checked_string, _frame

__all__ = ["NodeThread", "NodeIdentity", "Stream", "Attachable", "Call", "MARK", "MARK_EVERY"]

log = logging.getLogger(__name__)

#: a caller waits for the hub every this many sends (at most twice as many in flight)
MARK_EVERY = 256
#: calls one hub callback runs before it lets the hub's loop turn
_BATCH = 1024
#: looked up once: an enum member read through its class costs ~1 µs, on every event
_ENTER, _EXIT = EventType.ENTER, EventType.EXIT
#: the reply of a send that marks the caller's progress (no result, no error)
MARK: Any = object()

#: (stream, function, arguments, reply): reply is None for a send nobody waits for
Call = tuple["Stream", Callable[..., Any], tuple[Any, ...], Any]


class Attachable(Protocol):
    """What the facade needs of an overlay (``peermesh.overlay.Overlay`` is one)."""

    def attach(self, node: Node) -> None: ...
    def start(self) -> Any: ...
    def stop(self, timeout: float = 1.0) -> None: ...


class Stream:
    """One caller's calls, run in the order made; ``finish`` runs on the hub's thread."""

    __slots__ = ("busy", "pending", "sent")

    def __init__(self) -> None:
        self.busy = False  # a greenlet is blocked in one of its calls
        self.pending: deque[Call] = deque()  # queued behind that call
        self.sent = 0  # sends since the last mark (the caller's count)

    def finish(self, reply: Any, result: Any, error: Optional[BaseException]) -> None:
        """Hand the caller a call's outcome (``reply`` is what it submitted)."""
        raise NotImplementedError


class NodeThread:
    """A ``Node`` on a private gevent hub in a thread of its own, taking calls in batches.

    The engine under ``ThreadedNode`` and ``AsyncNode``; see the module docstring.
    ``make_events(limit, wake_producer)`` makes the node's event queue on the hub.
    """

    def __init__(self, name: Optional[str], config: Optional[NodeConfig],
                 settings: dict[str, Any], setup: Optional[Callable[[Node], None]],
                 overlays: Sequence[Attachable],
                 make_events: Callable[[int, Callable[[Callable[[], None]], object]], Any]
                 ) -> None:
        self._args = (name, config, settings)
        self._setup = setup
        self._overlays = list(overlays)
        self._make_events = make_events
        self.node: Optional[Node] = None
        self.events: Any = None
        #: set (to None) once the node's thread has ended
        self.finished: Future[None] = Future()
        self._thread: Optional[threading.Thread] = None
        self._inbox: deque[Call] = deque()
        self._gate = threading.Lock()  # submit vs. close
        self._open = False  # calls are taken
        self._closed = False
        self._scheduled = False  # a drain callback is on its way
        self._ready: set[UUID] = set()  # peers that said HELLO, as the hub last told
        self._blocked: set[greenlet] = set()
        self._executing: Optional[Stream] = None
        self._quit: Optional[gevent.event.Event] = None
        self._stop_timeout = 1.0
        self._loop: Any = None
        self._hub: Any = None

    # --- life cycle (any thread) -------------------------------------------------------

    def start(self) -> Future[None]:
        """Start the thread; the future is done once the node and its overlays have started."""
        if self._thread is not None:
            raise NodeStateError("a node starts once")
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True,
                                        name=f"peermesh-{self._args[0] or 'node'}")
        self._thread.start()
        return started

    @property
    def started(self) -> bool:
        """True once ``start`` was called."""
        return self._thread is not None

    @property
    def running(self) -> bool:
        """True while the node takes calls."""
        return self._open and not self._closed

    @property
    def on_hub(self) -> bool:
        """True in the node's own thread."""
        return threading.current_thread() is self._thread

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the node's thread to end."""
        if self._thread is not None and not self.on_hub:
            self._thread.join(timeout)

    def quit(self, timeout: float) -> None:
        """Stop the overlays, then the node (flushing up to ``timeout``); on the hub."""
        if self._quit is not None:
            self._stop_timeout = timeout
            self._quit.set()

    def check(self) -> Node:
        """The running node; raises ``NodeStateError`` otherwise."""
        if not self._open or self._closed:
            raise NodeStateError("node is not running" if self._open else
                                 "node is new; call start() first")
        assert self.node is not None
        return self.node

    def submit(self, call: Call) -> None:
        """Queue ``call`` for the hub (from any thread); wakes the hub once per batch."""
        with self._gate:
            if self._closed or not self._open:
                self.check()
            self._inbox.append(call)
            if not self._scheduled:
                self._scheduled = True
                self._loop.run_callback_threadsafe(self._drain)

    # --- what a send is checked against, in the caller ---------------------------------

    def peer(self, ref: PeerRef) -> UUID:
        """The UUID of ready peer ``ref`` (UUID or hex); raises as ``Node.whisper`` would."""
        self.check()
        if isinstance(ref, UUID):
            uuid = ref
        else:
            try:
                uuid = UUID(str(ref))
            except ValueError:
                raise UnknownPeerError(f"{ref!r} is not a peer UUID") from None
        if uuid not in self._ready:
            raise UnknownPeerError(f"no peer with UUID {ref}")
        return uuid

    def whisper(self, ref: PeerRef, frames: tuple[Frame, ...]) -> tuple[Any, tuple[Any, ...]]:
        """The checked call that whispers ``frames`` (copied) to ``ref``."""
        uuid = self.peer(ref)
        assert self.node is not None
        if not frames:
            raise ValueError(_NO_CONTENT.format("whisper"))
        if len(frames) == 1 and type(frames[0]) is bytes:
            return self.node.whisper, (uuid, frames[0])
        return self.node.whisper, (uuid, *map(_frame, frames))

    def shout(self, group: str, frames: tuple[Frame, ...]) -> tuple[Any, tuple[Any, ...]]:
        """The checked call that shouts ``frames`` (copied) to ``group``."""
        node = self.check()
        _checked_string("group", group)
        if not frames:
            raise ValueError(_NO_CONTENT.format("shout"))
        return node.shout, (group, *map(_frame, frames))

    # --- on the hub ----------------------------------------------------------------------

    def _run(self, started: Future[None]) -> None:
        hub = self._hub = gevent.get_hub()
        self._loop = hub.loop
        self._quit = gevent.event.Event()
        try:
            node = self._start_node()
        except BaseException as exc:  # handed to the thread that started us
            self._closed = True
            hub.destroy(destroy_loop=True)
            started.set_exception(exc)
            self.finished.set_result(None)
            return
        self.node = node
        self._open = True
        started.set_result(None)
        try:
            self._quit.wait()
            self._stop_overlays(self._stop_timeout)
            node.stop(self._stop_timeout)
        finally:
            self._close()
            hub.destroy(destroy_loop=True)
            self.finished.set_result(None)

    def _start_node(self) -> Node:
        name, config, settings = self._args
        base = config if config is not None else NodeConfig.load()
        cfg = base.replace(name=name, **settings)
        self.events = self._make_events(cfg.event_queue, self._loop.run_callback_threadsafe)
        node = Node(config=cfg, _events=self.events)
        node.add_listener(self._track, messages=False)
        try:
            if self._setup is not None:
                self._setup(node)
            for overlay in self._overlays:
                overlay.attach(node)
            node.start()
            for overlay in self._overlays:
                overlay.start()
        except BaseException:
            self._stop_overlays(0.0)
            node.stop(0.0)
            raise
        return node

    def _stop_overlays(self, timeout: float) -> None:
        for overlay in reversed(self._overlays):
            try:
                overlay.stop(timeout)
            except Exception:  # the others and the node still stop
                log.exception("overlay %r failed to stop", overlay)

    def _track(self, event: Event) -> None:
        kind = event.type
        if kind is _ENTER:
            self._ready.add(event.peer)  # type: ignore[arg-type]
        elif kind is _EXIT:
            self._ready.discard(event.peer)  # type: ignore[arg-type]

    def _drain(self) -> None:
        """The hub callback: run the queued calls, each caller's in order."""
        self._scheduled = False
        inbox = self._inbox
        while inbox:
            runner = greenlet(self._serve, parent=self._hub)
            runner.switch()
            if not runner.dead:  # blocked in a call: it finishes that caller's calls itself
                assert self._executing is not None
                self._executing.busy = True
                self._blocked.add(runner)
            elif inbox:  # served a whole batch: let the loop turn (I/O, timers) first
                self._scheduled = True
                self._loop.run_callback(self._drain)
                return

    def _serve(self) -> None:
        inbox = self._inbox
        for _ in range(_BATCH):
            if not inbox:
                return
            call = inbox.popleft()
            stream = call[0]
            if stream.busy:
                stream.pending.append(call)
                continue
            self._executing = stream
            self._execute(call)
            if stream.busy:  # this greenlet blocked in that call and was left to it
                pending = stream.pending
                while pending:
                    self._execute(pending.popleft())
                stream.busy = False
                self._blocked.discard(getcurrent())
                return

    def _execute(self, call: Call) -> None:
        stream, fn, args, reply = call
        try:
            if self._closed:
                raise NodeStateError("node is not running")
            result, error = fn(*args), None
        except BaseException as exc:  # handed to the caller
            result, error = None, exc
            if reply is None or reply is MARK:
                log.debug("queued %s failed: %s", getattr(fn, "__name__", fn), exc)
                error = None
        if reply is not None:
            stream.finish(reply, result, error)

    def _close(self) -> None:
        """Refuse new calls; fail those still queued or blocked (the node has stopped)."""
        with self._gate:
            self._closed = True
            left = list(self._inbox)
            self._inbox.clear()
        for call in left:
            self._execute(call)
        if self._blocked:
            for runner in list(self._blocked):
                self._loop.run_callback(_interrupt, runner)
            gevent.sleep(0)  # the interrupts run first; each runner then fails its queued calls


def _interrupt(runner: greenlet) -> None:
    if not runner.dead:
        runner.throw(NodeStateError("the node stopped during this call"))

class NodeIdentity:
    """Who the node behind a face is (both faces: ``ThreadedNode``, ``AsyncNode``)."""

    _engine: "NodeThread"

    def _started(self) -> Node:
        node = self._engine.node
        if node is None:
            raise NodeStateError("node is new; call start() first")
        return node

    @property
    def uuid(self) -> UUID:
        """This node's UUID."""
        return self._started().uuid

    @property
    def name(self) -> str:
        """This node's public name."""
        return self._started().name

    @property
    def endpoint(self) -> Optional[str]:
        """This node's mailbox endpoint."""
        return self._started().endpoint

    @property
    def interface(self) -> Optional[Interface]:
        """The interface the node beacons on."""
        return self._started().interface
