"""Safir-Darbaan calls from executors off the mesh, through the driver's MTL gateway.

11/MTL has no request/reply of its own; calls ride on its content and
leases as follows (``mesh`` profile, both leases ``confirm: full``, one MTL
client per worker process)::

    executor                                     driver (gateway + channel)
    Reader, Summon "peermesh.spark.calls/Q"      Q: the client's private reply queue
    Writer -> Content to "peermesh.spark.calls"  body: the payload (msgpack)
      properties {id, service, action, reply-to: "peermesh.spark.calls/Q",
                  version?, category?, timeout?, retries?}
                                   <- Confirm    the relay took the request
                                                 the driver's channel calls the service
    Content on Q <-                              body: the reply (msgpack), properties
                                                   {id, status, error?}

* **Who may call**: the gateway's user (``spark-executors``), whose grants
  are write on ``peermesh.spark.calls`` and read on ``peermesh.spark.calls/*``;
  only the services ``start_service(..., gateway_services=...)`` names (None:
  every service on the mesh).
* **Reply queues** are served by the gateway itself (``Gateway(local=...)``):
  never joined, left or shouted into on the mesh. A reply goes only to the
  reader link that summoned the queue the request names, and only if that
  link is of the same user; a request naming a queue nobody of its user
  summoned, or with malformed properties, is rejected (``Reject``).
* **Bounds**: ``MAX_PER_CLIENT`` calls in flight per reply queue, ``MAX_CALLS``
  in all; a request beyond them is answered at once with status 429 (503).
  A request is at most the gateway's ``max_content`` (16 MiB). The client
  itself keeps at most ``max_in_flight`` requests without their reply.
* **Outcomes**: a reply's ``status`` and ``error`` are those of
  ``requests.Outcome`` on the mesh (200; 404 no server; 409 ... from the
  handler; None with ``RequestTimeout: ...`` for a timeout), so
  ``ServiceCaller`` columns are the same whichever way a call went. A reply
  that does not come within the request's timeout plus ``GRACE`` seconds (the
  gateway or the link went) is a timeout too.
* **Delivery**: a request is confirmed as soon as the relay took it; a writer
  sends again only what was not confirmed when its link broke, and the relay
  ignores a copy of a call it still runs (same queue and id). A reply lost
  with its link is a timeout for the client.
* **Idle workers**: nobody answers the gateway's heartbeats while a worker
  runs no task, so the gateway unbinds its links and forgets its queue; a
  worker idle for a heartbeat opens a new session and summons its queue
  again before its next calls.

``CallRelay`` is the driver's sans-io core, ``submit`` hands its calls to
the driver's ``ThreadedChannel`` on the node's hub, ``GatewayCalls`` is the
executors' side.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence

from ..counters import Counters
from ..wire.mtl import Confirm, Reject, content_frames, encode_data, encode_string, encode_table
from .errors import MeshWriteError
from .requests import GatewaySettings, Outcome, outcome_of

if TYPE_CHECKING:
    from ..mtl.dataflow import LeaseLink
    from ..wire.mtl import Content

__all__ = ["CALLS", "REPLIES", "MAX_PER_CLIENT", "MAX_CALLS", "GRACE", "Call", "CallRelay",
           "GatewayCalls", "is_local", "submit"]

log = logging.getLogger(__name__)

#: the resource executors send requests to
CALLS = "peermesh.spark.calls"
#: the prefix of each client's reply queue (CALLS + "/" + a random name)
REPLIES = CALLS + "/"
#: calls in flight per reply queue (client), and in all
MAX_PER_CLIENT = 1024
MAX_CALLS = 16384
#: seconds a client waits beyond a request's timeout before it counts it timed out
GRACE = 5.0
#: a channel's default request timeout (``sada.Channel``)
DEFAULT_TIMEOUT = 5.0
_MAX_TIMEOUT = 24 * 3600.0
_MAX_RETRIES = 16
_TEXT_FIELDS = ("service", "action", "reply-to")


def is_local(group: str) -> bool:
    """True for the resources the relay serves (requests and reply queues)."""
    return group == CALLS or group.startswith(REPLIES)


@dataclass(frozen=True, slots=True)
class Call:
    """One request the relay took, to be made on the mesh."""

    reply_to: str
    id: int
    service: str
    action: str
    body: bytes
    version: Optional[str] = None
    category: str = ""
    timeout: Optional[float] = None
    retries: int = 0


def _parse(properties: Any, body: bytes) -> Optional[Call]:
    """A request's properties as a ``Call``; None if malformed."""
    if not isinstance(properties, dict):
        return None
    p = properties
    cid, version, category = p.get("id"), p.get("version"), p.get("category", "")
    timeout, retries = p.get("timeout"), p.get("retries", 0)
    if not all(isinstance(p.get(k), str) and p.get(k) for k in _TEXT_FIELDS) \
            or type(cid) is not int or not 0 <= cid < 2 ** 63 \
            or not (version is None or isinstance(version, str)) \
            or not isinstance(category, str) \
            or not (timeout is None or (type(timeout) in (int, float)
                                        and 0 < timeout <= _MAX_TIMEOUT)) \
            or type(retries) is not int or not 0 <= retries <= _MAX_RETRIES:
        return None
    return Call(p["reply-to"], cid, p["service"], p["action"], body, version, category,
                None if timeout is None else float(timeout), retries)


