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
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import gevent
import zmq

from ..errors import ProtocolError
from ..counters import Counters
from ..io.zap import Allowlist
from ..overlay import Overlay
from ..wire import nfp
from ..wire.nfp import Status
from .dispatch import Dispatcher, Reply, without_rid
from .grants import Grants, may_use_job
from .services import authorise, fss_tasks, later, sid_tasks
from .store import JobStore
from .transport import CorkedSocket, guarded
from .worker import Tasks, TaskFunction, Worker

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["Broker", "NOT_BROKER"]

log = logging.getLogger(__name__)

NOT_BROKER = "not the broker"
STEPPED_DOWN = "broker stepped down"
_MAX_OWNERS = 100_000
_CLIENT_IDLE = 600.0


@dataclass(eq=False, slots=True)
class _Peer:
    identity: bytes
    kind: str                        # worker, client
    name: str = ""
    service: str = ""
    node: str = ""
    ready: bool = False
    since: float = 0.0
    last_recv: float = 0.0
    last_sent: float = 0.0
    requests: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class _ServiceWorker(Worker):
    """A broker service (MMI, SID, FSS): a worker inside the broker, on ``inproc``."""

    roles = ()


class Broker(Overlay):
    """The broker role of one candidate node, an overlay of its node (standby until
    ``activate``; the node's ``BrokerTracker`` says when)."""

    roles = ("nfp-broker",)

    def __init__(self, router: zmq.Socket, endpoint: str, *, name: str, node: str,
                 store: JobStore, context: zmq.Context, keepalive: float = 1.0,
                 multiplier: int = 3, queue_timeout: float = 30.0, request_timeout: float = 5.0,
                 admin_token: Optional[str] = None, admin_keys: Optional[Allowlist] = None,
                 grants: Optional[Grants] = None, keyed: bool = False,
                 inventory_dir: Optional[os.PathLike[str] | str] = None,
                 files_root: Optional[os.PathLike[str] | str] = None,
                 on_shutdown: Optional[Callable[[], None]] = None,
                 allowlist: Optional[Allowlist] = None) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.name = name
        self.node_id = node   # the node's UUID in hex, for the wire
        self.store = store
        self.keepalive = float(keepalive)
        self.multiplier = int(multiplier)
        self.queue_timeout = float(queue_timeout)
        self.request_timeout = float(request_timeout)
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
        self._router = router
        self.inproc = f"inproc://peermesh-nfp-broker-{node}-{id(self):x}"
        router.bind(self.inproc)
        self._channel: Optional[CorkedSocket] = None
        self.active = False
        self.dispatcher: Optional[Dispatcher] = None
        self._peers: dict[bytes, _Peer] = {}
        self._worker_ids: dict[str, bytes] = {}
        self._owners: OrderedDict[str, bytes] = OrderedDict()
        #: with keys: the key each job was posted with (as many as ``_owners``)
        self._posters: OrderedDict[str, str] = OrderedDict()
        self._services: list[Worker] = []
        self._received: tuple[Any, list[bytes]] = (None, [])   # the command being handled
        self._greenlets: list[gevent.Greenlet] = []
        self.since = 0.0
        self.stats = {"dropped": 0, "requests": 0, "events": 0, "elections_won": 0,
                      "disconnects_sent": 0, "not_owner": 0}
        #: refusals by limit: ``max_target`` (requests whose target is over MAX_TARGET)
        self.limits = Counters(log, "NFP broker hit its limits")

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
        listener = guarded(self._router, self.endpoint, self.limits, self.allowlist,
                           self._revoked)
        self._channel = CorkedSocket(self._router, self._on_message, f"broker {self.name}",
                                     keyed=self.keyed, listener=listener)
        for service in self._services:
            service.start()

    def on_stop(self, timeout: float) -> None:
        """Deactivate, stop the services and close the ROUTER."""
        self.deactivate("broker closing")
        for service in self._services:
            service.stop(timeout)
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        else:
            self._router.close(linger=0)

    def activate(self) -> None:
        """Become the broker: fresh state, services connected, heartbeats on."""
        if self.active or not self.running:
            return
        self.active = True
        self.since = time.monotonic()
        self.stats["elections_won"] += 1
        self.dispatcher = Dispatcher(nfp.BROKER, request_timeout=self.request_timeout,
                                     queue_timeout=self.queue_timeout,
                                     on_job_event=self._relay_event, clock=time.monotonic)
        self._greenlets = [gevent.spawn(self._heartbeat), gevent.spawn(self._ticker)]
        for service in self._services:
            service.connect_broker(self.inproc)
        log.info("broker %s active at %s", self.name, self.endpoint)

    def deactivate(self, reason: str = STEPPED_DOWN) -> None:
        """Stop being the broker: workers get DISCONNECT, open requests get 500."""
        if not self.active:
            return
        self.active = False
        for service in self._services:
            service.connect_broker(None)
        gevent.killall(self._greenlets, block=False)
        self._greenlets = []
        for peer in list(self._peers.values()):
            if peer.kind == "worker":
                self._send(peer, nfp.Disconnect(nfp.BROKER, peer.service or "-",
                                                reason.encode()))
        dispatcher, self.dispatcher = self.dispatcher, None
        if dispatcher is not None:
            dispatcher.fail_all(Status.ERROR, reason)
        self._peers.clear()
        self._worker_ids.clear()
        self._owners.clear()
        self._posters.clear()
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
        for peer in list(self._peers.values()):
            if peer.kind == "worker":
                self._drop_worker(peer, "disconnected by MMI", tell=True)

    # --- sending --------------------------------------------------------

    def _send(self, peer: _Peer, msg: nfp.Message) -> bool:
        channel = self._channel
        if channel is None:
            return False
        peer.last_sent = time.monotonic()
        return channel.send([peer.identity, *nfp.encode(msg)])

    def _send_to(self, identity: bytes, msg: nfp.Message) -> None:
        if self._channel is not None:
            self._channel.send([identity, *nfp.encode(msg)])

    # --- receiving ------------------------------------------------------

    def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            self.stats["dropped"] += 1
            return
        identity = frames[0]
        command = frames[1:]
        try:
            msg = nfp.decode(command)
        except ProtocolError as exc:
            self.stats["dropped"] += 1
            if isinstance(exc, nfp.TargetTooLong):
                self.limits.over("max_target", f"broker dropped a request from {identity!r}: "
                                 f"{exc.reason}")
            else:
                log.debug("broker: dropped a malformed message from %r: %s", identity,
                          exc.reason)
            return
        role = msg.role
        if role is nfp.WORKER:
            cls = type(msg)
            if cls is nfp.Response or cls is nfp.Event:
                peer = self._peers.get(identity)
                dispatcher = self.dispatcher
                if peer is not None and peer.ready and dispatcher is not None:
                    peer.last_recv = time.monotonic()
                    if cls is nfp.Response:
                        dispatcher.on_response(peer.name, msg)   # type: ignore[arg-type]
                    else:
                        self._received = (msg, command)
                        dispatcher.on_event(peer.name, msg)      # type: ignore[arg-type]
                    return
            self._on_worker(identity, msg)
        elif role is nfp.CLIENT:
            self._on_client(identity, msg)
        else:
            self.stats["dropped"] += 1   # another broker talking to us: not in the protocol

    def _on_worker(self, identity: bytes, msg: nfp.Message) -> None:
        peer = self._peers.get(identity)
        now = time.monotonic()
        if not self.active:
            if not isinstance(msg, nfp.Disconnect):
                self._send_to(identity, nfp.Disconnect(nfp.BROKER, _service(msg),
                                                       NOT_BROKER.encode()))
            return
        if isinstance(msg, nfp.Open):
            try:
                body = nfp.decode_body(msg.body)
                name = body.get("name")
                if not isinstance(name, str):
                    raise ValueError("no name")
                nfp.format_target((name,))
            except (ProtocolError, ValueError, TypeError):
                self.stats["dropped"] += 1
                self._send_to(identity, nfp.Disconnect(nfp.BROKER, "-", b"OPEN needs a name"))
                return
            if peer is not None and peer.kind == "worker" and peer.ready:
                self._drop_worker(peer, "opened again", tell=False)
            peer = _Peer(identity, "worker", str(name), str(body.get("service") or ""),
                         str(body.get("node") or ""), since=now, last_recv=now)
            self._peers[identity] = peer
            self._send(peer, nfp.Open(nfp.BROKER, nfp.encode_body(
                {"broker": self.name, "node": self.node_id, "keepalive": self.keepalive,
                 "multiplier": self.multiplier})))
            return
        if peer is None or peer.kind != "worker":
            if not isinstance(msg, nfp.Disconnect):
                self._send_to(identity, nfp.Disconnect(nfp.BROKER, _service(msg),
                                                       b"OPEN first"))
            return
        peer.last_recv = now
        if isinstance(msg, nfp.Ready):
            if peer.ready:
                self._drop_worker(peer, "sent READY twice", tell=True)
                return
            self._register(peer, msg.service)
        elif isinstance(msg, nfp.Keepalive):
            pass
        elif isinstance(msg, nfp.Disconnect):
            self._drop_worker(peer, "worker disconnected", tell=False)
        elif not peer.ready:
            self._drop_worker(peer, f"{type(msg).__name__} before READY", tell=True)
        elif isinstance(msg, nfp.Response):
            assert self.dispatcher is not None
            self.dispatcher.on_response(peer.name, msg)
        elif isinstance(msg, nfp.Event):
            assert self.dispatcher is not None
            self.dispatcher.on_event(peer.name, msg)

    def _register(self, peer: _Peer, service: str) -> None:
        assert self.dispatcher is not None
        old = self._worker_ids.get(peer.name)
        if old is not None and old != peer.identity:
            stale = self._peers.get(old)
            if stale is not None:
                self._drop_worker(stale, "replaced by a new connection of the same worker",
                                  tell=True)
        peer.ready = True
        peer.service = service
        self._worker_ids[peer.name] = peer.identity
        identity = peer.identity
        channel = self._channel
        assert channel is not None

        def send(frames: list[bytes]) -> bool:
            peer.last_sent = time.monotonic()
            return channel.send([identity, *frames])
        self.dispatcher.add_worker(peer.name, service, send, {"node": peer.node})
        log.debug("broker: worker %s ready for %s", peer.name, service)

    def _drop_worker(self, peer: _Peer, reason: str, tell: bool) -> None:
        if tell:
            self.stats["disconnects_sent"] += 1
            self._send(peer, nfp.Disconnect(nfp.BROKER, peer.service or "-", reason.encode()))
        self._peers.pop(peer.identity, None)
        if self._worker_ids.get(peer.name) == peer.identity:
            del self._worker_ids[peer.name]
            if self.dispatcher is not None:
                self.dispatcher.remove_worker(peer.name, reason)

    def _on_client(self, identity: bytes, msg: nfp.Message) -> None:
        now = time.monotonic()
        if isinstance(msg, nfp.Open):
            try:
                body = nfp.decode_body(msg.body)
            except ProtocolError:
                body = {}
            if self.active:
                self._peers[identity] = _Peer(identity, "client", str(body.get("name") or ""),
                                              node=str(body.get("node") or ""), since=now,
                                              last_recv=now)
            self._send_to(identity, nfp.Open(nfp.BROKER, nfp.encode_body(
                {"broker": self.name, "node": self.node_id, "active": self.active})))
            return
        cls = type(msg)
        if cls is not nfp.Post and cls is not nfp.Get and cls is not nfp.Delete:
            self.stats["dropped"] += 1
            return
        raw: bytes = msg.body[0]   # type: ignore[union-attr,assignment]
        try:
            body = nfp.decode_body(raw)
        except ProtocolError as exc:
            self._answer(identity, msg, None, Reply(Status.ERROR, {"error": exc.reason},
                                                    "invalid body"))
            return
        rid = body.pop("rid", None)
        if not self.active or self.dispatcher is None:
            self._answer(identity, msg, rid, Reply(Status.ERROR, {"error": NOT_BROKER},
                                                   NOT_BROKER))
            return
        peer = self._peers.get(identity)
        if peer is None or peer.kind != "client":
            peer = _Peer(identity, "client", since=now)
            self._peers[identity] = peer
        peer.last_recv = now
        peer.requests += 1
        self.stats["requests"] += 1

        def done(reply: Reply) -> None:
            self._answer(identity, msg, rid, reply)
        # the body goes on as the client wrote it, without its rid (or re-encoded if the
        # rid is not where the client puts it: last)
        relay = without_rid(raw, rid) if rid is not None else raw or b"{}"
        uuid = msg.uuid   # type: ignore[union-attr]
        if self.keyed and self._channel is not None:  # who asked, for the workers' MMI
            caller = body["caller"] = self._channel.sender_key
            relay = nfp.encode_body(body)
            if not self._may_use(uuid, caller):   # (a POST: again, of a job it knows)
                self.stats["not_owner"] += 1
                text = f"job {uuid} was posted by another key"
                done(Reply(Status.ERROR, {"uuid": uuid, "error": text}, text))
                return
            if cls is nfp.Post and uuid not in self._posters:
                _remember(self._posters, uuid, caller)
        if cls is nfp.Post:
            _remember(self._owners, uuid, identity)
            self.dispatcher.post(msg.service, msg.target, uuid, body, done,   # type: ignore
                                 raw=relay)
        elif cls is nfp.Get:
            self.dispatcher.get(msg.service, msg.target, uuid, body, done,    # type: ignore
                                raw=relay)
        else:
            self.dispatcher.delete(msg.service, msg.target, uuid, body, done,  # type: ignore
                                   raw=relay)

    def _revoked(self, keys: frozenset[str]) -> None:
        """The allowlist changed: POSTs still queued of keys it no longer holds are withdrawn
        (the workers fail those they hold)."""
        allowed = self.allowlist.keys if self.allowlist is not None else frozenset()
        if self.dispatcher is not None:
            for uuid in [u for u, key in self._posters.items()
                         if key in keys or key.encode() not in allowed]:
                self.dispatcher.withdraw(uuid)

    def _may_use(self, uuid: str, caller: Optional[str]) -> bool:
        """Whether key ``caller`` may GET or DELETE job ``uuid`` as far as this broker knows
        (the workers check it again against what they stored)."""
        admin = self.admin_keys
        return may_use_job(self._posters.get(uuid), caller,
                           admin.keys if admin is not None else None, self.grants)

    def _answer(self, identity: bytes, msg: Any, rid: Any, reply: Reply) -> None:
        frame = _answer_body(reply, rid)
        if len(frame) > nfp.MAX_BODY:   # several workers' results together
            text = (f"the answer is {len(frame):,} bytes, more than an NFP message carries: "
                    f"ask its workers one at a time")
            reply = Reply(Status.ERROR, {"uuid": msg.uuid, "error": text}, text)
            frame = _answer_body(reply, rid)
        if self._channel is not None:
            self._channel.send([identity, *nfp.response_frames(
                nfp.BROKER, msg.service, msg.uuid, reply.status, (frame,), reply.text)])

    def _relay_event(self, uuid: str, worker: str, body: dict[str, Any],
                     msg: nfp.Event) -> None:
        owner = self._owners.get(uuid)
        if owner is None:
            return
        channel = self._channel
        if channel is None:
            return
        self.stats["events"] += 1
        received, command = self._received
        if received is msg and body.get("worker") == worker:
            channel.send([owner, *nfp.reheaded(command, nfp.BROKER)])  # as the worker wrote it
            return
        channel.send([owner, *nfp.event_frames(nfp.BROKER, msg.service, uuid, msg.status,
                                               (nfp.encode_body({**body, "worker": worker}),),
                                               msg.text)])

    # --- timers ---------------------------------------------------------

    def _heartbeat(self) -> None:
        while True:
            gevent.sleep(self.keepalive / 2)
            now = time.monotonic()
            liveness = self.keepalive * self.multiplier
            for peer in list(self._peers.values()):
                if peer.kind == "worker":
                    if now - peer.last_recv > liveness:
                        log.info("broker: worker %s silent for %.1fs; dropped", peer.name,
                                 now - peer.last_recv)
                        self._drop_worker(peer, f"no keepalive for {liveness:g}s", tell=True)
                    elif peer.ready and now - peer.last_sent >= self.keepalive:
                        self._send(peer, nfp.Keepalive(nfp.BROKER, peer.service))
                elif now - peer.last_recv > _CLIENT_IDLE:
                    del self._peers[peer.identity]

    def _ticker(self) -> None:
        while True:
            gevent.sleep(0.05)
            if self.dispatcher is not None:
                self.dispatcher.tick(time.monotonic())

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
        d = self.dispatcher
        return {"name": self.name, "node": self.node_id, "endpoint": self.endpoint,
                "active": self.active,
                "uptime": round(time.monotonic() - self.since, 3) if self.active else None,
                "keepalive": self.keepalive, "multiplier": self.multiplier,
                "queue_timeout": self.queue_timeout,
                "workers": sum(1 for p in self._peers.values() if p.kind == "worker" and p.ready),
                "clients": sum(1 for p in self._peers.values() if p.kind == "client"),
                "services": sorted(d.services) if d else [],
                "queued": d.queued() if d else {}, "inflight": len(d.inflight()) if d else 0,
                "stats": {**self.stats, **(d.stats if d else {})}}

    def workers_info(self) -> list[dict[str, Any]]:
        """``show_workers``."""
        now = time.monotonic()
        d = self.dispatcher
        out = []
        for peer in self._peers.values():
            if peer.kind != "worker":
                continue
            link = d.workers.get(peer.name) if d else None
            out.append({"name": peer.name, "service": peer.service, "node": peer.node,
                        "ready": peer.ready, "load": link.load if link else None,
                        "connected_for": round(now - peer.since, 3),
                        "last_seen_ago": round(now - peer.last_recv, 3),
                        "inflight": len(link.jobs) if link else 0})
        return sorted(out, key=lambda w: (w["service"], w["name"]))

    def clients_info(self) -> list[dict[str, Any]]:
        """``show_clients``."""
        now = time.monotonic()
        return [{"name": p.name, "node": p.node, "requests": p.requests,
                 "connected_for": round(now - p.since, 3),
                 "last_seen_ago": round(now - p.last_recv, 3)}
                for p in self._peers.values() if p.kind == "client"]

    def services_info(self) -> dict[str, Any]:
        """``show_services``."""
        d = self.dispatcher
        if d is None:
            return {}
        queued = d.queued()
        names = set(d.services) | set(queued)
        return {s: {"workers": sorted(d.services.get(s, {})), "queued": queued.get(s, 0)}
                for s in sorted(names)}


def _answer_body(reply: Reply, rid: Any) -> bytes:
    """A reply's body frame, with the client's rid when it gave one."""
    return nfp.encode_body(reply.body if rid is None else {**reply.body, "rid": rid})


def _remember(table: OrderedDict[str, Any], uuid: str, value: Any) -> None:
    """``table[uuid] = value``, forgetting the oldest past ``_MAX_OWNERS``."""
    table[uuid] = value
    if len(table) > _MAX_OWNERS:
        table.popitem(last=False)


def _service(msg: nfp.Message) -> str:
    return getattr(msg, "service", None) or "-"
