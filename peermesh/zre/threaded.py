"""A node for ordinary threaded programs: ``ThreadedNode``.

How it works
------------
``ThreadedNode`` is the face for threads of the engine in
``peermesh.zre.nodethread``: a ``NodeThread`` runs the ``Node`` on a private
gevent hub in a thread of its own, taking calls in batches; callers need
neither gevent nor monkey-patching. Each calling thread is a stream of its own
(``_ThreadStream``): its calls run in the order it made them, and it sleeps on
a lock of its own while the hub works, woken once per call it waits for
(``whisper`` and ``shout`` return once checked and queued; every
``MARK_EVERY`` sends the caller waits for the hub's progress). Overlays
(``overlays=[...]``) are attached on the hub before the node starts, started
after it and stopped in reverse order before it stops.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar
from uuid import UUID

import msgpack

from ..config import NodeConfig
from ..errors import NodeStateError
from ..events import Event, until_stop
from .eventqueue import ThreadEventQueue
from .node import Frame, Node, PeerInfo, PeerRef
from .nodethread import MARK, MARK_EVERY, Attachable, NodeIdentity, NodeThread, Stream

__all__ = ["ThreadedNode"]

T = TypeVar("T")

#: the reply of a call whose caller waits for its value
_VALUE: Any = object()


class _ThreadStream(Stream):
    """A thread's calls; it sleeps on its own lock while the hub works."""

    __slots__ = ("wake", "marked", "result", "error")

    def __init__(self) -> None:
        super().__init__()
        self.wake = threading.Lock()
        self.wake.acquire()  # released once per finished call it waits for
        self.marked = False  # a mark is in flight: its release is still to be taken
        self.result: Any = None
        self.error: Optional[BaseException] = None

    def finish(self, reply: Any, result: Any, error: Optional[BaseException]) -> None:
        if reply is _VALUE:
            self.result, self.error = result, error
        self.wake.release()


