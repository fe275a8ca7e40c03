"""The NFP client: post jobs, fetch results, cancel; through the broker or directly.

How it works
------------
With a broker in the mesh the client keeps one DEALER to it (NFP/Client:
OPEN, OPEN, then requests; the DEALER adds nothing to the frames, so the
broker sees exactly what a REQ socket would send) and every request gets one
RESPONSE. Without a broker the client runs a ``Dispatcher`` of its own over
one DEALER per worker the mesh advertises (``X-PM-NFP-WORKER``) and folds
the workers' answers the same way, so callers cannot tell the difference.

Requests carry ``"rid"`` in their JSON body to match answers. A request that
meets a broker change (the broker stepped down, left the mesh, or answered
"not the broker") is sent again to the new broker, or directly, until its
timeout; a POST sent again carries ``"retry": true`` so an ``any`` job is
not run a second time by a different worker.

**Open jobs survive a broker change.** What a broker knows about the jobs it
relayed (who posted them, which worker runs them, re-dispatch) dies with
it. So the client remembers, in memory, every job it posted that was
accepted and whose workers have not all reported it finished (at most
``MAX_OPEN`` jobs, newest kept), and when the broker changes it re-POSTs
each of them, same UUID, with ``"retry": true``, to the new broker (or
directly). Workers are idempotent and keep their jobs on disk: a worker that
has the job answers 202 again (with its state) instead of running it twice,
and an ``any`` job that no live worker has is dispatched afresh. From then
on the new broker relays the job's EVENTs to this client and re-dispatches
or reports it (``orphaned``) if its worker dies. A job whose re-POST finds it
already finished is fetched with a GET by ``run``.

Every job posted is recorded in the node's store as it is sent
(``posting``), then updated with the workers that accepted it and what later
answers say (``accepted``, ``running``, ``completed``, ``failed``,
``cancelled``, ``expired``, ``lost``, ...), so ``jobs()`` (and ``peermesh job
list``) shows every job this node posted, also after a restart. These
records are committed at the store's next group commit, not waited for (see
``peermesh.nfp.store``).

``run`` is POST and wait for the result: the POST asks the workers to put
the result in their final EVENT (``"notify": true``), which arrives without
another round trip; if an EVENT does not come (the broker changed in
between) it falls back to a GET that waits at the worker. A worker that
finished the job before its 202 left puts the result in the 202 instead (the
broker's 202 lists it under ``"finished"``); ``post`` hands each such entry
to the same code as a final EVENT, listeners included.

Kept whole: one overlay (``Client``): its broker and direct paths must answer callers
alike, and share the table of open jobs that a broker change posts again.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import gevent
import gevent.event
import gevent.pool
import zmq

from ..argtypes import is_seconds
from ..errors import ProtocolError
from ..events import tell
from ..overlay import Overlay
from ..wire import nfp
from ..wire.nfp import Status
from .dispatch import FINAL_STATES, Dispatcher, Reply, overall_get_status, with_rid
from ..io.curve import Curve
from .store import ClientJob, JobStore
from ..io import shared_context
from .clientcore import BROKER, ClientCore, Expired
from .session import server_key
from ..core import Send
from ..io.driver import Driver
from ..io.transport import Transport, ZmqTransport
from ..wire.nfp import MAX_MESSAGE

__all__ = ["Client", "JobEvent", "Reply"]

log = logging.getLogger(__name__)

_RETRY = object()   # the request met a broker change: send it again
_EXPIRED = object()  # no answer from the broker by the request's deadline
_PAUSE = 0.05       # seconds between attempts while the mesh settles
MAX_OPEN = 10_000   # open jobs remembered for re-posting after a broker change
_REPOSTS = 16       # re-POSTs in flight at once after a broker change
_COMMANDS = {"post": nfp.Command.POST, "get": nfp.Command.GET, "delete": nfp.Command.DELETE}


def _job_body(task: str, args: Optional[Sequence[Any]], kwargs: Optional[Mapping[str, Any]],
              job_timeout: Optional[float]) -> tuple[dict[str, Any], str]:
    """A POST's body and its JSON text (encoded once: for the record and the request);
    TypeError or ValueError, saying which, for what cannot be sent."""
    if not isinstance(task, str) or not task:
        raise ValueError(f"task must be a non-empty string, not {task!r}")
    if args is not None and not isinstance(args, (list, tuple)):
        raise TypeError(f"args must be a list or tuple, not {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"kwargs must be a mapping, not {type(kwargs).__name__}")
    body: dict[str, Any] = {"task": task, "args": list(args or ()), "kwargs": dict(kwargs or {})}
    if job_timeout is not None:
        if not is_seconds(job_timeout):
            raise ValueError(f"job_timeout must be a positive number of seconds, not "
                             f"{job_timeout!r}")
        body["timeout"] = float(job_timeout)
    try:
        text = nfp.to_json(body)
    except (TypeError, ValueError) as exc:   # not JSON
        raise type(exc)(f"the job's arguments cannot be sent: {exc}") from None
    nfp.check_size(text, "the job's arguments")
    return body, text


def _check_request(service: str, timeout: float) -> None:
    """ValueError unless ``service`` can be named on the wire and ``timeout`` is a wait."""
    if not isinstance(service, str) or not service or not service.isprintable():
        raise ValueError(f"service must be a non-empty printable name, not {service!r}")
    if not is_seconds(timeout):
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")


def new_job_uuid() -> str:
    """A random (version 4) UUID as 32 hex digits, as ``uuid.uuid4().hex`` but cheaper."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return raw.hex()


