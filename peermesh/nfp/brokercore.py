"""The NFP broker's conversations as a sans-io core: workers, clients, heartbeats, dispatch.

How it works
------------
``BrokerCore`` is a core of ``peermesh.core``: its driver feeds it every
message of the broker's ROUTER as ``receive(link, frames, now)`` (``link``
the sender's routing identity, or ``(identity, key)`` on a CURVE mailbox read
with the ``User-Id`` property) and calls ``handle_timer(now)`` at
``next_deadline()``; what it returns is ``Send(identity, frames)``. It reads
no clock and opens no socket (``Broker``, the overlay, is the shell).

* **Standby** (not ``active``): a worker's OPEN is answered with DISCONNECT
  ("not the broker") and a client's request with RESPONSE 500.
* **Workers** (NFPW01): OPEN is answered with OPEN (``keepalive``,
  ``multiplier``), READY registers the worker with the ``Dispatcher``; a
  second READY, or a command before READY, is answered with DISCONNECT.
  Every ``keepalive / 2`` seconds the heartbeat sends KEEPALIVE to every
  worker it has sent nothing to for ``keepalive`` seconds and drops a worker
  silent for ``keepalive * multiplier`` (its jobs fail over).
* **Clients** (NFPC01): OPEN is answered with OPEN; POST, GET and DELETE go
  through the dispatcher and get one RESPONSE each; EVENTs of a job are
  relayed to the client that posted it (frame for frame, header changed).

Bounds: the jobs whose poster is remembered (for EVENT relay and, with keys,
ownership) are at most ``_MAX_OWNERS``; a client silent for ``_CLIENT_IDLE``
seconds is forgotten; workers are bounded by the ROUTER's connection policy.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Hashable, Optional

from ..core import Output, Outputs, Send
from ..counters import Counters
from ..errors import ProtocolError
from ..io.zap import Allowlist
from ..wire import nfp
from ..wire.nfp import Status
from .dispatch import Dispatcher, Reply, without_rid
from .grants import Grants, may_use_job

__all__ = ["BrokerCore", "NOT_BROKER", "STEPPED_DOWN"]

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


class BrokerCore(Outputs):
    """The broker's protocol state (see the module docstring)."""

    def __init__(self, *, name: str, node: str, keepalive: float = 1.0, multiplier: int = 3,
                 queue_timeout: float = 30.0, request_timeout: float = 5.0,
                 keyed: bool = False, admin_keys: Optional[Allowlist] = None,
                 grants: Optional[Grants] = None, allowlist: Optional[Allowlist] = None) -> None:
        super().__init__()
        self.name = name
        self.node_id = node   # the node's UUID in hex, for the wire
        self.keepalive = float(keepalive)
        self.multiplier = int(multiplier)
        self.queue_timeout = float(queue_timeout)
        self.request_timeout = float(request_timeout)
        #: a CURVE mailbox: each client's key goes with its requests (as ``caller``)
        self.keyed = keyed
        self.admin_keys = admin_keys
        self.grants = grants
        self.allowlist = allowlist
        self.active = False
        self.dispatcher: Optional[Dispatcher] = None
        self._peers: dict[bytes, _Peer] = {}
        self._worker_ids: dict[str, bytes] = {}
        self._owners: OrderedDict[str, bytes] = OrderedDict()
        #: with keys: the key each job was posted with (as many as ``_owners``)
        self._posters: OrderedDict[str, str] = OrderedDict()
        self._received: tuple[Any, list[bytes]] = (None, [])   # the command being handled
        self._caller: Optional[str] = None                    # its sender's key (keyed)
        self._now = 0.0
        self._beat: Optional[float] = None                    # the next heartbeat
        self.since = 0.0
        self.stats = {"dropped": 0, "requests": 0, "events": 0, "elections_won": 0,
                      "disconnects_sent": 0, "not_owner": 0}
        #: refusals by limit: ``max_target`` (requests whose target is over MAX_TARGET)
        self.limits = Counters(log, "NFP broker hit its limits")

    # --- the core contract ----------------------------------------------

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """One message on the ROUTER from ``link`` (identity, or (identity, key))."""
        self._now = now
        if type(link) is tuple:
            identity, self._caller = link
        else:
            identity, self._caller = link, None
        self._on_message(identity, frames)   # type: ignore[arg-type]
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        """Heartbeats (when due) and the dispatcher's deadlines."""
        self._now = now
        if self._beat is not None and now >= self._beat:
            self._beat = now + self.keepalive / 2
            self._heartbeat(now)
        if self.dispatcher is not None:
            self.dispatcher.tick(now)
        return self.take()

    def next_deadline(self) -> Optional[float]:
        """The next heartbeat or dispatcher deadline (None while on standby)."""
        deadline = self.dispatcher.next_deadline() if self.dispatcher is not None else None
        beat = self._beat
        if beat is None or (deadline is not None and deadline < beat):
            return deadline
        return beat

    def take(self) -> list[Output]:
        """The outputs since the last call; a worker sent to counts as sent to now."""
        out = super().take()
        peers, now = self._peers, self._now
        for output in out:
            if type(output) is Send:
                peer = peers.get(output.link)   # type: ignore[call-overload]
                if peer is not None:
                    peer.last_sent = now
        return out

    def _clock(self) -> float:
        return self._now

    # --- roles ----------------------------------------------------------

    def activate(self, now: float) -> list[Output]:
        """Become the broker: fresh state, heartbeats on."""
        if not self.active:
            self._now = self.since = now
            self.active = True
            self.stats["elections_won"] += 1
            self.dispatcher = Dispatcher(nfp.BROKER, request_timeout=self.request_timeout,
                                         queue_timeout=self.queue_timeout,
                                         on_job_event=self._relay_event, clock=self._clock,
                                         outputs=self)
            self._beat = now + self.keepalive / 2
        return self.take()

    def deactivate(self, reason: str = STEPPED_DOWN) -> list[Output]:
        """Stop being the broker: workers get DISCONNECT, open requests get 500."""
        if self.active:
            self.active = False
            self._beat = None
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
        return self.take()

    def disconnect_workers(self) -> list[Output]:
        """Every worker gets DISCONNECT (they register again)."""
        for peer in list(self._peers.values()):
            if peer.kind == "worker":
                self._drop_worker(peer, "disconnected by MMI", tell=True)
        return self.take()

    def revoked(self, keys: frozenset[str]) -> list[Output]:
        """The allowlist changed: POSTs still queued of keys it no longer holds are withdrawn
        (the workers fail those they hold)."""
        allowed = self.allowlist.keys if self.allowlist is not None else frozenset()
        if self.dispatcher is not None:
            for uuid in [u for u, key in self._posters.items()
                         if key in keys or key.encode() not in allowed]:
                self.dispatcher.withdraw(uuid)
        return self.take()

    # --- sending --------------------------------------------------------

    def _send(self, peer: _Peer, msg: nfp.Message) -> None:
        peer.last_sent = self._now
        self._out(Send(peer.identity, nfp.encode(msg)))

    def _send_to(self, identity: bytes, msg: nfp.Message) -> None:
        self._out(Send(identity, nfp.encode(msg)))

    # --- receiving ------------------------------------------------------

    def _on_message(self, identity: bytes, command: list[bytes]) -> None:
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
            if cls is nfp.Response or cls is nfp.EventCommand:
                peer = self._peers.get(identity)
                dispatcher = self.dispatcher
                if peer is not None and peer.ready and dispatcher is not None:
                    peer.last_recv = self._now
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
        now = self._now
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
            pass  # its whole effect is ``last_recv`` above
        elif isinstance(msg, nfp.Disconnect):
            self._drop_worker(peer, "worker disconnected", tell=False)
        elif not peer.ready:
            self._drop_worker(peer, f"{type(msg).__name__} before READY", tell=True)
        elif isinstance(msg, nfp.Response):
            assert self.dispatcher is not None
            self.dispatcher.on_response(peer.name, msg)
        elif isinstance(msg, nfp.EventCommand):
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
        self.dispatcher.add_worker(peer.name, service, info={"node": peer.node},
                                   link=peer.identity)
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
        now = self._now
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
        if self.keyed:  # who asked, for the workers' MMI
            caller = body["caller"] = self._caller
            relay = nfp.encode_body(body)
            if not self._may_use(uuid, caller):   # (a POST: again, of a job it knows)
                self.stats["not_owner"] += 1
                text = f"job {uuid} was posted by another key"
                done(Reply(Status.ERROR, {"uuid": uuid, "error": text}, text))
                return
            if cls is nfp.Post and uuid not in self._posters and caller is not None:
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
        self._out(Send(identity, nfp.response_frames(
            nfp.BROKER, msg.service, msg.uuid, reply.status, (frame,), reply.text)))

    def _relay_event(self, uuid: str, worker: str, body: dict[str, Any],
                     msg: nfp.EventCommand) -> None:
        owner = self._owners.get(uuid)
        if owner is None:
            return
        self.stats["events"] += 1
        received, command = self._received
        if received is msg and body.get("worker") == worker:
            self._out(Send(owner, nfp.reheaded(command, nfp.BROKER)))  # as the worker wrote it
            return
        self._out(Send(owner, nfp.event_frames(nfp.BROKER, msg.service, uuid, msg.status,
                                               (nfp.encode_body({**body, "worker": worker}),),
                                               msg.text)))

    # --- time -----------------------------------------------------------

    def _heartbeat(self, now: float) -> None:
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

    # --- introspection --------------------------------------------------

    def info(self, now: float) -> dict[str, Any]:
        """``show_broker`` (without the endpoint, which the shell knows)."""
        d = self.dispatcher
        return {"name": self.name, "node": self.node_id,
                "active": self.active,
                "uptime": round(now - self.since, 3) if self.active else None,
                "keepalive": self.keepalive, "multiplier": self.multiplier,
                "queue_timeout": self.queue_timeout,
                "workers": sum(1 for p in self._peers.values() if p.kind == "worker" and p.ready),
                "clients": sum(1 for p in self._peers.values() if p.kind == "client"),
                "services": sorted(d.services) if d else [],
                "queued": d.queued() if d else {}, "inflight": len(d.inflight()) if d else 0,
                "stats": {**self.stats, **(d.stats if d else {})}}

    def workers_info(self, now: float) -> list[dict[str, Any]]:
        """``show_workers``."""
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

    def clients_info(self, now: float) -> list[dict[str, Any]]:
        """``show_clients``."""
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
