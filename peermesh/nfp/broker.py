"""The NFP broker: one ROUTER for clients and workers, heartbeats, the broker services.

How it works
------------
Every broker candidate binds its ROUTER when it is set up (the endpoint goes
in its HELLO header) and reads it from then on. While the node is not the
elected broker it is on **standby**: a worker's OPEN is answered with
DISCONNECT ("not the broker") and a client's request with RESPONSE 500, so
peers with a stale view move on. Once elected it is **active**:

* **Workers** (header NFPW01): OPEN (body: name, service, node) is answered
  with OPEN (body: ``keepalive`` seconds and ``multiplier``), then READY
  registers the worker with its service; a second READY, or READY before
  OPEN, is answered with DISCONNECT, as the spec asks of unexpected commands.
  Any command counts as a sign of life. The broker sends KEEPALIVE to every
  worker it has sent nothing to for ``keepalive`` seconds and drops a worker
  that has been silent for ``keepalive * multiplier`` (defaults 1 s and 3):
  its unanswered requests fail over (see ``Dispatcher``).
* **Clients** (header NFPC01): OPEN is answered with OPEN; POST, GET and
  DELETE go through the ``Dispatcher`` and are answered with one RESPONSE
  each (NFPB01). EVENTs from workers are relayed to the client that posted
  the job.
* **Relaying** costs no re-encoding: a request's JSON body goes on to the
  workers as the client wrote it (only its ``"rid"`` swapped), and a
  worker's EVENT goes on to the client frame for frame, only its header
  changed to NFPB01.
* **Services**: ``mmi.service.broker``, ``sid.service.broker`` and
  ``fss.service.broker`` are workers inside this process on ``inproc``.

Stepping down (another broker won) sends DISCONNECT to every worker and
answers open client requests with 500 "broker stepped down", so both move
to the new broker at once instead of waiting for a timeout.

Malformed frames are dropped (counted in ``show_broker``) without touching
other traffic; a peer that sends them is not trusted with anything else
because nothing it sends is ever decoded into a command.

The protocol itself is ``BrokerCore`` (``peermesh.nfp.brokercore``), a
sans-io core; this overlay is its shell: the ROUTER (under the connection
policy) is served by the one driver (``peermesh.io.driver.Driver``) on the
node's transport clock, and the broker services and MMI live here.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Optional

import zmq

from ..counters import Counters
from ..io.connections import GuardedListener
from ..io.driver import Driver
from ..io.transport import Mailbox
from ..io.zap import Allowlist
from ..overlay import Overlay
from .brokercore import NOT_BROKER, STEPPED_DOWN, BrokerCore
from .dispatch import Dispatcher
from .grants import Grants
from .services import authorise, fss_tasks, later, sid_tasks
from .store import JobStore
from .worker import Tasks, TaskFunction, Worker

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["Broker", "NOT_BROKER"]

log = logging.getLogger(__name__)


class _ServiceWorker(Worker):
    """A broker service (MMI, SID, FSS): a worker inside the broker, on ``inproc``."""

    roles = ()


class Broker(Overlay):
    """The broker role of one candidate node, an overlay of its node (standby until
    ``activate``; the node's ``BrokerTracker`` says when). ``mailbox``: its ROUTER, from
    the node's transport (``bind_mailbox``), also bound at ``inproc`` for the broker
    services."""

    roles = ("nfp-broker",)

    def __init__(self, mailbox: Mailbox, inproc: str, *, name: str, node: str,
                 store: JobStore, context: zmq.Context, keepalive: float = 1.0,
                 multiplier: int = 3, queue_timeout: float = 30.0, request_timeout: float = 5.0,
                 admin_token: Optional[str] = None, admin_keys: Optional[Allowlist] = None,
                 grants: Optional[Grants] = None, keyed: bool = False,
                 inventory_dir: Optional[os.PathLike[str] | str] = None,
                 files_root: Optional[os.PathLike[str] | str] = None,
                 on_shutdown: Optional[Callable[[], None]] = None,
                 allowlist: Optional[Allowlist] = None) -> None:
        super().__init__()
        #: where clients and workers reach it (the mailbox's endpoint), and the services
        self.endpoint: str = mailbox.endpoint
        self.inproc = inproc
        self.name = name
        self.node_id = node   # the node's UUID in hex, for the wire
        self.store = store
        #: the protocol: peers, heartbeats, dispatch (sans-io)
        self.core = BrokerCore(name=name, node=node, keepalive=keepalive,
                               multiplier=multiplier, queue_timeout=queue_timeout,
                               request_timeout=request_timeout, keyed=keyed,
                               admin_keys=admin_keys, grants=grants, allowlist=allowlist)
        self.keepalive = self.core.keepalive
        self.multiplier = self.core.multiplier
        self.admin_token = admin_token
        #: with keys: the public keys allowed the destructive MMI calls (instead of the token)
        self.admin_keys = admin_keys
        #: with keys: the tasks and FSS files each key may use (see ``grants``)
        self.grants = grants
        #: a CURVE socket: each client's key goes with its requests (as ``caller``)
        self.keyed = keyed
        #: with keys: the node's allowlist; a client whose key leaves it is cut off
        self.allowlist = allowlist
        self.inventory_dir = inventory_dir
        self.files_root = files_root
        self.on_shutdown = on_shutdown
        self._context = context
        #: the ROUTER (``transport.bind_mailbox``, also bound at ``inproc``), guarded once
        #: started
        self._mailbox = mailbox
        self._driver: Optional[Driver] = None
        self._listener: Any = None
        self._services: list[Worker] = []

    # --- the core's state -------------------------------------------------

    @property
    def active(self) -> bool:
        """True while this broker is the elected one."""
        return self.core.active

    @property
    def dispatcher(self) -> Optional[Dispatcher]:
        """The dispatcher while active."""
        return self.core.dispatcher

    @property
    def stats(self) -> dict[str, int]:
        """Counters: dropped, requests, events, elections_won, disconnects_sent, not_owner."""
        return self.core.stats

    @property
    def limits(self) -> Counters:
        """Refusals by limit (``max_target``)."""
        return self.core.limits

    def _now(self) -> float:
        return self.node.transport.now() if self.node is not None else 0.0

    def _apply(self, outputs: list[Any]) -> None:
        if self._driver is not None:
            self._driver.apply(outputs)

    # --- life cycle -----------------------------------------------------

    def on_attach(self, node: "Node") -> None:
        """Create the broker services (they serve while this broker is active)."""
        specs = [("mmi.service.broker", self.mmi_tasks()),
                 ("sid.service.broker", sid_tasks(self.inventory_dir)),
                 ("fss.service.broker", fss_tasks(self.files_root, self.grants))]
        for service, tasks in specs:
            short = service.split(".", 1)[0]
            worker = _ServiceWorker(service, f"{self.name}.{short}", Tasks(tasks), self.store,
                                    context=self._context, keepalive=self.keepalive,
                                    multiplier=self.multiplier, admin_token=self.admin_token,
                                    admin_keys=self.admin_keys, grants=self.grants,
                                    node_name=self.name, internal=True)
            worker.attach(node)
            self._services.append(worker)

    def on_start(self) -> None:
        """Start reading the ROUTER (standby) and the services (idle until activated)."""
        assert self.node is not None
        transport = self.node.transport
        listener = transport.guard(self._mailbox, self.limits, on_revoked=self._revoked)
        self._driver = Driver(self.core, transport, name=f"broker {self.name}")
        self._driver.listen(listener, "User-Id" if self.keyed else None)
        self._listener = listener
        for service in self._services:
            service.start()

    def on_stop(self, timeout: float) -> None:
        """Deactivate, stop the services and close the ROUTER."""
        self.deactivate("broker closing")
        for service in self._services:
            service.stop(timeout)
        listener, self._listener = self._listener, None
        if isinstance(listener, GuardedListener):
            listener.stop()   # (its monitor before the socket)
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.close()
        self._mailbox.close(0)

    def activate(self) -> None:
        """Become the broker: fresh state, services connected, heartbeats on."""
        if self.active or not self.running:
            return
        self._apply(self.core.activate(self._now()))
        for service in self._services:
            service.connect_broker(self.inproc)
        log.info("broker %s active at %s", self.name, self.endpoint)

    def deactivate(self, reason: str = STEPPED_DOWN) -> None:
        """Stop being the broker: workers get DISCONNECT, open requests get 500."""
        if not self.active:
            return
        for service in self._services:
            service.connect_broker(None)
        self._apply(self.core.deactivate(reason))
        log.info("broker %s inactive: %s", self.name, reason)

    def restart(self) -> None:
        """MMI restart: drop every registration and start afresh."""
        self.deactivate("broker restarting")
        self.activate()

    def shutdown(self) -> None:
        """MMI shutdown: stop being broker and let the owner stop the node."""
        if self.on_shutdown is not None:
            self.on_shutdown()
        else:
            self.deactivate("broker shut down")

    def disconnect_workers(self) -> None:
        """MMI disconnect: every worker gets DISCONNECT (they register again)."""
        self._apply(self.core.disconnect_workers())

    def _revoked(self, keys: frozenset[str]) -> None:
        self._apply(self.core.revoked(keys))

    # --- management -----------------------------------------------------

    def _authorise(self, job: Any, token: Any, what: str) -> None:
        admin = self.admin_keys
        authorise(self.admin_token, token, what, admin.keys if admin is not None else None,
                  getattr(job, "caller", None))

    def mmi_tasks(self) -> dict[str, TaskFunction]:
        """The ``mmi.service.broker`` tasks: show_broker, show_workers, show_clients,
        show_services; and disconnect, restart and shutdown for callers with the token."""

        def show_broker(job: Any) -> dict[str, Any]:
            return self.info()

        def show_workers(job: Any, service: Optional[str] = None) -> list[dict[str, Any]]:
            return [w for w in self.workers_info() if service is None or w["service"] == service]

        def show_clients(job: Any) -> list[dict[str, Any]]:
            return self.clients_info()

        def show_services(job: Any) -> dict[str, Any]:
            return self.services_info()

        def disconnect(job: Any, token: Any = None) -> str:
            self._authorise(job, token, "disconnect")
            later(self.disconnect_workers)
            return "every worker is told to disconnect and register again"

        def restart(job: Any, token: Any = None) -> str:
            self._authorise(job, token, "restart")
            later(self.restart)
            return "broker restarting"

        def shutdown(job: Any, token: Any = None) -> str:
            self._authorise(job, token, "shutdown")
            later(self.shutdown)
            return "broker shutting down"

        return {f.__name__: f for f in (show_broker, show_workers, show_clients, show_services,
                                        disconnect, restart, shutdown)}

    def info(self) -> dict[str, Any]:
        """``show_broker``."""
        info = self.core.info(self._now())
        info["endpoint"] = self.endpoint
        return info

    def workers_info(self) -> list[dict[str, Any]]:
        """``show_workers``."""
        return self.core.workers_info(self._now())

    def clients_info(self) -> list[dict[str, Any]]:
        """``show_clients``."""
        return self.core.clients_info(self._now())

    def services_info(self) -> dict[str, Any]:
        """``show_services``."""
        return self.core.services_info()
