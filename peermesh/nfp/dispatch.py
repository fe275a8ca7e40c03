"""Dispatching job requests to workers: targeting, fan-out, queueing, re-dispatch.

How it works
------------
A ``Dispatcher`` holds the workers it can reach (name, service, a ``send``
function for frames) and turns one request - POST, GET or DELETE of a job,
with a target ``all``, ``any`` or worker names - into one NFP command per
targeted worker, then folds the workers' RESPONSEs into one ``Reply``. The
broker runs one (its workers are DEALERs on its ROUTER, its requesters are
clients); a client without a broker runs one too (its workers are the ones
the mesh advertises, reached directly). The dispatcher does no I/O of its
own and reads no clock (``clock`` is the driver's): it is a core of
``peermesh.core``. The owner feeds it ``receive(worker, frames, now)`` (a
worker's RESPONSE or EVENT; or ``on_response`` / ``on_event`` with the
decoded message), ``add_worker`` / ``remove_worker`` and
``handle_timer(now)`` at ``next_deadline()``. A worker added without a
``send`` function is sent to through ``Send(link, frames)`` outputs, which
``receive``, ``handle_timer`` and ``take`` return.

* **Targeting.** ``all``: every worker of the service; ``any``: the one with
  the lowest load (its last reported queue length, plus what was sent to it
  since), least recently used on ties; names: those workers of the service
  (names not present are reported in the reply).
* **Correlation.** NFP frames carry no request id, so the JSON body of every
  request the dispatcher sends carries ``"rid"``; workers echo it. A broker
  passes on the client's body as received, only its ``"rid"`` swapped
  (``without_rid`` / ``with_rid`` work on the JSON text, no re-encoding).
* **Queueing.** A POST whose target matches no worker yet is held until a
  matching worker arrives or ``queue_timeout`` passes (reply 408).
* **Jobs in flight.** Every job a worker accepted (202) is remembered until
  that worker reports it finished (an EVENT with a final ``state``, or the
  202 itself when the job finished before it left: the reply then lists
  those workers' final bodies under ``"finished"``). If the
  worker goes away first (declared dead: no keepalive, DISCONNECT, left the
  mesh):

  - ``any``: the job is posted to another worker of the service (workers are
    idempotent, per the spec) and the requester is told through an EVENT
    (``state: "redispatched"``); with no other worker it is queued like a new
    POST and reported ``lost`` if none comes in time.
  - ``all`` and named workers: no other worker can stand in for a named one.
    The requester gets an EVENT ``state: "orphaned"``, ``status: 408`` with
    the reason, and a GET of the job reports that worker 408 with the same
    text while it is away. The job stays in the worker's store: if that
    worker comes back it runs the job again and the job's status becomes
    its result (200) as usual.
* **Retries.** A POST whose body says ``"retry": true`` (a client re-posting
  its open jobs after its broker changed) to ``any`` first asks every worker
  of the service whether it already has the job, so a job accepted before is
  not run twice; either way the job is in flight here from then on. If the
  body names the job's previous workers (``"holders"``) and none of them is
  connected yet (they are moving to this broker too), it waits for them up
  to ``request_timeout`` first, then asks the workers that are there.

Kept whole: one sans-io core (``Dispatcher``): targeting, queueing, re-dispatch and
folding of answers are decisions over the same pending and in-flight tables.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional

from ..core import Output, Outputs, Send
from ..errors import ProtocolError
from ..wire import nfp
from ..wire.nfp import Status

__all__ = ["Dispatcher", "Reply", "WORKER_MMI", "BROKER_SERVICES", "FINAL_STATES",
           "overall_get_status", "with_rid", "without_rid"]

log = logging.getLogger(__name__)

WORKER_MMI = "mmi.service.worker"
BROKER_SERVICES = frozenset(("mmi.service.broker", "sid.service.broker", "fss.service.broker"))
FINAL_STATES = frozenset(("completed", "failed", "cancelled"))
_MAX_ORPHANS = 10_000   # remembered reasons of jobs whose named worker went away


@dataclass(slots=True)
class Reply:
    """The answer to one request: a status and a JSON body."""

    status: Status
    body: dict[str, Any]
    text: str = ""


@dataclass(eq=False, slots=True)
class WorkerLink:
    """A worker as a dispatcher sees it."""

    name: str
    service: str
    send: Optional[Callable[[list[bytes]], Any]]   # None: a ``Send`` output to ``link``
    link: Hashable = None
    load: int = 0
    used: int = 0
    jobs: set[str] = field(default_factory=set)   # any-targeted jobs in flight on it
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class _Pending:
    rid: str
    kind: str                     # post, get, delete, probe
    service: str
    uuid: str
    body: dict[str, Any]
    workers: list[str]
    done: Callable[[Reply], None]
    deadline: float
    target: str
    replies: dict[str, tuple[Status, str, dict[str, Any]]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    finished: bool = False


@dataclass(eq=False, slots=True)
class _Queued:
    service: str
    target: str
    uuid: str
    body: dict[str, Any]
    done: Callable[[Reply], None]
    deadline: float
    as_target: str = ""           # the job's own target, if ``target`` only says where to
    expire: Optional[Callable[[], None]] = None   # at the deadline, instead of a 408


@dataclass(slots=True)
class _InFlight:
    service: str
    target: str
    body: dict[str, Any]
    workers: set[str]             # accepted it, not finished yet


def without_rid(raw: bytes, rid: Any) -> Optional[bytes]:
    """JSON object text ``raw`` without its last member ``"rid": rid`` (as the client
    wrote it: last, compact), or None if it is not written that way."""
    if type(rid) is str and rid.isalnum() and rid.isascii():
        tail = b'"rid":"%s"}' % rid.encode()     # (what JSON makes of it, without JSON)
    else:
        tail = b'"rid":' + nfp.encode_body(rid) + b"}"
    if not raw.endswith(tail):
        return None
    head = raw[:-len(tail)]
    if head == b"{":
        return b"{}"
    if head[-1:] != b"," or b'"rid"' in head:
        return None
    return head[:-1] + b"}"


def with_rid(raw: bytes, rid: str) -> bytes:
    """JSON object text ``raw`` (no ``"rid"`` in it) with ``"rid": rid`` (hex) added last."""
    if raw == b"{}":
        return b'{"rid":"%s"}' % rid.encode()
    return raw[:-1] + b',"rid":"%s"}' % rid.encode()


def _worker_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A worker's answer without what only the dispatcher uses ("rid", "load")."""
    return {k: v for k, v in body.items() if k != "rid" and k != "load"}


