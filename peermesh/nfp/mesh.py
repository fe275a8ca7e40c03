"""NFP on a peermesh node: workers, a client and (optionally) a broker candidate.

How it works
------------
``NfpNode`` is an ``Overlay``: attached to its node before ``node.start()``
(``NfpNode(node, ...)`` attaches at once; ``NfpNode(...)`` without a node is
attached by ``ThreadedNode(overlays=[...])`` or ``attach(node)``), it binds
the sockets whose endpoints go into the node's HELLO headers and sets them:

* ``X-PM-NFP-WORKER`` - JSON list, one ``{"service", "name", "endpoint"}``
  per worker of this node (``add_worker``), so clients anywhere on the mesh
  can reach them without a broker;
* ``X-PM-BROKER`` - the neutral candidacy (``peermesh.overlay.election``)
  when the node is a broker candidate (``broker="auto"`` or ``"always"``),
  and ``X-PM-NFP-BROKER`` - JSON ``{"mode", "priority", "endpoint"}``: where
  its NFP broker listens (mode and priority too, as older versions read
  candidacy from it);
* ``X-PM-ROLES`` - ``nfp-client``, plus ``nfp-worker`` and ``nfp-broker``
  as the node plays them.

Its parts are overlays of the same node: a ``Client``, a ``Worker`` per
``add_worker``, the ``Broker`` of a candidate and the neutral
``BrokerTracker`` (``peermesh.overlay.broker``, also run on simulated
nodes). ``start()`` (after ``node.start()``) starts them: ENTER and EXIT
feed the client's list of workers and the election. After one beacon
interval and a half (so the first decision sees the peers already there)
the election result is applied, and again on every change: the elected
node activates its broker, a node that lost steps down, every worker moves
its broker conversation to the new broker (or serves clients directly when
there is none), the client follows, and listeners get a ``BrokerChanged``
whose candidates carry the NFP broker's ``endpoint``. An elected node that
advertises no NFP broker counts as no broker for NFP (clients go direct).

Old finished jobs are purged from the node's store every
``purge_interval`` seconds (those older than ``retention``).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional
from uuid import UUID

import gevent
import gevent.event
import zmq

from ..counters import Counters
from ..errors import NodeStateError
from ..io import shared_context
from ..net.interfaces import select_interface
from ..overlay import Lifecycle, Overlay, PeerNetworks, advertise, header_endpoint, header_json
from ..events import tell
from ..overlay.broker import BrokerChanged, BrokerTracker
from ..overlay.election import NFP_BROKER_HEADER, MODES, Candidate, Change, Election
from ..zre.node import Node
from .broker import Broker
from .client import Client
from .store import JobStore, store_path
from ..io.curve import Curve, shared_allowlist
from ..io.zap import Allowlist
from ..wire.nfp import MAX_MESSAGE
from ..wire.zre import PUBLIC_KEY_HEADER
from ..config import default_data_dir
from .grants import Grants
from .worker import (MAX_CLIENTS, MAX_STORED, MAX_STORED_PER_CLIENT, Tasks, TaskFunction, Worker,
                     advertised)

__all__ = ["NfpNode", "NfpCandidate", "WORKER_HEADER", "NFP_BROKER_HEADER",
           "default_data_dir"]

log = logging.getLogger(__name__)

WORKER_HEADER = "X-PM-NFP-WORKER"


@dataclass(frozen=True, slots=True)
class NfpCandidate(Candidate):
    """A broker candidate as NFP uses it: the elected node and its NFP broker's endpoint."""

    endpoint: str = ""


def parse_workers(raw: Optional[str]) -> list[tuple[str, str, str]]:
    """``(service, name, endpoint)`` from an ``X-PM-NFP-WORKER`` value; [] if malformed."""
    items = header_json(raw, WORKER_HEADER)
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


def parse_broker_endpoint(raw: Optional[str]) -> Optional[str]:
    """The ``endpoint`` of an ``X-PM-NFP-BROKER`` value; None if absent or malformed."""
    return header_endpoint(raw, "endpoint", NFP_BROKER_HEADER)