class ThreadedNode(NodeIdentity):
    """The ``Node`` API, safe to call from any thread; the node lives in its own thread.

    ``whisper``/``shout`` (and their ``_packed`` forms) return once the send
    is checked and queued; every other call returns its answer. Calls from
    one thread run in the order made. Any number of threads may share one
    ``ThreadedNode``; code that runs on the node's own hub (``setup``,
    overlays, ``call(fn)``) uses the ``Node`` it is given instead.
    """

    def __init__(self, name: Optional[str] = None, *, config: Optional[NodeConfig] = None,
                 setup: Optional[Callable[[Node], None]] = None,
                 overlays: Sequence[Attachable] = (), **settings: Any) -> None:
        """``setup(node)``, if given, runs on the node's hub before it starts;
        ``overlays`` are attached after it, started after the node, and stopped
        (last first) before it."""
        self._engine = NodeThread(name, config, settings, setup, overlays, ThreadEventQueue)
        self._local = threading.local()

    # --- life cycle -----------------------------------------------------

    def start(self) -> "ThreadedNode":
        """Start the node's thread, the node and its overlays; raises what they raise."""
        self._engine.start().result()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the overlays, then the node (port-0 beacon, flush up to ``timeout``), then
        its thread. Sends this thread queued before go out first."""
        engine = self._engine
        if not engine.running:
            return
        if engine.on_hub:
            engine.quit(timeout)
            return
        try:
            self._call(engine.quit, timeout)
        except NodeStateError:
            pass  # another thread stopped it meanwhile
        engine.join(timeout + 5)

    def __enter__(self) -> "ThreadedNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._engine.running

    # --- marshalling ------------------------------------------------------

    def _stream(self) -> _ThreadStream:
        try:
            stream: _ThreadStream = self._local.stream
        except AttributeError:
            stream = self._local.stream = _ThreadStream()
        return stream

    def _wait(self, stream: _ThreadStream) -> None:
        try:
            stream.wake.acquire()
        except BaseException:  # interrupted: its late wake-up must not answer the next call
            self._local.stream = _ThreadStream()
            raise

    def _send(self, call: tuple[Any, tuple[Any, ...]]) -> None:
        stream = self._stream()
        stream.sent += 1
        if stream.sent < MARK_EVERY:
            self._engine.submit((stream, call[0], call[1], None))
            return
        stream.sent = 0
        if stream.marked:
            self._wait(stream)
            stream.marked = False
        self._engine.submit((stream, call[0], call[1], MARK))
        stream.marked = True

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        stream = self._stream()
        if stream.marked:
            self._wait(stream)
            stream.marked = False
        self._engine.submit((stream, fn, args, _VALUE))
        self._wait(stream)
        error = stream.error
        if error is not None:
            stream.error = None
            raise error
        result, stream.result = stream.result, None
        return result  # type: ignore[no-any-return]

    # --- the Node API, marshalled onto the node's hub --------------------

    def call(self, fn: Callable[[Node], T]) -> T:
        """Run ``fn(node)`` on the node's hub and return its result (or raise its error)."""
        return self._call(fn, self._started())

    def whisper(self, peer: PeerRef, *frames: Frame) -> None:
        """Queue ``Node.whisper``; raises at once what it would raise at once."""
        self._send(self._engine.whisper(peer, frames))

    def shout(self, group: str, *frames: Frame) -> None:
        """Queue ``Node.shout``; raises at once what it would raise at once."""
        self._send(self._engine.shout(group, frames))

    def whisper_packed(self, peer: PeerRef, obj: Any) -> None:
        """``whisper`` one msgpack-encoded object (see ``Node.whisper_packed``)."""
        self.whisper(peer, msgpack.packb(obj, use_bin_type=True))

    def shout_packed(self, group: str, obj: Any) -> None:
        """``shout`` one msgpack-encoded object (see ``Node.shout_packed``)."""
        self.shout(group, msgpack.packb(obj, use_bin_type=True))

    def join(self, group: str) -> None:
        """See ``Node.join``."""
        self._call(self._started().join, group)

    def leave(self, group: str) -> None:
        """See ``Node.leave``."""
        self._call(self._started().leave, group)

    def groups(self) -> list[str]:
        """See ``Node.groups``."""
        return self._call(self._started().groups)

    def contest(self, group: str) -> None:
        """See ``Node.contest``."""
        self._call(self._started().contest, group)

    def contested(self) -> list[str]:
        """See ``Node.contested``."""
        return self._call(self._started().contested)

    def leader(self, group: str) -> Optional[UUID]:
        """See ``Node.leader``."""
        return self._call(self._started().leader, group)

    def flush(self, timeout: float = 1.0) -> bool:
        """See ``Node.flush`` (after the sends this thread queued)."""
        return self._call(self._started().flush, timeout)

    def peers(self) -> list[UUID]:
        """See ``Node.peers``."""
        return self._call(self._started().peers)

    def stats(self) -> dict[str, int]:
        """See ``Node.stats``."""
        return self._call(self._started().stats)

    def peers_by_group(self, group: str) -> list[UUID]:
        """See ``Node.peers_by_group``."""
        return self._call(self._started().peers_by_group, group)

    def peer_info(self, peer: PeerRef) -> PeerInfo:
        """See ``Node.peer_info``."""
        return self._call(self._started().peer_info, peer)

    def peer_infos(self) -> list[PeerInfo]:
        """See ``Node.peer_infos``."""
        return self._call(self._started().peer_infos)

    def peer_name(self, peer: PeerRef) -> str:
        """See ``Node.peer_name``."""
        return self._call(self._started().peer_name, peer)

    def peer_address(self, peer: PeerRef) -> str:
        """See ``Node.peer_address``."""
        return self._call(self._started().peer_address, peer)

    def peer_headers(self, peer: PeerRef) -> dict[str, str]:
        """See ``Node.peer_headers``."""
        return self._call(self._started().peer_headers, peer)

    def peer_header_value(self, peer: PeerRef, key: str) -> Optional[str]:
        """See ``Node.peer_header_value``."""
        return self._call(self._started().peer_header_value, peer, key)

    def peer_groups(self, peer: PeerRef) -> list[str]:
        """See ``Node.peer_groups``."""
        return self._call(self._started().peer_groups, peer)

    def known_groups(self) -> list[str]:
        """See ``Node.known_groups``."""
        return self._call(self._started().known_groups)

    def find_peer(self, text: str) -> UUID:
        """See ``Node.find_peer``."""
        return self._call(self._started().find_peer, text)

    # --- events ---------------------------------------------------------

    def recv(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or None after ``timeout`` seconds (None: wait for ever)."""
        self._started()
        events = self._engine.events
        if not len(events) and self._engine.finished.done():  # (done() takes a lock)
            return None
        event: Optional[Event] = events.get(timeout)
        return event

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over events until STOP, or until none came for ``timeout`` seconds."""
        return until_stop(self.recv, timeout)

    def __repr__(self) -> str:
        return f"<ThreadedNode {self._engine.node!r}>"
