"""A node for ordinary threaded programs.

``ThreadedNode`` runs a ``Node`` on a private gevent hub in a background
thread, so the caller needs neither gevent nor monkey-patching. Every call
is handed to that hub (``loop.run_callback_threadsafe``) and runs there in
its own greenlet, so a call that waits on one slow peer never holds up calls
about other peers; the calling thread blocks until its answer. Events cross
back through a bounded thread-safe queue. Any number of threads may share
one ``ThreadedNode``.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar
from uuid import UUID

import gevent
import gevent.event

from ..config import NodeConfig
from ..errors import NodeStateError
from .eventqueue import ThreadEventQueue
from ..events import Event, EventType, until_stop
from ..net.interfaces import Interface
from .node import Frame, Node, PeerInfo, PeerRef

__all__ = ["ThreadedNode"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ThreadedNode:
    """The ``Node`` API, safe to call from any thread; the node lives in its own thread."""

    def __init__(self, name: Optional[str] = None, *, config: Optional[NodeConfig] = None,
                 setup: Optional[Callable[[Node], None]] = None,
                 overlays: Iterable[Any] = (), **settings: Any) -> None:
        """``setup(node)``, if given, runs on the node's hub before it starts: the
        place for overlays to set HELLO headers and listeners. ``overlays``
        (``peermesh.overlay.Overlay``) are attached on the hub before the node
        starts, started after it and stopped before it."""
        self._args = (name, config, settings)
        self._setup = setup
        self._overlays = list(overlays)
        self._node: Optional[Node] = None
        self._thread: Optional[threading.Thread] = None
        self._loop: Any = None
        self._quit: Optional[gevent.event.Event] = None
        self._events: Optional[ThreadEventQueue[Event]] = None
        self._stopped = threading.Event()
        self._stop_timeout = 1.0

    # --- life cycle -----------------------------------------------------

    def start(self) -> "ThreadedNode":
        """Start the node's thread and the node; raises what ``Node.start`` raises."""
        if self._thread is not None:
            raise NodeStateError("a node starts once")
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True,
                                        name=f"peermesh-{self._args[0] or 'node'}")
        self._thread.start()
        started.result()
        return self

    def _run(self, started: "Future[None]") -> None:
        hub = gevent.get_hub()
        self._loop = hub.loop
        name, config, settings = self._args
        base = config if config is not None else NodeConfig.load()
        cfg = base.replace(name=name, **settings)
        self._events = ThreadEventQueue(cfg.event_queue, self._loop.run_callback_threadsafe)
        self._quit = gevent.event.Event()
        try:
            node = Node(config=cfg, _events=self._events)
            if self._setup is not None:
                self._setup(node)
            for overlay in self._overlays:
                overlay.attach(node)
            node.start()
            try:
                for overlay in self._overlays:
                    overlay.start()
            except BaseException:
                self._stop_overlays(1.0)
                node.stop(1.0)
                raise
            self._node = node
        except BaseException as exc:
            started.set_exception(exc)
            hub.destroy(destroy_loop=True)
            return
        started.set_result(None)
        try:
            self._quit.wait()
            self._stop_overlays(self._stop_timeout)
            self._node.stop(self._stop_timeout)
        finally:
            self._stopped.set()
            hub.destroy(destroy_loop=True)

    def _stop_overlays(self, timeout: float) -> None:
        for overlay in reversed(self._overlays):
            try:
                overlay.stop(timeout)
            except Exception:
                log.exception("stopping %r failed", overlay)

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the overlays, the node (port-0 beacon, flush up to ``timeout``) and its thread."""
        if self._node is None or self._stopped.is_set() or self._quit is None:
            return
        self._stop_timeout = timeout
        self._loop.run_callback_threadsafe(self._quit.set)
        self._stopped.wait(timeout + 5)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    def __enter__(self) -> "ThreadedNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._node is None or self._stopped.is_set():
            raise NodeStateError("node is not running" if self._node else
                                 "node is new; call start() first")
        result: Future[T] = Future()

        def run() -> None:
            try:
                result.set_result(fn(*args))
            except BaseException as exc:  # handed to the calling thread
                result.set_exception(exc)

        self._loop.run_callback_threadsafe(gevent.spawn, run)
        return result.result()

    # --- identity -------------------------------------------------------

    def _started(self) -> Node:
        if self._node is None:
            raise NodeStateError("node is new; call start() first")
        return self._node

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

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._node is not None and not self._stopped.is_set()

    # --- the Node API, marshalled onto the node's hub --------------------

    def call(self, fn: Callable[[Node], T]) -> T:
        """Run ``fn(node)`` on the node's hub and return its result (or raise its error).

        The way to start overlays (channels, workers) on a threaded node:
        they then run as greenlets beside it.
        """
        return self._call(fn, self._started())

    def join(self, group: str) -> None:
        """See ``Node.join``."""
        self._call(self._started().join, group)

    def leave(self, group: str) -> None:
        """See ``Node.leave``."""
        self._call(self._started().leave, group)

    def groups(self) -> list[str]:
        """See ``Node.groups``."""
        return self._call(self._started().groups)

    def whisper(self, peer: PeerRef, *frames: Frame) -> None:
        """See ``Node.whisper``."""
        self._call(self._started().whisper, peer, *frames)

    def shout(self, group: str, *frames: Frame) -> None:
        """See ``Node.shout``."""
        self._call(self._started().shout, group, *frames)

    def whisper_packed(self, peer: PeerRef, obj: Any) -> None:
        """See ``Node.whisper_packed``."""
        self._call(self._started().whisper_packed, peer, obj)

    def shout_packed(self, group: str, obj: Any) -> None:
        """See ``Node.shout_packed``."""
        self._call(self._started().shout_packed, group, obj)

    def flush(self, timeout: float = 1.0) -> bool:
        """See ``Node.flush``."""
        return self._call(self._started().flush, timeout)

    def peers(self) -> list[UUID]:
        """See ``Node.peers``."""
        return self._call(self._started().peers)

    def peers_by_group(self, group: str) -> list[UUID]:
        """See ``Node.peers_by_group``."""
        return self._call(self._started().peers_by_group, group)

    def peer_info(self, peer: PeerRef) -> PeerInfo:
        """See ``Node.peer_info``."""
        return self._call(self._started().peer_info, peer)

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
        assert self._events is not None
        if self._stopped.is_set() and not len(self._events):
            return None
        return self._events.get(timeout)

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over events until STOP, or until none came for ``timeout`` seconds."""
        return until_stop(self.recv, timeout)

    def __repr__(self) -> str:
        return f"<ThreadedNode {self._node!r}>"
