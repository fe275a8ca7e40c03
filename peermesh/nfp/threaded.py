"""NFP for ordinary threaded programs: an ``NfpNode`` riding on a ``ThreadedNode``.

How it works
------------
``ThreadedNode`` runs a ``Node`` on a private gevent hub in a thread of its
own and drives the overlays it is given (``overlays=[...]``): attached on
that hub before the node starts, started after it, stopped before it.
``ThreadedNfp`` is an ``NfpNode`` handed to one:

1. ``NfpNode(**nfp, setup=...)`` (not yet attached), whose setup adds the
   workers and calls the caller's own ``setup(nfp)`` if any, once the
   ``ThreadedNode`` has attached it on the hub;
2. ``start()`` starts the ``ThreadedNode``: its thread, the node, then NFP;
3. every client call (``run``, ``post``, ``get``, ``delete``, ``jobs`` ...)
   is handed to the hub (``ThreadedNode.call``) and blocks only the calling
   thread, so any number of threads may post jobs at once;
4. ``stop()`` stops the ``ThreadedNode``: NFP, then the node and its thread.

Tasks run on the node's hub, as on a gevent node: a task that blocks
without yielding (``time.sleep``, blocking I/O) holds up the node, so
blocking work goes through ``job.run_blocking(fn, ...)`` (the hub's thread
pool). ``add_listener`` callbacks run on the node's thread and must be quick.
Everything NFP sockets do stays on the node's thread (ZeroMQ sockets are not
thread-safe); only results cross threads. The node's own events (ENTER,
EXIT, ...) still queue for ``tn.node.recv()`` up to ``event_queue``; a
program that never reads them on a busy mesh should drain them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar

from ..config import NodeConfig
from ..errors import NodeStateError
from ..overlay.broker import BrokerChanged
from ..zre.threaded import ThreadedNode
from .mesh import NfpCandidate, NfpNode
from .store import ClientJob
from .worker import Tasks, TaskFunction

__all__ = ["ThreadedNfp"]

T = TypeVar("T")
#: (service, worker name or None, tasks)
WorkerSpec = tuple[str, Optional[str], Tasks | Mapping[str, TaskFunction]]


class ThreadedNfp:
    """An ``NfpNode`` (workers, client, broker candidacy) usable from any thread."""

    def __init__(self, name: Optional[str] = None, *, config: Optional[NodeConfig] = None,
                 nfp: Optional[Mapping[str, Any]] = None, workers: Iterable[WorkerSpec] = (),
                 setup: Optional[Callable[[NfpNode], None]] = None,
                 **settings: Any) -> None:
        """``nfp``: keyword arguments of ``NfpNode`` (data_dir, broker, priority, ...);
        ``workers``: ``(service, worker name or None, tasks)`` each; ``setup(nfp)`` runs
        on the node's hub before the node starts; ``settings``: those of ``Node``."""
        self._workers: list[WorkerSpec] = [(w[0], w[1], w[2]) for w in workers]
        self._user_setup = setup
        options = dict(nfp or {})
        options.setdefault("on_shutdown", self._on_shutdown)
        self.nfp = NfpNode(**options, setup=self._setup)
        self.node = ThreadedNode(name, config=config, overlays=[self.nfp], **settings)

    def _setup(self, nfp: NfpNode) -> None:
        for service, worker_name, tasks in self._workers:
            nfp.add_worker(service, worker_name, tasks)
        if self._user_setup is not None:
            self._user_setup(nfp)

    # --- life cycle -----------------------------------------------------

    def start(self) -> "ThreadedNfp":
        """Start the node's thread, the node, then NFP; raises what they raise."""
        self.node.start()
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Stop NFP (workers, broker, client, store), then the node and its thread."""
        self.node.stop(timeout)

    def _on_shutdown(self) -> None:
        # MMI shutdown, on the hub: stopping waits for the hub, so from another thread
        threading.Thread(target=self.stop, daemon=True, name="peermesh-nfp-shutdown").start()

    def __enter__(self) -> "ThreadedNfp":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self.node.running and self.nfp.running

    # --- on the node's hub ----------------------------------------------

    def call(self, fn: Callable[[NfpNode], T]) -> T:
        """Run ``fn(nfp)`` on the node's hub and return its result (or raise its error)."""
        def run(node: Any) -> T:
            if not self.nfp.running:
                raise NodeStateError(f"NFP is {self.nfp.lifecycle.value}")
            return fn(self.nfp)
        return self.node.call(run)

    def wait_settled(self, timeout: Optional[float] = None) -> bool:
        """Wait until the first broker decision has been made; True if it has."""
        return bool(self.call(lambda nfp: nfp.settled.wait(timeout)))

    def add_listener(self, callback: Callable[[BrokerChanged[NfpCandidate]], None]) -> None:
        """Call ``callback(BrokerChanged)`` on every broker change (on the node's thread)."""
        self.call(lambda nfp: nfp.add_listener(callback))

    def remove_listener(self, callback: Callable[[BrokerChanged[NfpCandidate]], None]) -> None:
        """Stop calling ``callback``."""
        self.call(lambda nfp: nfp.remove_listener(callback))

    @property
    def current_broker(self) -> Optional[NfpCandidate]:
        """The broker in use (None before the first decision or with no candidate)."""
        return self.call(lambda nfp: nfp.current_broker)

    @property
    def is_broker(self) -> bool:
        """True while this node is the active broker."""
        return self.call(lambda nfp: nfp.is_broker)

    def info(self) -> dict[str, Any]:
        """``NfpNode.info()``."""
        return self.call(lambda nfp: nfp.info())

    # --- the client -----------------------------------------------------

    def run(self, service: str, task: str, args: Optional[Sequence[Any]] = None,
            kwargs: Optional[dict[str, Any]] = None, target: str | Sequence[str] = "all",
            **options: Any) -> Any:
        """``Client.run``: POST and wait for the result (a ``Reply``)."""
        return self.call(lambda nfp: nfp.client.run(service, task, args, kwargs, target,
                                                    **options))

    def post(self, service: str, task: str, args: Optional[Sequence[Any]] = None,
             kwargs: Optional[dict[str, Any]] = None, target: str | Sequence[str] = "all",
             **options: Any) -> Any:
        """``Client.post``: 202 with the workers that accepted the job, or why not."""
        return self.call(lambda nfp: nfp.client.post(service, task, args, kwargs, target,
                                                     **options))

    def get(self, uuid: str, **options: Any) -> Any:
        """``Client.get``: each worker's status and result."""
        return self.call(lambda nfp: nfp.client.get(uuid, **options))

    def delete(self, uuid: str, **options: Any) -> Any:
        """``Client.delete``: cancel a pending or running job, forget a finished one."""
        return self.call(lambda nfp: nfp.client.delete(uuid, **options))

    def jobs(self, limit: int = 1000) -> list[ClientJob]:
        """Jobs this node posted, newest first."""
        return self.call(lambda nfp: nfp.client.jobs(limit))

    def find_job(self, text: str) -> ClientJob:
        """A posted job by UUID or unique prefix."""
        return self.call(lambda nfp: nfp.client.find_job(text))

    def __repr__(self) -> str:
        return f"<ThreadedNfp {self.node!r}>"
