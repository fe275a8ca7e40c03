"""An NFP worker: one service, tasks by name, one job at a time, jobs kept on disk.

How it works
------------
A ``Worker`` binds its own ROUTER (its brokerless endpoint, advertised to the
mesh in ``X-PM-NFP-WORKER``) where clients send POST / GET / DELETE directly.
When the mesh has a broker the worker also opens one DEALER to it and speaks
NFP/Worker: OPEN, (broker) OPEN, READY, then requests relayed by the broker,
and KEEPALIVE both ways every ``keepalive`` seconds when nothing else was
sent. No command from the broker for ``keepalive * multiplier`` seconds, or
a DISCONNECT, and the worker closes that socket and starts a new
conversation on a new one. That conversation is ``WorkerSession``
(``peermesh.nfp.session``), a sans-io core the worker serves with the one
driver (``peermesh.io.driver``) on its transport, whose clock every timer of
the worker reads (virtual on ``peermesh.sim``).

Requests from both sides go to the same handlers:

* **POST** - the job is written to the store and answered 202 (a UUID the
  worker already has is answered 202 again and not run twice); an unknown
  task is answered 500 and not stored. Jobs run one at a time, in arrival
  order, in the worker's executor greenlet, with an optional ``timeout``.
* **GET** - 200 with the result once finished (completed, failed or
  cancelled), 300 while pending or running, 400 for an unknown UUID. A GET
  whose body has ``"wait": seconds`` is held until the job finishes or the
  wait ends (then 300): clients use it instead of polling.
* **DELETE** - a pending job is cancelled, a running one is killed
  (``GreenletExit`` in the task) and recorded as cancelled; a finished job's
  record is removed; 400 if unknown. The reply body says which happened.
* **EVENT** - ``job.event(message, **data)`` inside a task sends progress to
  whoever posted the job (the broker relays it to the client). When a job
  finishes an EVENT with its final ``state`` follows; if the POST asked with
  ``"notify": true`` that EVENT carries the result too.

Every answer and EVENT goes out through ``store.after_commit``: nothing is
acknowledged before what it says is committed (the store's durability
rule). A job that finishes before the hub is idle is accepted and finished
in one commit; otherwise the 202 is committed and sent before the task runs.
**A result rides on the 202**: when a ``notify`` job finished before its 202
left, the 202 carries its final ``state`` and result (the final EVENT's
fields) and no final EVENT follows - one message instead of two on every
hop back to the client, which takes it as that EVENT. A result over
``FINAL_IN_ACCEPT`` characters of JSON still follows in the EVENT (a broker
re-encodes what a 202 carries; it relays an EVENT as it is).
The executor commits as soon as its queue is empty and no request waits on
the socket the last one came through (it would have joined the commit),
rather than at the hub's next idle moment: one loop iteration less per job.

On start, jobs the store holds as accepted but unfinished (the worker was
killed) are queued again: workers are idempotent, per the spec.

Tasks are plain functions ``fn(job, *args, **kwargs)`` returning something
JSON can encode; they run on the hub, so a task that blocks without yielding
to gevent stalls the worker (and its heartbeats): use ``job.run_blocking``.
For concurrency run several workers of the same service (several ``Worker``
objects in one node, or several nodes): a worker is strictly sequential.

This module is the ``Worker`` overlay alone (about 800 lines: its request
handlers, executor and management share one job table); what stands apart
lives beside it: the broker conversation (``session.py``), tasks and jobs
(``tasks.py``), the bound on stored octets (``quota.py``).

Kept whole: one overlay (``Worker``), as the paragraph above says.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from typing import Any, Callable, ClassVar, Iterable, Mapping, Optional

import gevent
import gevent.event
import zmq

from ..errors import ProtocolError
from ..counters import Counters
from ..overlay import Overlay
from ..wire import nfp
from ..wire.nfp import Status
from .dispatch import WORKER_MMI
from .grants import Grants, may_use_job
from .services import authorise, later
from .store import CANCELLED, COMPLETED, FAILED, PENDING, RUNNING, JobStore
from .quota import Quota
from .tasks import Interrupt, Job, JobCancelled, JobContext, Tasks, TaskFunction
from ..io import shared_context
from ..io.curve import Curve
from ..io.zap import Allowlist
from .session import BROKER_LINK, DirectDoor, WorkerSession
from ..core import Send
from ..io.connections import GuardedListener
from ..io.driver import Driver
from ..io.transport import Transport, ZmqTransport
from ..wire.nfp import MAX_MESSAGE

__all__ = ["Worker", "Tasks", "TaskFunction", "JobContext", "JobCancelled", "advertised"]

log = logging.getLogger(__name__)

#: longest result (JSON characters) a 202 carries (a longer one follows in the final EVENT)
FINAL_IN_ACCEPT = 64 * 1024
#: direct clients a worker remembers by default (the least recently heard go first)
MAX_CLIENTS = 1024
#: octets of POST bodies a worker keeps in its store by default (until the retention
#: purges finished jobs); a POST past it is answered 500 and not stored
MAX_STORED = 1024 * 1024 * 1024
#: octets of POST bodies one client key may keep in a worker's store by default (a mesh
#: with keys); a POST past it is answered 500 and not stored
MAX_STORED_PER_CLIENT = 128 * 1024 * 1024
_FROM_BROKER = ("broker",)   # the origin of a request that came through the broker
_REVOKED = "the caller's key is no longer allowed"
_STOPPED_TWICE = ("the worker's process ended twice while this job ran (it ran again after "
                  "the first time); not run a third time: does the task end its process?")


class Worker(Overlay):
    """One worker of one service, an overlay of its node (create and attach it before the
    node starts: it binds at once and its endpoint goes in the node's HELLO).

    Bounds on what clients can grow: ``max_clients`` (direct clients remembered for
    ``show_clients``; the least recently heard is forgotten), ``max_stored`` (octets
    of POST bodies held in the store until the retention purges them; a POST past it
    is answered 500 and not stored) and, on a mesh with keys, ``max_stored_per_client``
    (the same, per caller key). Refusals are counted in ``limits``.
    """

    roles: ClassVar[tuple[str, ...]] = ("nfp-worker",)

    def __init__(self, service: str, name: str, tasks: Tasks | Mapping[str, TaskFunction],
                 store: JobStore, *, address: str = "127.0.0.1",
                 context: Optional[zmq.Context] = None, keepalive: float = 1.0,
                 multiplier: int = 3, admin_token: Optional[str] = None,
                 node_name: str = "", on_shutdown: Optional[Callable[["Worker"], None]] = None,
                 internal: bool = False, max_clients: int = MAX_CLIENTS,
                 max_stored: int = MAX_STORED, curve: Optional[Curve] = None,
                 keys: Mapping[str, str] = {}, admin_keys: Optional[Allowlist] = None,
                 grants: Optional[Grants] = None,
                 max_stored_per_client: int = MAX_STORED_PER_CLIENT,
                 transport: Optional[Transport] = None) -> None:
        super().__init__()
        nfp.format_target((name,))  # a name that can be targeted
        if not service or not service.isprintable() or service == WORKER_MMI:
            raise ValueError(f"{service!r} cannot be a worker's service")
        self.service = service
        self.name = name
        self.tasks = tasks if isinstance(tasks, Tasks) else Tasks(tasks)
        self.store = store
        self.admin_token = admin_token
        #: with keys: the public keys allowed the destructive MMI calls (instead of the token)
        self.admin_keys = admin_keys
        #: with keys: the tasks each key may POST (see ``peermesh.nfp.grants``)
        self.grants = grants
        self.node_name = node_name
        self.on_shutdown = on_shutdown
        self.internal = internal
        self._context = context or shared_context()
        #: the node's CURVE keys, and the key of each endpoint's node
        self._curve, self._keys = curve, keys
        #: how the broker link is made and the clock every timer of the worker runs on
        self.transport: Transport = transport if transport is not None else ZmqTransport(
            self._context, curve)
        self._clock = self.transport.now
        self._driver: Optional[Driver] = None
        #: the direct clients' mailbox (none when internal), guarded once started
        self._mailbox: Any = (None if internal else
                              self.transport.bind_mailbox(address, MAX_MESSAGE,
                                                          heartbeat=False))
        self.endpoint: str = self._mailbox.endpoint if self._mailbox is not None else ""
        self._direct: Optional[Driver] = None          # serves ``_door`` on ``_mailbox``
        self._listener: Any = None                      # ``_mailbox`` under the policy
        self._last_source: Any = None   # the socket the last request came through
        self.broker_endpoint: Optional[str] = None
        self._queue: deque[Job] = deque()
        self._jobs: dict[str, Job] = {}
        self._running: Optional[Job] = None
        self._wake = gevent.event.Event()
        self._greenlets: list[gevent.Greenlet] = []
        if not max_clients >= 1:
            raise ValueError("max_clients must be at least 1")
        #: octets of job bodies held, against ``max_stored`` and ``max_stored_per_client``
        self.quota = Quota(max_stored, max_stored_per_client,
                           lambda: store.worker_bytes(name),
                           (lambda: store.worker_bytes_by_caller(name)) if curve is not None
                           else None)
        self.max_clients = max_clients
        self.max_stored = max_stored
        self.max_stored_per_client = max_stored_per_client
        #: refusals by limit: ``max_clients`` (clients forgotten), ``max_stored`` and
        #: ``max_stored_per_client`` (POSTs), ``max_target`` (requests whose target is over
        #: MAX_TARGET, dropped)
        self.limits = Counters(log, "NFP worker hit its limits")
        self.stats = {"accepted": 0, "completed": 0, "failed": 0, "cancelled": 0,
                      "recovered": 0, "broker_connects": 0, "not_granted": 0, "not_owner": 0}
        self._mmi_tasks: Optional[dict[str, TaskFunction]] = None
        #: the conversation with the broker (sans-io), served by ``_driver`` while running
        self._session = WorkerSession(name, service, node_name, keepalive=keepalive,
                                      multiplier=multiplier, new_identity=_new_identity,
                                      keys=keys if curve is not None else None,
                                      stats=self.stats)
        #: the direct clients' door (sans-io): requests, OPEN, the clients remembered
        self._door = DirectDoor(name, service, max_clients, self.limits)

    # --- life cycle -----------------------------------------------------

    def on_start(self) -> None:
        """Start serving (on the node's hub); re-queue jobs left unfinished by a crash."""
        if self._mailbox is not None:
            listener = self.transport.guard(self._mailbox, self.limits,
                                            on_revoked=self._revoked)
            self._listener = listener
            self._direct = Driver(self._door, self.transport, on_deliver=self._from_client,
                                  name=f"worker {self.name}")
            self._direct.listen(listener, "User-Id" if self._curve is not None else None)
        for stored in self.store.unfinished_worker_jobs(self.name):
            if stored.state == RUNNING:
                # run again once already, and the process died again while it ran: it may
                # be what ends the process (os._exit, a crash in C), so not a third time
                self.store.finish_worker_job(self.name, stored.uuid, FAILED, {
                    "failed": True, "errors": [_STOPPED_TWICE]})
                self.stats[FAILED] = self.stats.get(FAILED, 0) + 1
                continue
            body = stored.body
            job = Job(stored.uuid, stored.service, stored.task, list(body.get("args") or []),
                       dict(body.get("kwargs") or {}), _timeout(body), False, _FROM_BROKER,
                       recovered=True,   # with keys, the key it came with is stored too
                       caller=_key(body.get("caller")) if self._curve is not None else None)
            self._jobs[job.uuid] = job
            self._queue.append(job)
            self.stats["recovered"] += 1
        if self._queue:
            log.info("worker %s: %d unfinished job(s) from before a restart queued again",
                     self.name, len(self._queue))
        self._driver = Driver(self._session, self.transport, on_deliver=self._from_broker,
                              max_message=MAX_MESSAGE, name=f"worker {self.name} -> broker")
        self._greenlets = [gevent.spawn(self._executor)]
        if self.broker_endpoint is not None:
            self._driver.apply(self._session.connect(self.broker_endpoint, self._clock()))

    def on_stop(self, timeout: float) -> None:
        """Disconnect from the broker, stop running jobs (they stay queued on disk), close."""
        running = self._running
        if running is not None and running.recovered:
            # a clean stop is not a crash: it runs again next time as if never started
            self.store.set_worker_state(self.name, running.uuid, PENDING)
        self.store.commit()     # answers waiting for the commit leave before the sockets close
        driver, self._driver = self._driver, None
        if driver is not None:
            driver.apply(self._session.stop(self._clock()))
            driver.close()
        gevent.killall(self._greenlets, block=False)   # a running job stays unfinished on disk
        listener, self._listener = self._listener, None
        if isinstance(listener, GuardedListener):
            listener.stop()   # (its monitor before the socket; the driver closes a plain one)
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    @property
    def load(self) -> int:
        """Jobs queued or running."""
        return len(self._queue) + (1 if self._running is not None else 0)

    # --- broker link ----------------------------------------------------

    @property
    def keepalive(self) -> float:
        """Seconds between KEEPALIVEs (the broker's, once it said OPEN)."""
        return self._session.keepalive

    @property
    def multiplier(self) -> int:
        """KEEPALIVE periods of silence after which the broker is given up."""
        return self._session.multiplier

    def connect_broker(self, endpoint: Optional[str]) -> None:
        """Talk to the broker at ``endpoint`` (None: no broker; serve clients directly)."""
        self.broker_endpoint = endpoint
        if self._driver is not None:
            self._driver.apply(self._session.connect(endpoint, self._clock()))

    def _from_broker(self, msg: nfp.Post | nfp.Get | nfp.Delete) -> None:
        """A request the session delivered (the broker relayed it)."""
        driver = self._driver
        self._last_source = driver.links.get(BROKER_LINK) if driver is not None else None
        self._on_request(msg, _FROM_BROKER)

    def _send_broker(self, frames: list[bytes], ready_only: bool) -> None:
        if self._driver is not None:
            self._driver.apply(self._session.send(frames, ready_only, self._clock()))

    # --- clients that talk to the worker directly -----------------------

    def _from_client(self, request: tuple[bytes, Optional[str], Any]) -> None:
        """A request the door delivered: (identity, the key it came with, the message)."""
        identity, key, msg = request
        self._last_source = self._listener
        self._on_request(msg, ("direct", identity, key))

    def _send_to_origin(self, origin: tuple[Any, ...], frames: list[bytes],
                        ready_only: bool) -> None:
        if origin[0] == "direct":
            if self._direct is not None:
                self._direct.apply((Send(origin[1], frames),))
        else:
            self._send_broker(frames, ready_only)

    # --- requests -------------------------------------------------------

    def _on_request(self, msg: nfp.Post | nfp.Get | nfp.Delete, origin: tuple[Any, ...]) -> None:
        try:
            body = nfp.decode_body(msg.body[0])
        except ProtocolError as exc:
            self._respond(origin, msg, Status.ERROR, {"error": f"invalid body: {exc.reason}"})
            return
        rid = body.get("rid")
        if origin[0] == "direct":  # the caller's own key; through a broker, the broker's word
            body["caller"] = origin[2]
        if msg.service != self.service and msg.service != WORKER_MMI:
            error = f"worker {self.name} serves {self.service}, not {msg.service}"
            self._respond(origin, msg, Status.ERROR, {"error": error}, rid)
            return
        if not isinstance(msg, nfp.Post) and not self._may_use(msg.uuid, body.get("caller")):
            self._refuse_other_key(origin, msg, rid)
            return
        if isinstance(msg, nfp.Post):
            self._on_post(msg, body, origin, rid)
        elif isinstance(msg, nfp.Get):
            self._on_get(msg, body, origin, rid)
        else:
            self._on_delete(msg, origin, rid)

    def _may_use(self, uuid: str, caller: Any) -> bool:
        """Whether key ``caller`` may GET or DELETE (or POST again) job ``uuid``: always
        without keys; with keys, the key it was posted with, an admin key or one granted
        ``all_jobs`` (see ``peermesh.nfp.grants``)."""
        if self._curve is None:
            return True
        job = self._jobs.get(uuid)
        if job is not None:
            owner = job.caller
        else:
            record = self.store.worker_job(self.name, uuid)
            owner = _key(record.body.get("caller")) if record is not None else None
        return self._owner_allows(owner, _key(caller))

    def _owner_allows(self, owner: Optional[str], caller: Optional[str]) -> bool:
        if self._curve is None:
            return True
        admin = self.admin_keys
        return may_use_job(owner, caller, admin.keys if admin is not None else None,
                           self.grants)

    def _refuse_other_key(self, origin: tuple[Any, ...], msg: Any, rid: Any) -> None:
        self.stats["not_owner"] += 1
        self._respond(origin, msg, Status.ERROR, {
            "error": f"job {msg.uuid} was posted by another key"}, rid)

    def _respond(self, origin: Optional[tuple[Any, ...]], msg: Any, status: Status,
                 body: dict[str, Any], rid: Any = None) -> None:
        """Answer a request, once what the store holds about it is committed."""
        if origin is not None:
            self.store.after_commit(self._send_to_origin, origin, nfp.response_frames(
                nfp.WORKER, msg.service, msg.uuid, status,
                (nfp.encode_body(self._answer_head(body, rid)),)), False)

    def _answer_head(self, body: dict[str, Any], rid: Any) -> dict[str, Any]:
        """An answer's body: who answers, its load, ``body``, and the request's rid."""
        out = {"worker": self.name, "load": self.load, **body}
        if rid is not None:
            out["rid"] = rid
        return out

    def _on_post(self, msg: nfp.Post, body: dict[str, Any], origin: tuple[Any, ...],
                 rid: Any) -> None:
        task = body.get("task")
        args = body.get("args", [])
        kwargs = body.get("kwargs", {})
        if not isinstance(task, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            self._respond(origin, msg, Status.ERROR,
                          {"error": "POST body needs task (string), args (list), kwargs (object)"},
                          rid)
            return
        mmi = msg.service == WORKER_MMI
        if mmi:
            known = task in self.mmi_tasks()
        else:
            known = task in self.tasks
        if not known:
            self._respond(origin, msg, Status.ERROR,
                          {"error": f"worker {self.name} has no task {task!r}"}, rid)
            return
        caller = _key(body.get("caller"))
        if self.grants is not None and not self.grants.allows_task(caller, msg.service, task):
            self.stats["not_granted"] += 1
            self._respond(origin, msg, Status.ERROR, {
                "error": f"{msg.service}/{task} is not granted to the caller's key"}, rid)
            return
        existing = self._jobs.get(msg.uuid)
        raw = msg.body[0]
        text, size = raw.decode("utf-8"), len(raw)
        client = caller if self._curve is not None else None   # a key the worker trusts
        if client is not None and origin[0] == "direct":
            text = nfp.to_json(body)   # the caller's key is stored with the job
            size = len(text.encode("utf-8"))
        over = self.quota.over(size, client, self._clock()) \
            if existing is None and not mmi else None
        if over is not None and self.store.worker_job(self.name, msg.uuid) is None:
            held, limit = self.quota.held(over, client)
            whose = "" if over == "max_stored" else " for this client's key"
            self.limits.over(over, f"worker {self.name} refused a POST of {size:,} octets: "
                             f"{held:,} of {limit:,} stored{whose}")
            self._respond(origin, msg, Status.ERROR, {
                "error": f"worker {self.name} holds {held:,} octets of jobs{whose}, its limit "
                         f"is {limit:,} ({over}): try later"}, rid)
            return
        if existing is None and not self.store.add_worker_job(
                self.name, msg.uuid, msg.service, task, body, text):
            record = self.store.worker_job(self.name, msg.uuid)
            if record is not None and not self._owner_allows(_key(record.body.get("caller")),
                                                             client):
                self._refuse_other_key(origin, msg, rid)
                return
            state = record.state if record is not None else "unknown"
            self._respond(origin, msg, Status.ACCEPTED, {"state": state, "duplicate": True}, rid)
            return
        if existing is not None:
            if not self._owner_allows(existing.caller, client):  # its events are not theirs
                self._refuse_other_key(origin, msg, rid)
                return
            # posted again (e.g. re-POSTed after a broker change): the final EVENT goes to
            # whoever asked last
            existing.origin = origin
            existing.acknowledged = True     # (so its result cannot ride on the first 202)
            existing.notify = existing.notify or bool(body.get("notify"))
            self._respond(origin, msg, Status.ACCEPTED,
                          {"state": existing.state, "duplicate": True}, rid)
            return
        job = Job(msg.uuid, msg.service, task, args, kwargs, _timeout(body),
                   bool(body.get("notify")), origin)
        job.caller = caller
        if not mmi:
            self.quota.add(size, client)
        self._jobs[job.uuid] = job
        self.stats["accepted"] += 1
        if mmi:
            self._respond(origin, msg, Status.ACCEPTED, {"state": PENDING}, rid)
            gevent.spawn(self._run, job)   # management answers at once, beside any job
            return
        self._queue.append(job)
        # the 202 leaves once the job is committed; a job that finishes before then is
        # committed with its result, which the 202 carries (see _accept)
        job.acknowledged = False
        self.store.after_commit(self._accept, job, origin, rid)
        if not self._wake.is_set():
            self._wake.set()

    def _accept(self, job: Job, origin: tuple[Any, ...], rid: Any) -> None:
        """Send a new job's 202, its final state and result too if it finished already."""
        job.acknowledged = True
        text = nfp.to_json(self._answer_head(
            {"state": PENDING if job.final is None else job.state}, rid))
        if job.final is not None:
            text = _merged(text, job.final)
        self._send_to_origin(origin, nfp.response_frames(
            nfp.WORKER, job.service, job.uuid, Status.ACCEPTED, (text.encode("utf-8"),)), False)

    def _on_get(self, msg: nfp.Get, body: dict[str, Any], origin: tuple[Any, ...],
                rid: Any) -> None:
        job = self._jobs.get(msg.uuid)
        if job is None:
            self._answer_finished(msg, origin, rid)
            return
        wait = body.get("wait")
        if isinstance(wait, (int, float)) and wait > 0:
            state = {"answered": False}

            def answer() -> None:
                if state["answered"]:
                    return
                state["answered"] = True
                timer.stop()
                timer.close()
                live = self._jobs.get(msg.uuid)
                if live is None:
                    self._answer_finished(msg, origin, rid)
                else:
                    self._respond(origin, msg, Status.PENDING, {"state": live.state}, rid)
            timer = gevent.get_hub().loop.timer(min(float(wait), 3600.0))
            timer.start(answer, update=True)
            job.waiters.append(answer)
            return
        self._respond(origin, msg, Status.PENDING, {"state": job.state}, rid)

    def _answer_finished(self, msg: Any, origin: Optional[tuple[Any, ...]], rid: Any) -> None:
        record = self.store.worker_job(self.name, msg.uuid)
        if record is None:
            self._respond(origin, msg, Status.UNKNOWN, {"error": f"no job {msg.uuid}"}, rid)
        elif record.finished is None:
            self._respond(origin, msg, Status.PENDING, {"state": record.state}, rid)
        else:
            self._respond(origin, msg, Status.OK, {"state": record.state, "task": record.task,
                                                   **(record.result or {})}, rid)

    def _on_delete(self, msg: nfp.Delete, origin: tuple[Any, ...], rid: Any) -> None:
        job = self._jobs.get(msg.uuid)
        if job is not None:
            was = job.state
            job.cancelled = True
            if was == PENDING:
                try:
                    self._queue.remove(job)
                except ValueError:
                    pass
                self._finish(job, CANCELLED, {"failed": True,
                                              "errors": ["cancelled before it started"]})
            elif job.greenlet is not None:
                self._cancel_running(job)
            self._respond(origin, msg, Status.OK, {"outcome": "cancelled", "was": was}, rid)
            return
        record = self.store.worker_job(self.name, msg.uuid)
        if record is None:
            self._respond(origin, msg, Status.UNKNOWN, {"error": f"no job {msg.uuid}"}, rid)
            return
        self.store.delete_worker_job(self.name, msg.uuid)
        self._respond(origin, msg, Status.OK, {"outcome": "deleted", "was": record.state}, rid)

    # --- running jobs ---------------------------------------------------

    def _executor(self) -> None:
        queue = self._queue
        store = self.store
        while True:
            while not queue:
                if store.pending and not self._unread():
                    # the last job is done and no request waits to be read: commit now, so
                    # its answers leave without waiting for the hub's next idle moment
                    store.commit()
                    continue
                self._wake.clear()
                self._wake.wait()
            job = queue.popleft()
            if job.state != PENDING:
                continue
            self._run(job)

    def _run(self, job: Job) -> None:
        """Run ``job`` in the current greenlet (the executor's, or an MMI job's own)."""
        mmi = job.service == WORKER_MMI
        if mmi:
            fn = self.mmi_tasks().get(job.task)
        else:
            fn = self.tasks.get(job.task)
            self._running = job
        job.state = RUNNING
        job.greenlet = gevent.getcurrent()
        if job.recovered:
            # on disk before it runs: if the process dies in it again, start() fails it
            self.store.set_worker_state(self.name, job.uuid, RUNNING)
            self.store.commit()
        if not job.notify and self.store.pending:
            # the 202 (and anything else waiting) leaves before a task that may take long;
            # a job posted by ``run`` (notify) waits for the hub's next idle moment, so a
            # quick one is accepted and finished in one commit
            self.store.commit()
        clock = self._clock
        started = clock()
        timeout = gevent.Timeout(job.timeout, Interrupt("timeout")) if job.timeout else None
        try:
            if fn is None:
                self._finish(job, FAILED, {"failed": True,
                                           "errors": [f"no task {job.task!r} any more"]})
                return
            try:
                if timeout is not None:
                    timeout.start()
                value = fn(JobContext(self, job), *job.args, **job.kwargs)
            except Interrupt:
                duration = round(clock() - started, 6)
                if job.revoked:
                    self._finish(job, FAILED, {"failed": True, "duration": duration,
                                               "errors": [_REVOKED]})
                elif job.cancelled:
                    self._finish(job, CANCELLED, {"failed": True, "duration": duration,
                                                  "errors": ["cancelled while running"]})
                else:
                    self._finish(job, FAILED, {"failed": True, "duration": duration,
                                               "errors": [f"timed out after {job.timeout:g}s"]})
                return
            except JobCancelled:
                self._finish(job, CANCELLED, {"failed": True,
                                              "duration": round(clock() - started, 6),
                                              "errors": ["cancelled while running"]})
                return
            except gevent.GreenletExit:
                raise   # the worker is stopping
            except BaseException as exc:   # also SystemExit, KeyboardInterrupt or a gevent
                # Timeout of the task's own: the job failed, the worker goes on serving
                self._finish(job, FAILED, {"failed": True,
                                           "duration": round(clock() - started, 6),
                                           "errors": [f"{type(exc).__name__}: {exc}"]})
                return
            finally:
                if timeout is not None:
                    timeout.close()
            duration = round(clock() - started, 6)
            if job.cancelled:
                self._finish(job, CANCELLED, {"failed": True, "duration": duration,
                                              "errors": ["cancelled while running"]})
                return
            result = {"result": value, "failed": False, "errors": [], "duration": duration}
            try:
                self._finish(job, COMPLETED, result)
            except (TypeError, ValueError) as exc:   # not JSON, or too large
                job.state = RUNNING
                self._finish(job, FAILED, {"failed": True, "duration": duration,
                                           "errors": [str(exc)]})
        finally:
            job.greenlet = None
            if self._running is job:
                self._running = None

    def _unread(self) -> bool:
        """True if a request waits on the socket the last one came through (it would join
        the next commit; one on the other socket only costs a commit of its own)."""
        source = self._last_source
        readable = getattr(source, "readable", None)   # (a simulated link: never waits)
        return readable is not None and not source.closed and readable()

    def _revoked(self, keys: frozenset[str]) -> None:
        """The allowlist changed: the jobs of keys it no longer holds fail, queued or
        running (``keys``: those whose connections were closed here)."""
        allowed = self._curve.allowlist.keys if self._curve is not None else None
        for job in [j for j in self._jobs.values() if j.caller is not None and (
                j.caller in keys or (allowed is not None and j.caller.encode() not in allowed))]:
            job.revoked = job.cancelled = True
            if job.state == PENDING:
                try:
                    self._queue.remove(job)
                except ValueError:
                    pass
                self._finish(job, FAILED, {"failed": True, "errors": [_REVOKED]})
            elif job.greenlet is not None:
                self._cancel_running(job)

    def _cancel_running(self, job: Job) -> None:
        """Interrupt a running job at its next switch (DELETE)."""
        gevent.get_hub().loop.run_callback(self._interrupt, job)

    @staticmethod
    def _interrupt(job: Job) -> None:
        greenlet = job.greenlet
        if job.state == RUNNING and greenlet is not None and not greenlet.dead:
            greenlet.throw(Interrupt("cancelled"))

    def _finish(self, job: Job, state: str, result: dict[str, Any]) -> None:
        if job.state in (COMPLETED, FAILED, CANCELLED):
            return
        try:
            text = nfp.to_json(result)
        except (TypeError, ValueError) as exc:   # not JSON
            raise TypeError(f"the result cannot be sent: {exc}") from None
        nfp.check_size(text, "the result")
        job.state = state
        self.store.finish_worker_job(self.name, job.uuid, state, result, text)
        self._jobs.pop(job.uuid, None)
        self.stats[state] = self.stats.get(state, 0) + 1
        if not job.acknowledged and job.notify and len(text) <= FINAL_IN_ACCEPT:
            job.final = text    # its 202 has not left yet: the result goes with it
        else:
            self._send_final_event(job, state, text)
        waiters, job.waiters = job.waiters, []
        for answer in waiters:
            try:
                answer()
            except Exception:
                log.exception("worker %s: answering a held GET of %s failed", self.name,
                              job.uuid)

    def _send_final_event(self, job: Job, state: str, text: str) -> None:
        load = self.load - (1 if self._running is job else 0)
        head = nfp.to_json({"worker": self.name, "state": state, "load": load})
        # the final EVENT: its head, plus the result fields when the POST asked for them
        body = _merged(head, text) if job.notify else head
        self._send_event_frame(job, body.encode("utf-8"))

    def _send_event(self, job: Job, body: dict[str, Any]) -> None:
        text = nfp.to_json({"worker": self.name, **body})
        nfp.check_size(text, "the event")
        self._send_event_frame(job, text.encode("utf-8"))

    def _send_event_frame(self, job: Job, frame: bytes) -> None:
        frames = nfp.event_frames(nfp.WORKER, job.service, job.uuid, Status.OK, (frame,))
        origin = job.origin if job.origin is not None else _FROM_BROKER
        self.store.after_commit(self._send_to_origin, origin, frames, True)

    # --- management -----------------------------------------------------

    def metrics(self) -> Any:
        """``Overlay.metrics`` plus jobs by state in the store, the queue and the load."""
        yield from super().metrics()
        labels = {"worker": self.name, "service": self.service}
        for state, count in self.store.count_worker_jobs(self.name).items():
            yield "nfp_jobs", {**labels, "state": state}, count
        yield "nfp_queued_jobs", labels, len(self._queue)
        yield "nfp_worker_load", labels, self.load

    def info(self) -> dict[str, Any]:
        """What MMI's show_workers reports about this worker."""
        return {"name": self.name, "service": self.service, "node": self.node_name,
                "endpoint": self.endpoint, "tasks": self.tasks.names(), "load": self.load,
                "running": self._running.uuid if self._running else None,
                "queued": len(self._queue), "broker": self.broker_endpoint,
                "broker_state": self._session.state,
                "stats": dict(self.stats),
                "limits": dict(self.limits.snapshot()),
                "jobs": self.store.count_worker_jobs(self.name)}

    def broker_info(self) -> dict[str, Any]:
        """The broker this worker talks to."""
        session = self._session
        return {"endpoint": self.broker_endpoint, "state": session.state,
                "connected_for": round(self._clock() - session.since, 3)
                if session.linked else None,
                "keepalive": self.keepalive, "multiplier": self.multiplier}

    def clients_info(self) -> dict[str, Any]:
        """Clients that talked to this worker directly (brokerless)."""
        now = self._clock()
        clients = self._door.clients
        return {"direct_clients": len(clients),
                "last_seconds_ago": round(min((now - t for t in clients.values()),
                                              default=0.0), 3)}

    def reconnect(self) -> None:
        """Drop the broker conversation and start a new one (MMI disconnect/restart)."""
        if self._driver is not None and self.broker_endpoint is not None:
            self._driver.apply(self._session.reconnect("asked by MMI", self._clock()))

    def mmi_tasks(self) -> dict[str, TaskFunction]:
        """The ``mmi.service.worker`` tasks: show_broker, show_workers, show_clients; and
        disconnect, restart and shutdown for callers with the admin token."""
        if self._mmi_tasks is not None:
            return self._mmi_tasks

        def show_broker(job: Any) -> dict[str, Any]:
            return self.broker_info()

        def show_workers(job: Any) -> list[dict[str, Any]]:
            return [self.info()]

        def show_clients(job: Any) -> dict[str, Any]:
            return self.clients_info()

        def disconnect(job: Any, token: Any = None) -> str:
            self.authorise(job, token, "disconnect")
            later(self.reconnect)
            return f"worker {self.name} will reconnect to its broker"

        def restart(job: Any, token: Any = None) -> str:
            self.authorise(job, token, "restart")
            later(self.reconnect)
            return f"worker {self.name} restarts its broker conversation"

        def shutdown(job: Any, token: Any = None) -> str:
            self.authorise(job, token, "shutdown")
            later(self._shut_down)
            return f"worker {self.name} is shutting down"

        self._mmi_tasks = {f.__name__: f for f in (show_broker, show_workers, show_clients,
                                                   disconnect, restart, shutdown)}
        return self._mmi_tasks

    def authorise(self, job: Any, token: Any, what: str) -> None:
        """NotAuthorised unless the caller may ``what``: its key is an admin key (with
        ``admin_keys``), else ``token`` is the admin token."""
        admin = self.admin_keys
        authorise(self.admin_token, token, what, admin.keys if admin is not None else None,
                  job.caller)

    def _shut_down(self) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown(self)
        else:
            self.stop()

    def __repr__(self) -> str:
        return f"<Worker {self.name} ({self.service}) {self.endpoint}>"


def _merged(head: str, fields: str) -> str:
    """JSON object text ``head`` with the members of JSON object text ``fields`` added."""
    return head[:-1] + "," + fields[1:] if len(fields) > 2 else head


def _key(value: Any) -> Optional[str]:
    """A request's ``caller`` (the key it came with), or None."""
    return value if isinstance(value, str) else None


def _timeout(body: Mapping[str, Any]) -> Optional[float]:
    value = body.get("timeout")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def advertised(workers: Iterable[Worker]) -> str:
    """The ``X-PM-NFP-WORKER`` header value for ``workers``."""
    return json.dumps([{"service": w.service, "name": w.name, "endpoint": w.endpoint}
                       for w in workers if not w.internal], separators=(",", ":"))


def _new_identity() -> bytes:
    """A routing identity for a new conversation with the broker (never a live one's)."""
    return b"w" + os.urandom(8)