class CallRelay:
    """The driver's side of calls through the gateway, sans-io (see the module doc).

    ``request`` takes a request from a writer link and says what to send at
    once (its Confirm or Reject, an error reply) and which call to make;
    ``answered`` turns a call's ``Outcome`` into the reply to send. The
    reply queues are what ``summoned`` was told, until ``gone``.
    """

    def __init__(self, user: str, services: Optional[Iterable[str]] = None, *,
                 per_client: int = MAX_PER_CLIENT, total: int = MAX_CALLS) -> None:
        """``services``: the services executors may call (None: any)."""
        self.user = user
        self.services = None if services is None else frozenset(services)
        self.per_client = per_client
        self.total = total
        #: reply queue -> the reader link that summoned it, and back
        self.queues: dict[str, "LeaseLink"] = {}
        self.readers: dict["LeaseLink", str] = {}
        #: reply queue -> ids of its calls in flight
        self.in_flight: dict[str, set[int]] = {}
        self.running = 0
        #: calls made, and requests refused (malformed, no queue, a bound, not allowed)
        self.relayed = 0
        self.limits = Counters(log, "the Spark gateway's call relay refused requests",
                               level=logging.DEBUG)

    # --- reply queues ---------------------------------------------------------------

    def summoned(self, link: "LeaseLink", name: str) -> None:
        """A confirmed reader summoned ``name``: its replies go to ``link`` from now on."""
        if not name.startswith(REPLIES) or link.grant.user.name != self.user:
            return
        old = self.queues.get(name)
        if old is not None and old is not link:
            self.readers.pop(old, None)
        self.queues[name] = link
        self.readers[link] = name

    def gone(self, link: "LeaseLink") -> None:
        """``link`` dismissed its queue or went."""
        name = self.readers.pop(link, None)
        if name is not None and self.queues.get(name) is link:
            del self.queues[name]

    # --- requests ---------------------------------------------------------------

    def request(self, link: "LeaseLink", command: "Content", now: float
                ) -> tuple[list[tuple[bytes, list[bytes]]], Optional[Call]]:
        """A request from ``link``: (what to send now, the call to make or None)."""
        call = _parse(command.properties, command.body) \
            if link.grant.user.name == self.user else None
        reader = self.queues.get(call.reply_to) if call is not None else None
        if call is None or reader is None or reader.grant.user.name != self.user:
            self.limits.over("malformed", "a request without a summoned reply queue of its "
                             "user, or with malformed properties: rejected", now)
            return [(link.identity, encode_data(Reject(command.sequence, False, False)))], None
        sends = [(link.identity, encode_data(Confirm(command.sequence, False)))]
        calls = self.in_flight.setdefault(call.reply_to, set())
        if call.id in calls:                     # sent again after a broken link: runs already
            return sends, None
        refusal = None
        if self.services is not None and call.service not in self.services:
            refusal = Outcome(False, None, 403, f"403 service {call.service!r} is not open to "
                              "the executors (start_service's gateway_services)")
        elif len(calls) >= self.per_client:
            refusal = Outcome(False, None, 429, f"429 more than {self.per_client} calls in "
                              "flight from one client")
        elif self.running >= self.total:
            refusal = Outcome(False, None, 503, f"503 more than {self.total} calls in flight "
                              "through the driver's gateway")
        if refusal is not None:
            self.limits.over(f"status {refusal.status}", refusal.error or "", now)
            return sends + self._reply(call, refusal), None
        calls.add(call.id)
        self.running += 1
        self.relayed += 1
        return sends, call

    def answered(self, call: Call, outcome: Outcome) -> list[tuple[bytes, list[bytes]]]:
        """``call`` ended with ``outcome``: the reply to send (none if its queue went)."""
        calls = self.in_flight.get(call.reply_to)
        if calls is not None and call.id in calls:
            calls.discard(call.id)
            self.running -= 1
            if not calls:
                del self.in_flight[call.reply_to]
        return self._reply(call, outcome)

    def _reply(self, call: Call, outcome: Outcome) -> list[tuple[bytes, list[bytes]]]:
        link = self.queues.get(call.reply_to)
        if link is None:
            log.debug("the reply to call %d went nowhere: queue %s is gone", call.id,
                      call.reply_to)
            return []
        properties: dict[str, Any] = {"id": call.id, "status": outcome.status}
        body = b""
        if outcome.ok:
            body = outcome.value if isinstance(outcome.value, bytes) else b""
        else:
            properties["error"] = outcome.error
        link.sequence += 1
        return [(link.identity, content_frames(link.sequence, encode_string(call.reply_to),
                                               body, encode_table(properties)))]