def overall_get_status(statuses: list[Status]) -> Status:
    """A GET's status over its workers: 300 if any is pending, else 200 if any has a
    result, else 400 if every worker said unknown, else 408/500."""
    if not statuses:
        return Status.REQUEST_TIMEOUT
    if Status.PENDING in statuses:
        return Status.PENDING
    if Status.OK in statuses:
        return Status.OK
    if all(s is Status.UNKNOWN for s in statuses):
        return Status.UNKNOWN
    if Status.REQUEST_TIMEOUT in statuses:
        return Status.REQUEST_TIMEOUT
    return Status.ERROR


class Dispatcher:
    """Routes POST/GET/DELETE to workers and folds their RESPONSEs into one ``Reply``."""

    def __init__(self, role: nfp.Role, *, request_timeout: float = 5.0,
                 queue_timeout: float = 30.0,
                 on_job_event: Optional[Callable[[str, str, dict[str, Any], nfp.EventCommand],
                                                 None]] = None,
                 clock: Callable[[], float], outputs: Optional[Outputs] = None) -> None:
        self.role = role
        #: where ``Send`` outputs collect (an owner core may share its own)
        self.outputs = outputs if outputs is not None else Outputs()
        self.request_timeout = request_timeout
        self.queue_timeout = queue_timeout
        self.on_job_event = on_job_event
        self.clock = clock
        self.workers: dict[str, WorkerLink] = {}
        self.services: dict[str, dict[str, WorkerLink]] = {}
        self._pending: dict[str, _Pending] = {}
        self._deadlines: list[tuple[float, int, Any]] = []
        self._queued: dict[str, list[_Queued]] = {}
        self._inflight: dict[str, _InFlight] = {}
        self._orphans: OrderedDict[tuple[str, str], str] = OrderedDict()   # (uuid, worker)
        self._rids = itertools.count(1)
        self._uses = itertools.count(1)
        self._order = itertools.count()
        self.stats = {"post": 0, "get": 0, "delete": 0, "redispatched": 0, "expired": 0}

    # --- workers --------------------------------------------------------

    def add_worker(self, name: str, service: str,
                   send: Optional[Callable[[list[bytes]], Any]] = None,
                   info: Optional[dict[str, Any]] = None,
                   link: Hashable = None) -> WorkerLink:
        """Register (or replace) a worker; dispatches POSTs queued for its service.

        Commands for it go to ``send(frames)``, or without ``send`` out as
        ``Send(link, frames)`` (``link`` defaults to the worker's name)."""
        key = name if link is None else link
        old = self.workers.get(name)
        if old is not None:
            if old.service == service and old.send is send and old.link == key:
                return old
            self.remove_worker(name, "replaced by a new registration")
        worker = WorkerLink(name, service, send, key, info=dict(info or {}))
        self.workers[name] = worker
        self.services.setdefault(service, {})[name] = worker
        self._drain_queue(service)
        if service not in BROKER_SERVICES:
            self._drain_queue(WORKER_MMI)
        return worker

    def remove_worker(self, name: str, reason: str) -> None:
        """Forget a worker: its outstanding requests fail over or time out."""
        link = self.workers.pop(name, None)
        if link is None:
            return
        members = self.services.get(link.service)
        if members is not None:
            members.pop(name, None)
            if not members:
                del self.services[link.service]
        for pending in list(self._pending.values()):
            if name in pending.workers and name not in pending.replies:
                if pending.kind == "post" and pending.target == nfp.ANY:
                    self._retry_any(pending, name, reason)
                else:
                    self._record(pending, name, Status.REQUEST_TIMEOUT,
                                 f"worker {name} went away: {reason}", {})
        for uuid in list(link.jobs):
            flight = self._inflight.get(uuid)
            if flight is None or name not in flight.workers:
                continue
            flight.workers.discard(name)
            if not flight.workers:
                del self._inflight[uuid]
            if flight.target == nfp.ANY:
                self._redispatch(uuid, flight, name, reason)
            else:
                self._orphan(uuid, flight, name, reason)

    def pool(self, service: str) -> list[WorkerLink]:
        """The workers a request for ``service`` may go to."""
        if service == WORKER_MMI:
            return [w for w in self.workers.values() if w.service not in BROKER_SERVICES]
        return list(self.services.get(service, {}).values())

    def _resolve(self, service: str, target: str) -> tuple[list[WorkerLink], list[str]]:
        pool = self.pool(service)
        if target == nfp.ALL:
            return pool, []
        if target == nfp.ANY:
            if len(pool) < 2:
                return pool, []
            best = min(pool, key=lambda w: (w.load, w.used))
            return [best], []
        names = nfp.parse_target(target)
        by_name = {w.name: w for w in pool}
        return ([by_name[n] for n in names if n in by_name],
                [n for n in names if n not in by_name])

    # --- requests -------------------------------------------------------

    def post(self, service: str, target: str, uuid: str, body: dict[str, Any],
             done: Callable[[Reply], None], raw: Optional[bytes] = None) -> None:
        """Dispatch a job; ``done`` gets 202 with the accepting workers, or why not.

        ``raw``: ``body`` as JSON text, if the caller has it (sent on as it is)."""
        self.stats["post"] += 1
        if body.get("retry") and target == nfp.ANY:
            holders = body.get("holders")
            names = [n for n in holders if isinstance(n, str) and n and "," not in n] \
                if isinstance(holders, list) else []
            pool = self.pool(service)
            if names and not any(w.name in names for w in pool):
                self._queue(service, ",".join(names), uuid, body, done,
                            self.clock() + self.request_timeout, nfp.ANY,
                            lambda: self._retry(service, uuid, body, done))
                return
            self._retry(service, uuid, body, done)
            return
        self._post(service, target, uuid, body, done, raw=raw)

    def _retry(self, service: str, uuid: str, body: dict[str, Any],
               done: Callable[[Reply], None]) -> None:
        if self.pool(service):
            self._probe(service, uuid, body, done)
        else:
            self._post(service, nfp.ANY, uuid, body, done)

    def _post(self, service: str, target: str, uuid: str, body: dict[str, Any],
              done: Callable[[Reply], None], deadline: Optional[float] = None,
              as_target: str = "", raw: Optional[bytes] = None) -> None:
        targets, missing = self._resolve(service, target)
        if not targets:
            self._queue(service, target, uuid, body, done, deadline if deadline is not None
                        else self.clock() + self.queue_timeout, as_target)
            return
        pending = self._send(nfp.Command.POST, "post", service, as_target or target, uuid, body,
                             targets, done, raw)
        pending.missing = missing

    def _queue(self, service: str, target: str, uuid: str, body: dict[str, Any],
               done: Callable[[Reply], None], deadline: float, as_target: str = "",
               expire: Optional[Callable[[], None]] = None) -> None:
        """Hold a POST until a worker matching ``target`` arrives, or ``deadline``."""
        queued = _Queued(service, target, uuid, body, done, deadline, as_target=as_target,
                         expire=expire)
        self._queued.setdefault(service, []).append(queued)
        self._schedule(deadline, queued)

    def withdraw(self, uuid: str) -> bool:
        """Drop a POST of job ``uuid`` still queued for a worker, unanswered; True if one
        was (it was never sent, so it will not run)."""
        return bool(self._unqueue(uuid))

    def _unqueue(self, uuid: str) -> list[_Queued]:
        """Take the POSTs of job ``uuid`` out of the queues (unanswered); those taken."""
        taken = []
        for service, queue in list(self._queued.items()):
            taken += [q for q in queue if q.uuid == uuid]
            queue[:] = [q for q in queue if q.uuid != uuid]
            if not queue:
                del self._queued[service]
        return taken

    def get(self, service: str, target: str, uuid: str, body: dict[str, Any],
            done: Callable[[Reply], None], raw: Optional[bytes] = None) -> None:
        """Ask the targeted workers for a job's status and result (one reply for all)."""
        self.stats["get"] += 1
        self._fan_out(nfp.Command.GET, "get", service, target, uuid, body, done, raw)

    def delete(self, service: str, target: str, uuid: str, body: dict[str, Any],
               done: Callable[[Reply], None], raw: Optional[bytes] = None) -> None:
        """Cancel (or forget) a job on the targeted workers."""
        self.stats["delete"] += 1
        self._inflight.pop(uuid, None)
        for link in self.workers.values():
            link.jobs.discard(uuid)
        for key in [k for k in self._orphans if k[0] == uuid]:
            del self._orphans[key]
        for queued in self._unqueue(uuid):
            queued.done(Reply(Status.ERROR, {"uuid": uuid, "error": "deleted while queued for "
                                             "a worker"}, "deleted"))
        self._fan_out(nfp.Command.DELETE, "delete", service, target, uuid, body, done, raw)

    def _fan_out(self, command: nfp.Command, kind: str, service: str, target: str, uuid: str,
                 body: dict[str, Any], done: Callable[[Reply], None],
                 raw: Optional[bytes] = None) -> None:
        if target == nfp.ANY:
            target = nfp.ALL  # GET/DELETE of "any": ask every worker of the service
        targets, missing = self._resolve(service, target)
        flight = self._inflight.get(uuid)
        if flight is not None and flight.service == service:
            named = {w.name for w in targets}
            targets.extend(self.workers[n] for n in flight.workers
                           if n not in named and n in self.workers)
        if not targets:
            workers = {n: {"status": int(Status.REQUEST_TIMEOUT),
                           "error": self._away(uuid, n)} for n in missing}
            text = f"no worker of service {service} is connected"
            done(Reply(Status.REQUEST_TIMEOUT, {"uuid": uuid, "workers": workers,
                                                "error": text}, text))
            return
        pending = self._send(command, kind, service, target, uuid, body, targets, done, raw)
        pending.missing = missing

    def _send(self, command: nfp.Command, kind: str, service: str, target: str, uuid: str,
              body: dict[str, Any], targets: list[WorkerLink],
              done: Callable[[Reply], None], raw: Optional[bytes] = None) -> _Pending:
        rid = f"{next(self._rids):x}"
        deadline = self.clock() + self.request_timeout
        if kind == "get":
            wait = body.get("wait")
            if isinstance(wait, (int, float)) and wait > 0:
                deadline += float(wait)
        pending = _Pending(rid, kind, service, uuid, body, [w.name for w in targets], done,
                           deadline, target)
        self._pending[rid] = pending
        # the heap holds the rid, not the request: an answered request (nearly all of them)
        # is freed at once instead of living until its deadline (the garbage collector
        # would walk every one of them, many times, meanwhile)
        self._schedule(deadline, rid)
        payload = with_rid(raw, rid) if raw is not None else nfp.encode_body({**body, "rid": rid})
        role = self.role
        for link in targets:
            frames = nfp.request_frames(command, role, service, link.name, uuid, (payload,))
            if kind == "post":
                link.load += 1
                link.used = next(self._uses)
            if link.send is None:
                self.outputs._out(Send(link.link, frames))
            elif link.send(frames) is False:
                self._record(pending, link.name, Status.REQUEST_TIMEOUT,
                             f"could not send to worker {link.name}", {})
        return pending

    def _probe(self, service: str, uuid: str, body: dict[str, Any],
               done: Callable[[Reply], None]) -> None:
        def probed(reply: Reply) -> None:
            found = reply.body.get("workers", {})
            holders = [name for name, info in found.items()
                       if info.get("status") in (Status.OK, Status.PENDING)]
            if not holders:
                self._post(service, nfp.ANY, uuid, body, done)
                return
            states = {name: found[name].get("state") for name in holders}
            for name, state in states.items():
                if state not in FINAL_STATES:
                    self._track(uuid, service, nfp.ANY, body, name)
            done(Reply(Status.ACCEPTED, {"uuid": uuid, "workers": holders, "errors": {},
                                         "duplicate": True, "states": states}))
        self._fan_out(nfp.Command.GET, "probe", service, nfp.ALL, uuid, {"wait": 0}, probed)

    def _retry_any(self, pending: _Pending, gone: str, reason: str) -> None:
        """An ``any`` POST whose worker vanished before answering goes to another one."""
        self._pending.pop(pending.rid, None)
        pending.finished = True
        log.debug("POST %s: worker %s gone before answering (%s); dispatching again",
                  pending.uuid, gone, reason)
        self._post(pending.service, nfp.ANY, pending.uuid, pending.body, pending.done,
                   pending.deadline + self.queue_timeout)

    def _track(self, uuid: str, service: str, target: str, body: dict[str, Any],
               worker: str) -> None:
        """Remember that ``worker`` accepted job ``uuid`` and has not finished it."""
        link = self.workers.get(worker)
        if link is None:
            return
        flight = self._inflight.get(uuid)
        if flight is None:
            self._inflight[uuid] = _InFlight(service, target, body, {worker})
        else:
            flight.workers.add(worker)
        link.jobs.add(uuid)
        if self._orphans:
            self._orphans.pop((uuid, worker), None)

    def _away(self, uuid: str, worker: str) -> str:
        """Why ``worker`` cannot answer about job ``uuid`` (it is not connected)."""
        return self._orphans.get((uuid, worker), "worker not connected")

    def _orphan(self, uuid: str, flight: _InFlight, gone: str, reason: str) -> None:
        text = (f"worker {gone} went away before finishing the job ({reason}); it runs the "
                f"job again if it comes back with its job store")
        self._orphans[(uuid, gone)] = text
        if len(self._orphans) > _MAX_ORPHANS:
            self._orphans.popitem(last=False)
        self._event(uuid, flight.service, gone, {"state": "orphaned",
                                                 "status": int(Status.REQUEST_TIMEOUT),
                                                 "reason": text})

    def _redispatch(self, uuid: str, flight: _InFlight, gone: str, reason: str) -> None:
        self.stats["redispatched"] += 1
        body = {**flight.body, "redispatch": True}

        def dispatched(reply: Reply) -> None:
            workers = reply.body.get("workers") or []
            if reply.status is Status.ACCEPTED and workers:
                self._event(uuid, flight.service, workers[0],
                            {"state": "redispatched", "from": gone, "to": workers[0],
                             "reason": reason})
            else:
                self._event(uuid, flight.service, gone,
                            {"state": "lost", "reason": f"worker {gone} went away ({reason}) and "
                             f"no other worker accepted the job: {reply.text or reply.status}"})
        self._post(flight.service, nfp.ANY, uuid, body, dispatched)

    def _event(self, uuid: str, service: str, worker: str, body: dict[str, Any]) -> None:
        if self.on_job_event is not None:
            body = {**body, "worker": worker}
            msg = nfp.EventCommand(nfp.BROKER if self.role is nfp.BROKER else nfp.WORKER, service, uuid,
                            Status.OK, (nfp.encode_body(body),))
            self.on_job_event(uuid, worker, body, msg)

    # --- answers from workers -------------------------------------------

    def _worker_body(self, worker: str, msg: Any, kind: str) -> Optional[dict[str, Any]]:
        """The decoded body of a worker's ``msg`` (None if bad), noting the load it reports."""
        try:
            body = nfp.decode_body(msg.body[0])
        except ProtocolError as exc:
            log.debug("%s from %s with a bad body: %s", kind, worker, exc.reason)
            return None
        link = self.workers.get(worker)
        load = body.get("load")
        if link is not None and isinstance(load, int):
            link.load = load
        return body

    def on_response(self, worker: str, msg: nfp.Response) -> None:
        """A worker's RESPONSE; ignored unless it answers a request this dispatcher sent."""
        body = self._worker_body(worker, msg, "RESPONSE")
        if body is None:
            return
        rid = body.pop("rid", None)
        pending = self._pending.get(rid) if isinstance(rid, str) else None
        if pending is None or worker not in pending.workers or worker in pending.replies:
            return
        if pending.uuid != msg.uuid:
            log.debug("RESPONSE from %s for %s answers rid %s of job %s", worker, msg.uuid, rid,
                      pending.uuid)
            return
        if pending.kind == "post" and msg.status is Status.ACCEPTED \
                and body.get("state") not in FINAL_STATES:
            self._track(pending.uuid, pending.service, pending.target, pending.body, worker)
        self._record(pending, worker, msg.status, msg.text, body)

    def on_event(self, worker: str, msg: nfp.EventCommand) -> None:
        """A worker's EVENT: note finished jobs and hand it to ``on_job_event``."""
        body = self._worker_body(worker, msg, "EVENT")
        if body is None:
            return
        link = self.workers.get(worker)
        if body.get("state") in FINAL_STATES:
            flight = self._inflight.get(msg.topic)
            if flight is not None:
                flight.workers.discard(worker)
                if not flight.workers:
                    del self._inflight[msg.topic]
            if link is not None:
                link.jobs.discard(msg.topic)
        if self.on_job_event is not None:
            self.on_job_event(msg.topic, worker, body, msg)

    def _record(self, pending: _Pending, worker: str, status: Status, text: str,
                body: dict[str, Any]) -> None:
        if pending.finished or worker in pending.replies:
            return
        pending.replies[worker] = (status, text, body)
        if len(pending.replies) >= len(pending.workers):
            self._finish(pending)

    def _finish(self, pending: _Pending) -> None:
        pending.finished = True
        self._pending.pop(pending.rid, None)
        for name in pending.workers:
            if name not in pending.replies:
                pending.replies[name] = (Status.REQUEST_TIMEOUT,
                                         f"no response from worker {name} in time", {})
        reply = self._fold(pending)
        try:
            pending.done(reply)
        except Exception:
            log.exception("reply callback for %s %s failed", pending.kind, pending.uuid)

    def _fold(self, p: _Pending) -> Reply:
        uuid = p.uuid
        if p.kind == "post":
            if len(p.replies) == 1 and not p.missing:
                # one worker, accepted, first time (nearly every POST): nothing to fold
                (name, (status, _, body)), = p.replies.items()
                if status is Status.ACCEPTED and not body.get("duplicate"):
                    out: dict[str, Any] = {"uuid": uuid, "workers": [name], "errors": {}}
                    if body.get("state") in FINAL_STATES:
                        out["finished"] = {name: _worker_fields(body)}
                    return Reply(Status.ACCEPTED, out)
            accepted = [n for n, (s, _, _) in p.replies.items() if s is Status.ACCEPTED]
            errors = {n: body.get("error") or text or s.name
                      for n, (s, text, body) in p.replies.items() if s is not Status.ACCEPTED}
            errors.update({n: "no such worker" for n in p.missing})
            out = {"uuid": uuid, "workers": accepted, "errors": errors}
            finished = {n: _worker_fields(body) for n, (s, _, body) in p.replies.items()
                        if s is Status.ACCEPTED and not body.get("duplicate")
                        and body.get("state") in FINAL_STATES}
            if finished:
                out["finished"] = finished
            if any(body.get("duplicate") for s, _, body in p.replies.values()
                   if s is Status.ACCEPTED):
                out["duplicate"] = True   # accepted before: EVENTs come only if unfinished
                out["states"] = {n: body.get("state") for n, (s, _, body) in p.replies.items()
                                 if s is Status.ACCEPTED}
            if accepted:
                return Reply(Status.ACCEPTED, out)
            statuses = [s for s, _, _ in p.replies.values()]
            status = Status.REQUEST_TIMEOUT if Status.REQUEST_TIMEOUT in statuses else \
                statuses[0] if statuses else Status.ERROR
            if status is Status.PENDING or status is Status.OK:
                status = Status.ERROR
            text = "; ".join(f"{n}: {e}" for n, e in errors.items())
            return Reply(status, {**out, "error": text}, text[:200])
        workers: dict[str, Any] = {}
        for name, (status, text, body) in p.replies.items():
            entry = _worker_fields(body)
            entry["status"] = int(status)
            if text and "error" not in entry and status not in (Status.OK, Status.ACCEPTED):
                entry["error"] = text
            workers[name] = entry
        for name in p.missing:
            workers[name] = {"status": int(Status.REQUEST_TIMEOUT), "error": self._away(uuid, name)}
        statuses = [Status(w["status"]) for w in workers.values()]
        if p.kind in ("get", "probe"):
            status = overall_get_status(statuses)
        elif Status.OK in statuses:
            status = Status.OK
        elif statuses and all(s is Status.UNKNOWN for s in statuses):
            status = Status.UNKNOWN
        elif Status.REQUEST_TIMEOUT in statuses:
            status = Status.REQUEST_TIMEOUT
        else:
            status = Status.ERROR
        return Reply(status, {"uuid": uuid, "workers": workers})

    # --- time -----------------------------------------------------------

    def _schedule(self, deadline: float, item: Any) -> None:
        heapq.heappush(self._deadlines, (deadline, next(self._order), item))

    def next_deadline(self) -> Optional[float]:
        """When ``tick`` next has something to do (None: nothing waits)."""
        return self._deadlines[0][0] if self._deadlines else None

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """A message from worker ``link`` (its name): a RESPONSE or an EVENT (anything else,
        or malformed, is dropped); the outputs it caused."""
        try:
            msg = nfp.decode(frames)
        except ProtocolError as exc:
            log.debug("dropped a malformed message from worker %s: %s", link, exc.reason)
            return self.take()
        if msg.role is not nfp.WORKER:
            log.debug("dropped %s with header %s from worker %s", type(msg).__name__,
                      msg.role.value, link)
        elif type(msg) is nfp.Response:
            self.on_response(str(link), msg)
        elif type(msg) is nfp.EventCommand:
            self.on_event(str(link), msg)
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        """``tick(now)``; the outputs it caused."""
        self.tick(now)
        return self.take()

    def take(self) -> list[Output]:
        """The outputs collected since the last call."""
        return self.outputs.take()

    def tick(self, now: float) -> None:
        """Time out requests and expire queued POSTs whose deadline has passed."""
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, item = heapq.heappop(heap)
            if type(item) is str:     # a request's rid
                pending = self._pending.get(item)
                if pending is not None and not pending.finished:
                    self._finish(pending)
            else:
                queue = self._queued.get(item.service)
                if queue is not None and item in queue:
                    queue.remove(item)
                    if not queue:
                        del self._queued[item.service]
                    if item.expire is not None:
                        item.expire()
                        continue
                    self.stats["expired"] += 1
                    text = (f"no worker of service {item.service} matching target "
                            f"{item.target!r} within {self.queue_timeout:g}s")
                    item.done(Reply(Status.REQUEST_TIMEOUT,
                                    {"uuid": item.uuid, "workers": [], "errors": {},
                                     "error": text}, text[:200]))

    def _drain_queue(self, service: str) -> None:
        queue = self._queued.get(service)
        if not queue:
            return
        waiting = [item for item in queue if not self._resolve(item.service, item.target)[0]]
        if waiting:
            self._queued[service] = waiting     # still no match: wait on (same deadline)
        else:
            del self._queued[service]
        for item in queue:
            if item not in waiting:
                self._post(item.service, item.target, item.uuid, item.body, item.done,
                           item.deadline, item.as_target)

    # --- introspection --------------------------------------------------

    def queued(self) -> dict[str, int]:
        """POSTs waiting for a worker, by service."""
        return {service: len(queue) for service, queue in self._queued.items()}

    def inflight(self) -> dict[str, list[str]]:
        """Jobs accepted and not finished yet: job UUID -> its workers."""
        return {uuid: sorted(f.workers) for uuid, f in self._inflight.items()}

    def fail_all(self, status: Status, text: str) -> None:
        """Answer every open request and queued POST with ``status`` (e.g. on step-down)."""
        for pending in list(self._pending.values()):
            pending.finished = True
            self._pending.pop(pending.rid, None)
            pending.done(Reply(status, {"uuid": pending.uuid, "error": text}, text))
        queued, self._queued = self._queued, {}
        for queue in queued.values():
            for item in queue:
                item.done(Reply(status, {"uuid": item.uuid, "error": text}, text))
        self._deadlines.clear()