class NfpNode(Overlay):
    """NFP workers, client and broker candidacy of one ``Node`` (a gevent node)."""

    def __init__(self, node: Optional[Node] = None, *,
                 data_dir: Optional[os.PathLike[str] | str] = None,
                 broker: str = "never", priority: int = 0, keepalive: float = 1.0,
                 multiplier: int = 3, queue_timeout: float = 30.0, request_timeout: float = 5.0,
                 retention: float = 7 * 86400.0, purge_interval: float = 3600.0,
                 admin_token: Optional[str] = None,
                 admin_keys: Optional[os.PathLike[str] | str] = None,
                 grants: Optional[os.PathLike[str] | str] = None,
                 inventory_dir: Optional[os.PathLike[str] | str] = None,
                 files_root: Optional[os.PathLike[str] | str] = None,
                 store_name: Optional[str] = None,
                 peer_networks: Optional[Iterable[str]] = None,
                 on_shutdown: Optional[Callable[[], None]] = None,
                 setup: Optional[Callable[["NfpNode"], None]] = None) -> None:
        """``node``: attach to it at once (else attach later, before the node starts);
        ``setup(nfp)`` runs once attached (add workers and listeners there);
        ``peer_networks``: networks (CIDR) the broker and worker endpoints peers
        advertise must be in (default: the network of the node's interface)."""
        super().__init__()
        if broker not in MODES:
            raise ValueError(f"broker must be one of {', '.join(MODES)}, not {broker!r}")
        if keepalive <= 0 or multiplier < 2:
            raise ValueError("keepalive must be positive and multiplier at least 2")
        self.mode = broker
        self.priority = int(priority)
        self.keepalive = float(keepalive)
        self.multiplier = int(multiplier)
        self.queue_timeout = float(queue_timeout)
        self.request_timeout = float(request_timeout)
        self.retention = float(retention)
        self.purge_interval = float(purge_interval)
        self.admin_token = admin_token
        #: directory of the public certificates allowed the destructive MMI calls, on a
        #: node with keys (instead of ``admin_token``, which is then not used)
        self.admin_keys_dir = admin_keys
        self.admin_keys: Optional[Allowlist] = None
        #: TOML file of the tasks and FSS files each public key may use, on a node with
        #: keys (see ``peermesh.nfp.grants``); None: any allowed key may use any
        self.grants_file = grants
        self.grants: Optional[Grants] = None
        self.inventory_dir = inventory_dir
        self.files_root = files_root
        self.store_name = store_name
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        self.workers: list[Worker] = []
        self.broker: Optional[Broker] = None
        self.tracker = BrokerTracker(broker, self.priority, on_change=self._on_broker_change,
                                     on_peer_entered=self._peer_entered,
                                     on_peer_left=self._peer_left)
        # set by attach: the interface address, ZeroMQ context, store and client
        self.address: str
        self.context: zmq.Context
        self.store: JobStore
        self.client: Client
        self._on_shutdown = on_shutdown
        self._setup = setup
        self._listeners: list[Callable[[BrokerChanged[NfpCandidate]], None]] = []
        self._current: Optional[NfpCandidate] = None
        self._endpoints: dict[UUID, str] = {}    # candidates' NFP broker endpoints
        self._peer_workers: dict[UUID, list[str]] = {}
        self._worker_owner: dict[str, UUID] = {}
        #: NFP endpoint -> the Z85 key of its node (from its authenticated X-PUBLICKEY), for
        #: the CURVE clients of a node with keys
        self.keys: dict[str, str] = {}
        self._keyed: dict[UUID, list[str]] = {}  # the endpoints each peer's key is held for
        self._greenlets: list[gevent.Greenlet] = []
        #: refusals by limit: ``peer_networks`` (endpoints peers advertised outside them)
        self.limits = Counters(log, "NFP node hit its limits")
        self.peer_networks = PeerNetworks(peer_networks, self.limits)
        if node is not None:
            self.attach(node)

    @property
    def election(self) -> Election:
        """The candidates in view and the broker they imply."""
        return self.tracker.election

    @property
    def settled(self) -> gevent.event.Event:
        """Set once the first broker decision has been applied."""
        return self.tracker.settled

    @property
    def candidate(self) -> Optional[Candidate]:
        """This node's candidacy (None: not a candidate)."""
        return self.tracker.candidate

    # --- set-up ---------------------------------------------------------

    def on_attach(self, node: Node) -> None:
        """Open the store, bind the broker's ROUTER, attach the parts, advertise."""
        self.address = select_interface(node.config.interface).address
        self.context = shared_context()
        self.curve: Optional[Curve] = node.curve
        if self.admin_keys_dir is not None:
            if self.curve is None:
                raise ValueError("admin_keys needs a node with keys (key_file): without CURVE "
                                 "a caller's key cannot be known")
            self.admin_keys = shared_allowlist(self.admin_keys_dir)
        if self.grants_file is not None:
            if self.curve is None:
                raise ValueError("grants need a node with keys (key_file): without CURVE "
                                 "a caller's key cannot be known")
            self.grants = Grants(self.grants_file)
        self.store = JobStore(store_path(self.data_dir, self.store_name or node.name),
                              self.retention)
        try:
            if self.mode != "never":
                inproc = f"inproc://peermesh-nfp-broker-{node.uuid.hex}-{id(self):x}"
                mailbox = node.transport.bind_mailbox(self.address, MAX_MESSAGE, inproc=inproc,
                                                      heartbeat=False)
                endpoint = mailbox.endpoint
                self._own_key(endpoint)
                self.broker = Broker(mailbox, inproc, name=node.name, node=node.uuid.hex,
                                     store=self.store, context=self.context,
                                     keepalive=self.keepalive, multiplier=self.multiplier,
                                     queue_timeout=self.queue_timeout,
                                     request_timeout=self.request_timeout,
                                     admin_token=self.admin_token,
                                     admin_keys=self.admin_keys, grants=self.grants,
                                     keyed=self.curve is not None,
                                     allowlist=self.curve.allowlist if self.curve else None,
                                     inventory_dir=self.inventory_dir,
                                     files_root=self.files_root, on_shutdown=self._shutdown)
                self.broker.attach(node)
                self._endpoints[node.uuid] = endpoint
                advertise(node, {NFP_BROKER_HEADER: json.dumps(
                    {"mode": self.mode, "priority": self.priority, "endpoint": endpoint},
                    separators=(",", ":"))})
            self.client = Client(self.store, name=node.name, node=node.uuid.hex,
                                 context=self.context, request_timeout=self.request_timeout,
                                 queue_timeout=self.queue_timeout, curve=self.curve,
                                 keys=self.keys)
            self.client.attach(node)
            self.tracker.attach(node)
            if self._setup is not None:
                self._setup(self)
        except BaseException:
            self.store.close()   # the sockets go with the context or the failed hub
            raise

    def add_worker(self, service: str, name: Optional[str] = None,
                   tasks: Optional[Tasks | Mapping[str, TaskFunction]] = None, *,
                   max_clients: int = MAX_CLIENTS, max_stored: int = MAX_STORED,
                   max_stored_per_client: int = MAX_STORED_PER_CLIENT) -> Worker:
        """Add a worker of ``service`` (attached, before ``node.start()``); name defaults to
        the node's. ``max_clients``, ``max_stored``, ``max_stored_per_client``: the worker's
        bounds (see ``Worker``)."""
        node = self.node
        if node is None or node.running or self.lifecycle is Lifecycle.STOPPED:
            raise NodeStateError("add workers after attaching NfpNode and before "
                                 "node.start(): they go in HELLO headers")
        name = name or (node.name if not self.workers else f"{node.name}.{service}")
        if any(w.name == name for w in self.workers):
            raise ValueError(f"this node already has a worker named {name!r}")
        worker = Worker(service, name, tasks or Tasks(), self.store, address=self.address,
                        context=self.context, keepalive=self.keepalive,
                        multiplier=self.multiplier, admin_token=self.admin_token,
                        admin_keys=self.admin_keys, grants=self.grants,
                        max_stored_per_client=max_stored_per_client,
                        node_name=node.name, on_shutdown=self._stop_worker,
                        max_clients=max_clients, max_stored=max_stored,
                        curve=self.curve, keys=self.keys)
        self._own_key(worker.endpoint)
        worker.attach(node)
        self.workers.append(worker)
        advertise(node, {WORKER_HEADER: advertised(self.workers)})
        return worker

    def _own_key(self, endpoint: str) -> None:
        if self.curve is not None:
            self.keys[endpoint] = self.curve.public.decode()

    def add_listener(self, callback: Callable[[BrokerChanged[NfpCandidate]], None]) -> None:
        """Call ``callback(BrokerChanged)`` when the broker changes (on the hub)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[BrokerChanged[NfpCandidate]], None]) -> None:
        """Stop calling ``callback``."""
        self._listeners.remove(callback)

    # --- life cycle -----------------------------------------------------

    def on_start(self) -> None:
        """Start client, workers, broker standby and the election (after ``node.start()``)."""
        self.client.start()
        for worker in self.workers:
            worker.start()
            self.client.add_worker(worker.name, worker.service, worker.endpoint)
        if self.broker is not None:
            self.broker.start()
        self.tracker.start()
        self._greenlets = [gevent.spawn(self._purger)]

    def on_stop(self, timeout: float) -> None:
        """Stop everything NFP on this node (the node itself keeps running)."""
        self.tracker.stop(timeout)
        gevent.killall(self._greenlets, block=False)
        for worker in self.workers:
            worker.stop(timeout)
        if self.broker is not None:
            self.broker.stop(timeout)
        self.client.stop(timeout)
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
        if self.node is not None:
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
        key = headers.get(PUBLIC_KEY_HEADER)  # authenticated by the node, with keys
        endpoint = parse_broker_endpoint(headers.get(NFP_BROKER_HEADER))
        if endpoint is not None and not self.peer_networks.admit(
                endpoint, self.node, f"NFP broker endpoint of {name}"):
            endpoint = None
        found = [(service, worker_name, worker_endpoint) for service, worker_name, worker_endpoint
                 in parse_workers(headers.get(WORKER_HEADER)) if self.peer_networks.admit(
                     worker_endpoint, self.node, f"endpoint of NFP worker {worker_name!r}")]
        if key is not None and self.curve is not None:
            known = [e for e in [endpoint] + [e for _, _, e in found] if e is not None]
            self.keys.update((e, key) for e in known)
            self._keyed[uuid] = known
        if endpoint is None:
            self._endpoints.pop(uuid, None)
        else:
            self._endpoints[uuid] = endpoint
        own = {w.name for w in self.workers}
        names = []
        for service, worker_name, worker_endpoint in found:
            if worker_name in own:
                log.warning("peer %s advertises worker %r, a name this node uses; ignored",
                            name, worker_name)
                continue
            self.client.add_worker(worker_name, service, worker_endpoint)
            self._worker_owner[worker_name] = uuid
            names.append(worker_name)
        if names:
            self._peer_workers[uuid] = names

    def _peer_left(self, uuid: UUID) -> None:
        self._endpoints.pop(uuid, None)
        for endpoint in self._keyed.pop(uuid, ()):
            self.keys.pop(endpoint, None)
        self._forget_workers(uuid, "its node left the mesh")

    def _on_broker_change(self, change: Change) -> None:
        """The election's decision changed: start/stop the broker, move workers and client."""
        elected = change.new
        endpoint = self._endpoints.get(elected.uuid) if elected is not None else None
        new = None if elected is None or endpoint is None else NfpCandidate(
            elected.uuid, elected.priority, elected.mode, elected.name, endpoint)
        if self.broker is not None:
            if change.took_over:
                self.broker.activate()
            else:
                self.broker.deactivate()
        for worker in self.workers:
            worker.connect_broker(endpoint)
        self.client.set_broker(endpoint)
        old, self._current = self._current, new
        if old == new:
            return
        tell(self._listeners, BrokerChanged(old, new, change.took_over, change.stepped_down),
             "broker listener")

    # --- introspection --------------------------------------------------

    @property
    def current_broker(self) -> Optional[NfpCandidate]:
        """The broker in use (None before the first decision or with no candidate)."""
        return self._current

    @property
    def is_broker(self) -> bool:
        """True while this node is the active broker."""
        return self.broker is not None and self.broker.active

    def info(self) -> dict[str, Any]:
        """A summary: node, workers, broker, candidates."""
        assert self.node is not None
        broker = self.current_broker
        return {"node": self.node.name, "uuid": self.node.uuid.hex, "store": str(self.store.path),
                "workers": [w.info() for w in self.workers],
                "broker": {"name": broker.name, "endpoint": broker.endpoint,
                           "uuid": broker.uuid.hex} if broker else None,
                "is_broker": self.is_broker,
                "candidates": [{"name": c.name, "uuid": c.uuid.hex, "priority": c.priority,
                                "mode": c.mode} for c in self.election.candidates()]}