def submit(channel: Any, relay: CallRelay, call: Call,
           answer: Callable[[list[tuple[bytes, list[bytes]]]], None]) -> None:
    """Make ``call`` with the driver's ``ThreadedChannel`` (None: it has none), on the
    node's hub; ``answer(sends)`` sends its reply there once it came."""
    if channel is None:
        answer(relay.answered(call, Outcome(False, None, 503, "503 the driver has no "
                                            "Safir-Darbaan channel (start_service(channel="
                                            "False), or peermesh.sada not importable)")))
        return
    try:
        future = channel.request_async(call.service, call.action, call.body, raw=True,
                                       version=call.version, category=call.category,
                                       timeout=call.timeout, retries=call.retries)
    except Exception as exc:   # not running yet or any more, a name it cannot send
        answer(relay.answered(call, outcome_of(exc)))
        return

    def done(future: Any) -> None:
        exc = future.exception()
        outcome = Outcome(True, future.result(), 200) if exc is None else outcome_of(exc)
        answer(relay.answered(call, outcome))

    future.add_done_callback(done)


class GatewayCalls:
    """An executor's calls through the driver's gateway: an MTL client of its own, with a
    request lease and a reply queue (not used by two threads at once: ``lock``)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.endpoint = settings.endpoint
        self.queue = REPLIES + secrets.token_hex(16)
        self.lock = threading.Lock()
        self.client: Any = None
        self.writer: Any = None
        self.reader: Any = None
        self._id = 0
        self._used = 0.0

    def _open(self) -> None:
        """A new session, request lease and reply queue (closing the old ones)."""
        from ..mtl.client import Client

        if self.client is not None:
            self.client.close()
        settings = self.settings
        self.client = client = Client(settings.endpoint, settings.user, settings.password,
                                      server_key=settings.server_key)
        self.writer = client.writer([CALLS], confirm="full")
        self.reader = client.reader([self.queue], confirm="full")
        self.reader.summon(self.queue)

    def _awake(self) -> None:
        """Open again when idle for a heartbeat: while no task calls, nobody answers the
        gateway's heartbeats, so it unbinds the links and forgets the reply queue."""
        if self.client is None or time.monotonic() - self._used >= self.client.heartbeat:
            self._open()

    def request_many(self, service: str, action: str, payloads: Sequence[Any], *,
                     version: Optional[str] = None, category: str = "",
                     timeout: Optional[float] = None, window: int = 64, retries: int = 0
                     ) -> list[Outcome]:
        """One request per payload, at most ``window`` without a reply; outcomes in order."""
        base: dict[str, Any] = {"service": service, "action": action, "reply-to": self.queue}
        for key, value in (("version", version), ("timeout", timeout)):
            if value is not None:
                base[key] = value
        if category:
            base["category"] = category
        if retries:
            base["retries"] = retries
        with self.lock:
            try:
                return self._run(base, payloads, window, (timeout or DEFAULT_TIMEOUT) + GRACE)
            except BaseException:
                self.close()             # the next batch opens a new client
                raise

    def _run(self, base: dict[str, Any], payloads: Sequence[Any], window: int,
             wait: float) -> list[Outcome]:
        from ..sada.handlers import pack, unpack

        results: list[Optional[Outcome]] = [None] * len(payloads)
        pending: dict[int, tuple[int, float]] = {}   # id -> (index, deadline)
        index = 0
        self._awake()
        writer, reader = self.writer, self.reader
        while index < len(payloads) or pending:
            while index < len(payloads) and len(pending) < max(1, window):
                try:
                    body = pack(payloads[index])
                except Exception as exc:
                    results[index] = outcome_of(exc)
                    index += 1
                    continue
                self._id += 1
                writer.send(body, CALLS, {**base, "id": self._id})
                pending[self._id] = (index, time.monotonic() + wait)
                index += 1
            writer.wait(0)              # its Confirms, heartbeats
            if writer.rejected:
                count = len(writer.rejected)
                writer.rejected.clear()
                raise MeshWriteError(f"the driver's gateway {self.endpoint} refused "
                                     f"{count} calls (its user may not call, or the "
                                     "reply queue is gone)")
            if not pending:
                continue
            first = min(deadline for _, deadline in pending.values())
            received = reader.receive(max(0.0, min(first - time.monotonic(), 1.0)))
            last = None
            while received is not None:
                last = received
                properties = received.properties
                entry = pending.pop(properties.get("id"), None) \
                    if isinstance(properties.get("id"), int) else None
                if entry is not None:
                    results[entry[0]] = _outcome(properties, received.body, unpack)
                received = reader.receive(0)
            if last is not None:
                reader.confirm(last, multiple=True)
            now = time.monotonic()
            for cid, (i, deadline) in list(pending.items()):
                if deadline <= now:
                    del pending[cid]
                    results[i] = Outcome(False, None, None, "RequestTimeout: no reply "
                                         f"through the driver's gateway within {wait:g} s")
        writer.wait(0)
        self._used = time.monotonic()
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Close the client and its leases."""
        if self.client is not None:
            self.client.close()
            self.client = None


def _outcome(properties: Any, body: bytes, unpack: Callable[[bytes], Any]) -> Outcome:
    """A reply's ``Outcome`` (as on the mesh: 200 with the value, else status and error)."""
    status = properties.get("status")
    status = status if type(status) is int else None
    if status == 200:
        try:
            return Outcome(True, unpack(body) if body else None, 200)
        except Exception as exc:
            return Outcome(False, None, 400, f"400 reply payload is not msgpack: {exc}")
    error = properties.get("error")
    return Outcome(False, None, status, error if isinstance(error, str) else
                   f"{status} (no reason given)")