@dataclass(frozen=True, slots=True)
class JobEvent:
    """An EVENT about a job: progress, its final state, or a re-dispatch."""

    uuid: str
    worker: str
    body: dict[str, Any]

    @property
    def state(self) -> Optional[str]:
        """``running``, ``completed``, ``failed``, ``cancelled``, ``redispatched`` or ``lost``."""
        return self.body.get("state")


@dataclass(eq=False, slots=True)
class _OpenJob:
    service: str
    target: str
    body: dict[str, Any]
    workers: set[str]           # accepted it; no final EVENT from them yet


@dataclass(eq=False)
class _RunWaiter:
    expected: set[str] = field(default_factory=set)
    finals: dict[str, dict[str, Any]] = field(default_factory=dict)
    armed: bool = False
    complete: bool = False      # every expected worker's final EVENT is in
    fetch: bool = False         # a re-POST found it finished: no EVENT will come, GET it
    done: gevent.event.Event = field(default_factory=gevent.event.Event)  # complete or fetch

    def check(self) -> None:
        if self.armed and self.expected and self.finals.keys() >= self.expected:
            self.complete = True
            self.done.set()


def _final_status(body: dict[str, Any]) -> Status:
    """The per-worker status ``run`` reports for a final EVENT."""
    state = body.get("state")
    return Status.ERROR if state == "lost" else \
        Status.REQUEST_TIMEOUT if state == "orphaned" else Status.OK


