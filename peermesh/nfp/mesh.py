"""NFP on a peermesh node: workers, a client and (optionally) a broker candidate.

How it works
------------
``NfpNode(node, ...)`` is created before ``node.start()``: it binds the
sockets whose endpoints go into the node's HELLO headers and sets them:

* ``X-PM-NFP-WORKER`` - JSON list, one ``{"service", "name", "endpoint"}``
  per worker of this node (``add_worker``), so clients anywhere on the mesh
  can reach them without a broker;
* ``X-PM-NFP-BROKER`` - JSON ``{"mode", "priority", "endpoint"}`` when the
  node is a broker candidate (``broker="auto"`` or ``"always"``).

``start()`` (after ``node.start()``) starts the node's ``BrokerTracker``
(``peermesh.nfp.tracker``, the socket-free part, also run on simulated
nodes): ENTER and EXIT feed the client's list of workers and the
``Election``. After one beacon interval and a half (so the first decision
sees the peers already there) the election result is applied, and again on
every change: the elected node activates its broker, a node that lost steps
down, every worker moves its broker conversation to the new broker (or
serves clients directly when there is none), the client follows, and
listeners get a ``BrokerChanged`` event.

Old finished jobs are purged from the node's store every
``purge_interval`` seconds (those older than ``retention``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional
from uuid import UUID

import gevent
import gevent.event
import zmq

from ..errors import NodeStateError
from ..net.interfaces import select_interface
from ..zre.node import Node
from .broker import Broker
from .client import Client
from .election import MODES, Candidate, Change, Election
from .store import JobStore, store_path
from .tracker import BrokerChanged, BrokerTracker, advertise_candidate
from ..io import bind_ephemeral, shared_context
from .transport import nfp_socket
from .worker import Tasks, TaskFunction, Worker, advertised

__all__ = ["NfpNode", "BrokerChanged", "WORKER_HEADER", "default_data_dir"]

log = logging.getLogger(__name__)

WORKER_HEADER = "X-PM-NFP-WORKER"


def default_data_dir() -> Path:
    """``$PEERMESH_DATA_DIR``, else ``$XDG_DATA_HOME/peermesh``, else ~/.local/share/peermesh."""
    env = os.environ.get("PEERMESH_DATA_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "share") / "peermesh"


def parse_workers(raw: Optional[str]) -> list[tuple[str, str, str]]:
    """``(service, name, endpoint)`` from an ``X-PM-NFP-WORKER`` value; [] if malformed."""
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        service, name, endpoint = item.get("service"), item.get("name"), item.get("endpoint")
        if not (isinstance(service, str) and isinstance(name, str)
                and isinstance(endpoint, str)):
            continue
        if all(v and v.isprintable() for v in (service, name, endpoint)) \
                and endpoint.startswith("tcp://") and "," not in name:
            out.append((service, name, endpoint))
    return out


class NfpNode:
    """NFP workers, client and broker candidacy of one ``Node`` (a gevent node)."""

    def __init__(self, node: Node, *, data_dir: Optional[os.PathLike[str] | str] = None,
                 broker: str = "never", priority: int = 0, keepalive: float = 1.0,
                 multiplier: int = 3, queue_timeout: float = 30.0, request_timeout: float = 5.0,
                 retention: float = 7 * 86400.0, purge_interval: float = 3600.0,
                 admin_token: Optional[str] = None,
                 inventory_dir: Optional[os.PathLike[str] | str] = None,
                 files_root: Optional[os.PathLike[str] | str] = None,
                 store_name: Optional[str] = None,
                 on_shutdown: Optional[Callable[[], None]] = None) -> None:
        if node.running or getattr(node, "_state", "new") != "new":
            raise NodeStateError("create NfpNode before node.start(): it sets HELLO headers")
        if broker not in MODES:
            raise ValueError(f"broker must be one of {', '.join(MODES)}, not {broker!r}")
        if keepalive <= 0 or multiplier < 2:
            raise ValueError("keepalive must be positive and multiplier at least 2")
        self.node = node
        self.keepalive = float(keepalive)
        self.multiplier = int(multiplier)
        self.queue_timeout = float(queue_timeout)
        self.request_timeout = float(request_timeout)
        self.purge_interval = float(purge_interval)
        self.admin_token = admin_token
        self.address = select_interface(node.config.interface).address
        self.context: zmq.Context = shared_context()
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.store = JobStore(store_path(self.data_dir, store_name or node.name), retention)
        self.workers: list[Worker] = []
        self.broker: Optional[Broker] = None
        self.candidate: Optional[Candidate] = None
        self._on_shutdown = on_shutdown
        if broker != "never":
            router = nfp_socket(self.context, zmq.ROUTER)
            endpoint = bind_ephemeral(router, self.address)
            self.broker = Broker(router, endpoint, name=node.name, node=node.uuid.hex,
                                 store=self.store, context=self.context, keepalive=keepalive,
                                 multiplier=multiplier, queue_timeout=queue_timeout,
                                 request_timeout=request_timeout, admin_token=admin_token,
                                 inventory_dir=inventory_dir, files_root=files_root,
                                 on_shutdown=self._shutdown)
            self.candidate = advertise_candidate(node, broker, int(priority), endpoint)
        self.tracker = BrokerTracker(node, self.candidate, on_change=self._on_broker_change,
                                     on_peer_entered=self._peer_entered,
                                     on_peer_left=self._peer_left)
        self.client = Client(self.store, name=node.name, node=node.uuid.hex,
                             context=self.context, request_timeout=request_timeout,
                             queue_timeout=queue_timeout)
        self._peer_workers: dict[UUID, list[str]] = {}
        self._worker_owner: dict[str, UUID] = {}
        self._greenlets: list[gevent.Greenlet] = []
        self.running = False

    @property
    def election(self) -> Election:
        """The candidates in view and the broker they imply."""
        return self.tracker.election

    @property
    def settled(self) -> gevent.event.Event:
        """Set once the first broker decision has been applied."""
        return self.tracker.settled

    # --- set-up ---------------------------------------------------------

    def add_worker(self, service: str, name: Optional[str] = None,
                   tasks: Optional[Tasks | Mapping[str, TaskFunction]] = None) -> Worker:
        """Add a worker of ``service`` (before ``node.start()``); name defaults to the node's."""
        if self.node.running:
            raise NodeStateError("add workers before node.start(): they go in HELLO headers")
        name = name or (self.node.name if not self.workers else f"{self.node.name}.{service}")
        if any(w.name == name for w in self.workers):
            raise ValueError(f"this node already has a worker named {name!r}")
        worker = Worker(service, name, tasks or Tasks(), self.store, address=self.address,
                        context=self.context, keepalive=self.keepalive,
                        multiplier=self.multiplier, admin_token=self.admin_token,
                        node_name=self.node.name, on_shutdown=self._stop_worker)
        self.workers.append(worker)
        self.node.set_header(WORKER_HEADER, advertised(self.workers))
        return worker

    def add_listener(self, callback: Callable[[BrokerChanged], None]) -> None:
        """Call ``callback(BrokerChanged)`` when the broker changes (on the hub)."""
        self.tracker.add_listener(callback)

    def remove_listener(self, callback: Callable[[BrokerChanged], None]) -> None:
        """Stop calling ``callback``."""
        self.tracker.remove_listener(callback)

    # --- life cycle -----------------------------------------------------

    def start(self) -> "NfpNode":
        """Start workers, client and broker standby (after ``node.start()``)."""
        node = self.node
        if not node.running:
            raise NodeStateError("start the node first: NfpNode.start() follows node.start()")
        if self.running:
            return self
        self.running = True
        self.client.start()
        for worker in self.workers:
            worker.start()
            self.client.add_worker(worker.name, worker.service, worker.endpoint)
        if self.broker is not None:
            self.broker.start()
        self.tracker.start()
        self._greenlets = [gevent.spawn(self._purger)]
        return self

    def stop(self) -> None:
        """Stop everything NFP on this node (the node itself keeps running)."""
        if not self.running:
            return
        self.running = False
        self.tracker.stop()
        gevent.killall(self._greenlets, block=False)
        for worker in self.workers:
            worker.stop()
        if self.broker is not None:
            self.broker.close()
        self.client.stop()
        self.store.close()

    def __enter__(self) -> "NfpNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _shutdown(self) -> None:
        if self._on_shutdown is not None:
            self._on_shutdown()
            return
        self.stop()
        gevent.spawn(self.node.stop)

    def _stop_worker(self, worker: Worker) -> None:
        worker.stop()
        self.client.remove_worker(worker.name, "worker shut down")

    def _purger(self) -> None:
        while True:
            try:
                removed = self.store.purge()
                if removed:
                    log.info("purged %d finished job(s) older than %gs", removed,
                             self.store.retention)
            except Exception:
                log.exception("purging old jobs failed")
            gevent.sleep(self.purge_interval)

    # --- the mesh -------------------------------------------------------

    def _forget_workers(self, uuid: UUID, reason: str) -> None:
        for worker_name in self._peer_workers.pop(uuid, []):
            # a restarted worker comes back under its name from a new node: keep that one
            if self._worker_owner.get(worker_name) == uuid:
                del self._worker_owner[worker_name]
                self.client.remove_worker(worker_name, reason)

    def _peer_entered(self, uuid: UUID, headers: Mapping[str, str], name: str) -> None:
        self._forget_workers(uuid, "its node said HELLO again")
        found = parse_workers(headers.get(WORKER_HEADER))
        own = {w.name for w in self.workers}
        names = []
        for service, worker_name, endpoint in found:
            if worker_name in own:
                log.warning("peer %s advertises worker %r, a name this node uses; ignored",
                            name, worker_name)
                continue
            self.client.add_worker(worker_name, service, endpoint)
            self._worker_owner[worker_name] = uuid
            names.append(worker_name)
        if names:
            self._peer_workers[uuid] = names

    def _peer_left(self, uuid: UUID) -> None:
        self._forget_workers(uuid, "its node left the mesh")

    def _on_broker_change(self, change: Change) -> None:
        """The tracker's decision changed: start/stop the broker, move workers and client."""
        new = change.new
        if self.broker is not None:
            if change.took_over or (new is not None and new.uuid == self.node.uuid):
                self.broker.activate()
            else:
                self.broker.deactivate()
        endpoint = new.endpoint if new is not None else None
        for worker in self.workers:
            worker.connect_broker(endpoint)
        self.client.set_broker(new)

    # --- introspection --------------------------------------------------

    @property
    def current_broker(self) -> Optional[Candidate]:
        """The broker in use (None before the first decision or with no candidate)."""
        return self.tracker.current_broker

    @property
    def is_broker(self) -> bool:
        """True while this node is the active broker."""
        return self.broker is not None and self.broker.active

    def info(self) -> dict[str, Any]:
        """A summary: node, workers, broker, candidates."""
        broker = self.current_broker
        return {"node": self.node.name, "uuid": self.node.uuid.hex, "store": str(self.store.path),
                "workers": [w.info() for w in self.workers],
                "broker": {"name": broker.name, "endpoint": broker.endpoint,
                           "uuid": broker.uuid.hex} if broker else None,
                "is_broker": self.is_broker,
                "candidates": [{"name": c.name, "uuid": c.uuid.hex, "priority": c.priority,
                                "mode": c.mode} for c in self.election.candidates()]}