class Client(Overlay):
    """Posts jobs and fetches results; one per ``NfpNode``, an overlay of its node.
    Call from the node's hub."""

    roles = ("nfp-client",)

    def __init__(self, store: JobStore, *, name: str = "", node: str = "",
                 context: Optional[zmq.Context] = None, request_timeout: float = 5.0,
                 queue_timeout: float = 30.0, curve: Optional[Curve] = None,
                 keys: Mapping[str, str] = {}, transport: Optional[Transport] = None) -> None:
        super().__init__()
        #: the node's CURVE keys, and the key of each endpoint's node (see ``server_key``)
        self._curve, self._keys = curve, keys
        self.store = store
        self.name = name
        self.node_id = node   # the node's UUID in hex, for the wire
        self.request_timeout = float(request_timeout)
        self.queue_timeout = float(queue_timeout)
        self._context = context or shared_context()
        #: how the links to workers are made, and the clock of every deadline of the client
        self.transport: Transport = transport if transport is not None else ZmqTransport(
            self._context, curve)
        self._clock = self.transport.now
        self._direct = Dispatcher(nfp.CLIENT, request_timeout=request_timeout,
                                  queue_timeout=queue_timeout, on_job_event=self._on_job_event,
                                  clock=self._clock)
        #: serves the client's links (sans-io): the broker's, and one per worker for the
        #: brokerless dispatcher, named by the worker
        self._core = ClientCore(self._direct)
        self._workers = Driver(self._core, self.transport, on_deliver=self._on_broker,
                               max_message=MAX_MESSAGE, name="client")
        #: the elected broker's NFP endpoint (None: no broker, workers are asked directly)
        self.broker: Optional[str] = None
        self._broker_linked = 0     # the generation of the broker link (0: none)
        self._generations = itertools.count(1)
        self._opened: Optional[gevent.event.AsyncResult] = None
        #: requests sent to the broker, by rid; once started, the core's timer (on the
        #: driver) expires them, so a request needs no timer of its own
        self._waiting: dict[str, gevent.event.AsyncResult] = {}
        self._rids = itertools.count(1)
        self._changed = gevent.event.Event()
        self._listeners: list[Callable[[JobEvent], None]] = []
        self._runs: dict[str, _RunWaiter] = {}
        self._open: OrderedDict[str, _OpenJob] = OrderedDict()
        self._reposter: Optional[gevent.Greenlet] = None
        self._per_job: dict[str, list[Callable[[JobEvent], None]]] = {}
        # POSTs waiting for their answer: workers whose final EVENT came first (a worker
        # sends its 202 and a quick job's final EVENT together)
        self._posting: dict[str, set[str]] = {}
        self._started = False

    # --- life cycle -----------------------------------------------------

    def on_start(self) -> None:
        """From now on requests to the broker expire on the driver's timer."""
        self._started = True

    def on_stop(self, timeout: float) -> None:
        """Close every socket; open requests end with 408."""
        self._started = False
        if self._reposter is not None:
            self._reposter.kill(block=False)
        self._reposter = None
        self._close_broker()
        for name in list(self._direct.workers):
            self.remove_worker(name)
        self._workers.close()

    # --- the mesh view --------------------------------------------------

    def add_worker(self, name: str, service: str, endpoint: str) -> None:
        """A worker the mesh advertises (used when there is no broker)."""
        if name in self._direct.workers:
            self.remove_worker(name, "replaced by a new registration")
        dialable, key = server_key(endpoint, self._keys if self._curve is not None else None)
        if not dialable:
            return
        self._workers.dial(name, endpoint, _new_identity(), key)
        self._direct.add_worker(name, service, info={"endpoint": endpoint})
        self._workers.apply(self._direct.take())

    def remove_worker(self, name: str, reason: str = "left the mesh") -> None:
        """A worker left the mesh."""
        self._direct.remove_worker(name, reason)
        self._workers.apply(self._direct.take())
        self._workers.hangup(name)

    def direct_workers(self) -> dict[str, list[str]]:
        """Workers reachable without a broker, by service."""
        return {s: sorted(members) for s, members in self._direct.services.items()}

    def set_broker(self, broker: Optional[str]) -> None:
        """The elected broker's endpoint changed (None: no broker, ask workers directly)."""
        if broker == self.broker:
            return
        self.broker = broker
        self._close_broker()
        changed, self._changed = self._changed, gevent.event.Event()
        changed.set()
        if self._reposter is not None:
            self._reposter.kill(block=False)
            self._reposter = None
        if self._open:
            self._reposter = gevent.spawn(self._repost_open)

    def _repost_open(self) -> None:
        """Re-POST every open job (same UUID, ``retry``) after a broker change."""
        pool = gevent.pool.Pool(_REPOSTS)
        for uuid in list(self._open):
            if uuid in self._open:
                pool.spawn(self._repost, uuid)
        pool.join()
        self._reposter = None

    def _repost(self, uuid: str) -> None:
        job = self._open.get(uuid)
        if job is None:
            return
        reply = self._request("post", job.service, job.target, uuid,
                              {**job.body, "retry": True, "holders": sorted(job.workers)},
                              self.queue_timeout + self.request_timeout)
        if self._open.get(uuid) is not job:
            return          # finished (or deleted) meanwhile
        waiter = self._runs.get(uuid)
        if reply.status is not Status.ACCEPTED:
            log.info("job %s: re-POST after the broker changed failed: %s %s", uuid,
                     int(reply.status), reply.text)
            del self._open[uuid]
            if waiter is not None:
                waiter.fetch = True     # GET says what became of it
                waiter.done.set()
            return
        states = reply.body.get("states") or {}
        accepted = set(reply.body.get("workers", []))
        job.workers = {w for w in accepted if states.get(w) not in FINAL_STATES}
        if not job.workers:
            del self._open[uuid]
        if waiter is not None:
            waiter.expected = accepted
            if job.workers != accepted:
                waiter.fetch = True     # finished in between: its EVENT went nowhere
                waiter.done.set()
            waiter.check()

    def _close_broker(self) -> None:
        if self._broker_linked:
            self._broker_linked = 0
            self._workers.hangup(BROKER)
        opened, self._opened = self._opened, None
        if opened is not None and not opened.ready():
            opened.set(False)
        waiting, self._waiting = self._waiting, {}
        for rid, result in waiting.items():
            self._core.settle(rid)
            if not result.ready():
                result.set(_RETRY)

    # --- broker link ----------------------------------------------------

    def _broker_link(self, deadline: float) -> int:
        """The generation of an open link to the broker (dialled, OPEN answered), or 0."""
        broker = self.broker
        if broker is None:
            return 0
        if not self._broker_linked:
            dialable, key = server_key(broker, self._keys if self._curve is not None else None)
            if not dialable:
                return 0
            self._workers.dial(BROKER, broker, _new_identity(), key)
            self._broker_linked = next(self._generations)
            self._opened = gevent.event.AsyncResult()
            self._workers.apply((Send(BROKER, nfp.encode(nfp.Open(nfp.CLIENT, nfp.encode_body(
                {"name": self.name, "node": self.node_id})))),))
        opened = self._opened
        channel = self._broker_linked
        assert opened is not None
        if opened.ready():     # (nearly always: no Timeout made per request)
            ok = opened.value
        else:
            try:
                ok = opened.get(timeout=max(0.0, min(deadline - self._clock(),
                                                     self.request_timeout)))
            except gevent.Timeout:
                ok = False
        if not ok:
            if self._broker_linked == channel:   # not answering / not the broker: a new link
                self._close_broker()
            return 0
        return channel

    def _on_broker(self, msg: nfp.Message | Expired) -> None:
        """A message from the broker (``ClientCore`` decoded it), or a request to it that
        expired."""
        if type(msg) is Expired:
            expired = self._waiting.pop(msg.rid, None)
            if expired is not None and not expired.ready():
                expired.set(_EXPIRED)
        elif isinstance(msg, nfp.Response):
            try:
                body = nfp.decode_body(msg.body[0])
            except ProtocolError:
                return
            rid = str(body.pop("rid", ""))
            result = self._waiting.pop(rid, None)
            if result is None:
                return
            self._core.settle(rid)
            if msg.status is Status.ERROR and msg.text in ("not the broker",
                                                           "broker stepped down",
                                                           "broker restarting",
                                                           "broker closing"):
                result.set(_RETRY)
            else:
                result.set(Reply(msg.status, body, msg.text))
        elif isinstance(msg, nfp.EventCommand):
            try:
                body = nfp.decode_body(msg.body[0])
            except ProtocolError:
                return
            self._on_job_event(msg.topic, str(body.get("worker", "")), body, msg)
        elif isinstance(msg, nfp.Open):
            try:
                active = nfp.decode_body(msg.body).get("active", True)
            except ProtocolError:
                active = False
            if self._opened is not None and not self._opened.ready():
                self._opened.set(bool(active))

    # --- requests -------------------------------------------------------

    def _request(self, kind: str, service: str, target: str, uuid: str, body: dict[str, Any],
                 timeout: float, raw: Optional[bytes] = None) -> Reply:
        """Send one request until it is answered (``raw``: ``body`` as JSON, if known)."""
        deadline = self._clock() + timeout
        attempts = 0
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                text = f"no answer within {timeout:g}s" + (" (the broker kept changing)"
                                                           if attempts else "")
                return Reply(Status.REQUEST_TIMEOUT, {"uuid": uuid, "error": text}, text)
            changed = self._changed
            if attempts and kind == "post":
                body = {**body, "retry": True}
                raw = None
            if self.broker is not None:
                reply = self._via_broker(kind, service, target, uuid, body, deadline, raw)
            else:
                reply = self._via_direct(kind, service, target, uuid, body, remaining, raw)
            if reply is not _RETRY:
                assert isinstance(reply, Reply)
                return reply
            attempts += 1
            changed.wait(min(_PAUSE * attempts, 0.5, max(0.0, deadline - self._clock())))

    def _via_direct(self, kind: str, service: str, target: str, uuid: str,
                    body: dict[str, Any], remaining: float, raw: Optional[bytes] = None) -> Any:
        result: gevent.event.AsyncResult = gevent.event.AsyncResult()
        getattr(self._direct, kind)(service, target, uuid, body, result.set, raw=raw)
        self._workers.apply(self._direct.take())
        changed = self._changed
        try:
            return result.get(timeout=remaining)
        except gevent.Timeout:
            # a POST still queued for a worker was never sent: take it back either way
            unsent = kind == "post" and self._direct.withdraw(uuid)
            if changed.is_set():
                return _RETRY
            if unsent:
                text = (f"no worker of service {service} matching target {target!r} within "
                        f"{remaining:.3g}s; the job was not sent")
            else:
                text = f"no answer from the workers within {remaining:.3g}s"
            return Reply(Status.REQUEST_TIMEOUT, {"uuid": uuid, "error": text}, text)

    def _via_broker(self, kind: str, service: str, target: str, uuid: str,
                    body: dict[str, Any], deadline: float, raw: Optional[bytes] = None) -> Any:
        if not self._broker_link(deadline):
            return _RETRY
        rid = f"c{next(self._rids):x}"
        command = _COMMANDS[kind]
        result: gevent.event.AsyncResult = gevent.event.AsyncResult()
        self._waiting[rid] = result
        # "rid" goes last: a broker passes the rest of the body on as it is
        payload = with_rid(raw, rid) if raw is not None else nfp.encode_body({**body, "rid": rid})
        started = self._started
        if started:    # (before the send: applying it arms the driver's timer)
            self._core.expect(rid, deadline)
        self._workers.apply((Send(BROKER, nfp.request_frames(command, nfp.CLIENT, service,
                                                             target, uuid, (payload,))),))
        if started:
            answer = result.get()
        else:   # not started: no timer to expire it
            try:
                answer = result.get(timeout=max(0.0, deadline - self._clock()))
            except gevent.Timeout:
                self._waiting.pop(rid, None)
                answer = _EXPIRED
        if answer is _EXPIRED:
            text = "no answer from the broker in time"
            return Reply(Status.REQUEST_TIMEOUT, {"uuid": uuid, "error": text}, text)
        return answer

    # --- the API --------------------------------------------------------

    def post(self, service: str, task: str, args: Optional[Sequence[Any]] = None,
             kwargs: Optional[dict[str, Any]] = None, target: str | Sequence[str] = "all", *,
             timeout: Optional[float] = None, job_timeout: Optional[float] = None,
             uuid: Optional[str] = None, notify: bool = False,
             _record_accepted: bool = True) -> Reply:
        """POST a job. 202: ``body["workers"]`` accepted it (``body["errors"]``: who did not).

        A POST for a service (or named workers) with none present waits for one
        up to ``queue_timeout``, then ends with 408. ``timeout`` bounds the whole
        call (default: queue_timeout + request_timeout).
        """
        if timeout is None:
            timeout = self.queue_timeout + self.request_timeout
        _check_request(service, timeout)
        target_text = nfp.format_target(target if isinstance(target, str) else tuple(target))
        uuid = uuid or new_job_uuid()
        body, text = _job_body(task, args, kwargs, job_timeout)
        self.store.add_client_job(uuid, service, task, target_text, body, body_text=text)
        if notify:
            body["notify"] = True
            text = text[:-1] + ',"notify":true}'
        finished = self._posting[uuid] = set()
        try:
            reply = self._request("post", service, target_text, uuid, body, timeout,
                                  text.encode("utf-8"))
            # workers that finished the job before their 202 left sent its end with it
            # instead of a final EVENT: handled as that EVENT
            ended = reply.body.pop("finished", None)
            if isinstance(ended, dict):
                for worker, final in ended.items():
                    if isinstance(final, dict) and final.get("state") in FINAL_STATES:
                        self._on_job_event(uuid, worker, final)
        finally:
            self._posting.pop(uuid, None)
        reply.body.setdefault("uuid", uuid)
        if reply.status is Status.ACCEPTED:
            states = reply.body.get("states") or {}
            unfinished = {w for w in reply.body.get("workers", [])
                          if states.get(w) not in FINAL_STATES and w not in finished}
            if unfinished:
                self._open[uuid] = _OpenJob(service, target_text, body, unfinished)
                if len(self._open) > MAX_OPEN:
                    self._open.popitem(last=False)
            if _record_accepted:   # run() records the workers with the result instead
                self.store.update_client_job(uuid, state="accepted", status=int(reply.status),
                                             workers=list(reply.body.get("workers", [])))
        else:
            state = "expired" if reply.status is Status.REQUEST_TIMEOUT else "failed"
            self.store.update_client_job(uuid, state=state, status=int(reply.status),
                                         reason=reply.text or str(reply.body.get("error", "")))
        return reply

    def _locate(self, uuid: str, service: Optional[str],
                target: Optional[str | Sequence[str]]) -> tuple[str, str]:
        job = self.store.client_job(uuid)
        if service is None:
            if job is None:
                raise ValueError(f"job {uuid} was not posted from here; give its service")
            service = job.service
        if target is None:
            target = ",".join(job.workers) if job is not None and job.workers else "all"
        return service, nfp.format_target(target if isinstance(target, str) else tuple(target))

    def get(self, uuid: str, *, service: Optional[str] = None,
            target: Optional[str | Sequence[str]] = None, wait: float = 0.0,
            timeout: Optional[float] = None) -> Reply:
        """GET a job: ``body["workers"][name]`` has each worker's status and result.

        Status: 200 all finished, 300 some still pending, 400 unknown everywhere,
        408 workers not reachable. ``wait`` seconds: held at the workers until
        the job finishes (or the wait ends).
        """
        service, target_text = self._locate(uuid, service, target)
        body: dict[str, Any] = {"wait": float(wait)} if wait > 0 else {}
        timeout = timeout if timeout is not None else self.request_timeout + wait
        _check_request(service, timeout)
        reply = self._request("get", service, target_text, uuid, body, timeout)
        self._record_result(uuid, reply)
        return reply

    def delete(self, uuid: str, *, service: Optional[str] = None,
               target: Optional[str | Sequence[str]] = None,
               timeout: Optional[float] = None) -> Reply:
        """DELETE a job: cancel it where pending/running, forget it where finished."""
        service, target_text = self._locate(uuid, service, target)
        self._open.pop(uuid, None)
        timeout = timeout if timeout is not None else self.request_timeout
        _check_request(service, timeout)
        reply = self._request("delete", service, target_text, uuid, {}, timeout)
        if self.store.client_job(uuid) is not None and reply.status is Status.OK:
            outcomes = {w.get("outcome") for w in reply.body.get("workers", {}).values()}
            self.store.update_client_job(uuid, state="cancelled" if "cancelled" in outcomes
                                         else "deleted", status=int(reply.status))
        return reply

    def run(self, service: str, task: str, args: Optional[Sequence[Any]] = None,
            kwargs: Optional[dict[str, Any]] = None, target: str | Sequence[str] = "all", *,
            timeout: float = 60.0, job_timeout: Optional[float] = None,
            on_event: Optional[Callable[[JobEvent], None]] = None) -> Reply:
        """POST a job and wait for its result (the reply of a GET: 200, or why not)."""
        deadline = self._clock() + timeout
        uuid = new_job_uuid()
        waiter = _RunWaiter()
        self._runs[uuid] = waiter
        if on_event is not None:
            self._per_job.setdefault(uuid, []).append(on_event)
        try:
            posted = self.post(service, task, args, kwargs, target, timeout=timeout,
                               job_timeout=job_timeout, uuid=uuid, notify=True,
                               _record_accepted=False)
            if posted.status is not Status.ACCEPTED:
                return posted
            waiter.expected = set(posted.body.get("workers", []))
            # a duplicate (accepted before, e.g. before a broker change) that is finished
            # already sends no EVENT: ask with a GET
            states = posted.body.get("states") or {}
            waiter.fetch = any(state in FINAL_STATES for state in states.values())
            waiter.armed = True
            waiter.check()
            if not waiter.fetch and not waiter.complete:
                waiter.done.wait(max(0.0, deadline - self._clock()))
            if waiter.complete:
                statuses = {name: _final_status(body) for name, body in waiter.finals.items()
                            if name in waiter.expected}
                workers = {}
                for name, final in statuses.items():
                    entry = workers[name] = {**waiter.finals[name], "status": int(final)}
                    entry.pop("load", None)
                reply = Reply(overall_get_status(list(statuses.values())),
                              {"uuid": uuid, "workers": workers})
                self._record_result(uuid, reply, known=True, accepted=sorted(waiter.expected))
                return reply
            self.store.update_client_job(uuid, state="accepted", status=int(posted.status),
                                         workers=sorted(waiter.expected))
            while True:
                reply = self.get(uuid, service=service, target=sorted(waiter.expected) or None,
                                 wait=max(0.0, deadline - self._clock()
                                          - self.request_timeout),
                                 timeout=max(0.01, deadline - self._clock()))
                # Just after a broker change the job's workers may not have reached the
                # new broker yet ("not connected"): ask again while there is time.
                if reply.status is not Status.REQUEST_TIMEOUT \
                        or deadline - self._clock() < 2 * _PAUSE:
                    return reply
                gevent.sleep(_PAUSE)
        finally:
            self._runs.pop(uuid, None)
            self._per_job.pop(uuid, None)

    def jobs(self, limit: int = 1000) -> list[ClientJob]:
        """Jobs this node posted, newest first."""
        return self.store.client_jobs(limit)

    def find_job(self, text: str) -> ClientJob:
        """A posted job by UUID or unique UUID prefix; ValueError if none or several."""
        job = self.store.client_job(text)
        if job is not None:
            return job
        matches = self.store.find_client_jobs(text) if text else []
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise ValueError(f"no job {text!r} was posted from here")
        raise ValueError(f"{text!r} matches several jobs; give more of the UUID")

    def _record_result(self, uuid: str, reply: Reply, known: bool = False,
                       accepted: Optional[list[str]] = None) -> None:
        if not known and self.store.client_job(uuid) is None:
            return
        workers = reply.body.get("workers")
        if reply.status is Status.OK and isinstance(workers, dict):
            states = {w.get("state") for w in workers.values() if w.get("status") == 200}
            state = states.pop() if len(states) == 1 else "mixed"
            self.store.update_client_job(uuid, state=state or "completed", status=200,
                                         result=workers, workers=accepted)
        elif reply.status is Status.PENDING:
            self.store.update_client_job(uuid, state="running", status=300)
        elif reply.status is Status.UNKNOWN:
            self.store.update_client_job(uuid, state="unknown", status=400,
                                         reason="no worker knows the job (purged after its "
                                                "retention, deleted, or lost)")
        elif reply.status is Status.REQUEST_TIMEOUT and isinstance(workers, dict):
            errors = [f"{n}: {w.get('error') or (w.get('errors') or [''])[0]}"
                      for n, w in workers.items() if w.get("status") == 408]
            self.store.update_client_job(uuid, state="unreachable", status=408,
                                         reason="; ".join(errors)[:500])

    # --- events ---------------------------------------------------------

    def add_listener(self, callback: Callable[[JobEvent], None]) -> None:
        """Call ``callback(JobEvent)`` for every EVENT about a job (on the hub)."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[JobEvent], None]) -> None:
        """Stop calling ``callback``."""
        self._listeners.remove(callback)

    def _on_job_event(self, uuid: str, worker: str, body: dict[str, Any],
                      msg: Optional[nfp.EventCommand] = None) -> None:
        state = body.get("state")
        waiter = self._runs.get(uuid)
        if waiter is not None:
            if state in FINAL_STATES:
                waiter.finals[worker] = body
            elif state == "redispatched":
                gone, new = body.get("from"), body.get("to")
                if gone in waiter.expected and isinstance(new, str):
                    waiter.expected.discard(gone)
                    waiter.expected.add(new)
            elif state in ("lost", "orphaned"):
                waiter.finals[worker] = {"state": state, "failed": True,
                                         "errors": [str(body.get("reason", state))]}
            waiter.check()
        if uuid in self._posting and (state in FINAL_STATES or state == "lost"):
            self._posting[uuid].add(worker)
        open_job = self._open.get(uuid)
        if open_job is not None:
            if state in FINAL_STATES or state == "lost":
                open_job.workers.discard(worker)
            elif state == "redispatched" and body.get("from") in open_job.workers:
                open_job.workers.discard(body["from"])
                open_job.workers.add(str(body.get("to")))
            if not open_job.workers:
                del self._open[uuid]
        if state in ("redispatched", "lost"):
            job = self.store.client_job(uuid)
            if job is not None:
                if state == "redispatched":
                    workers = [body.get("to") if w == body.get("from") else w
                               for w in job.workers]
                    self.store.update_client_job(uuid, workers=[w for w in workers if w])
                else:
                    self.store.update_client_job(uuid, state="lost",
                                                 reason=str(body.get("reason", "")))
        tell((*self._listeners, *self._per_job.get(uuid, ())), JobEvent(uuid, worker, body),
             "job event listener")


def _new_identity() -> bytes:
    """A routing identity for a new link to a worker (never a live one's)."""
    return b"c" + os.urandom(8)
