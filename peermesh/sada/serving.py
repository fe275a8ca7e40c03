"""The server's protocol core: the catalog, the channels, and what each message asks for.

A ``ServerCore`` is the Safir-Darbaan server without sockets and without a
clock, a core on the contract of ``peermesh.core``: ``receive(alias, frames,
now)`` takes a message from the channel whose connection has routing id
``alias``; ``handle_timer``/``next_deadline`` forget channels that left the
mesh ``forget_after`` seconds ago. Its outputs:

* ``Send(alias, frames)`` - a PONG, an INTR (on connecting, on RINTR, on every
  change of the catalog, on a connection (re-)established), a REP;
* ``Deliver(Job)`` - a REQ for a handler: the driver's owner runs it (inline or
  in a worker greenlet) and hands the outcome back to ``reply``, whose REP is a
  ``Send`` again;
* ``Dial(alias, endpoint, alias, key)`` - connect to a channel under routing id
  ``alias``; ``Hangup(alias)`` - disconnect a forgotten one.

The common REQ (a service, version and action seen before) is handled without
decoding its text frames: the service is found by its name and version frames
(a cache of earlier resolutions, cleared when the catalog changes) and the
handler by its category and action frames (``Service.by_frames``), and
``job_of`` (one message) and ``job_each`` (a batch's, in one call) hand their jobs
over themselves, no outputs made (a driver's ``delivery`` and ``delivery_each`` fast
paths); anything else takes the careful path through ``wire.sada``, which also produces the
404/405/406 answers. Once ``stop`` is called the catalog INTRed is empty and
new REQs are answered 503; past ``max_concurrent`` running handlers too.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple, Optional, Sequence

from ..core import Deliver, Dial, Hangup, Output, Outputs, Send
from ..counters import Counters
from ..errors import ProtocolError
from ..io.zmqbatch import native
from ..wire import sada as wire
from ..wire.sada import Intr, Ping, Pong, Rintr, ServiceId, Status
from .endpoints import Network, mesh_endpoint
from .errors import CatalogFull
from .handlers import Handler, ReqFields, Request, Service, resolve_service, unknown_action
from .versions import version_key

__all__ = ["ServerCore", "Job"]

log = logging.getLogger(__name__)

_PONG = wire.encode(Pong())
_DELIMITER, _PROTOCOL = wire.DELIMITER, wire.PROTOCOL
_REQ, _REP = wire.Command.REQ.frame, wire.Command.REP.frame
_STATUS = {code: wire.status_frame(code) for code in range(100, 600)}
#: the frames every message from a channel has (a REQ's, a PING's, a RINTR's)
_KNOWN = (_PROTOCOL, _REQ, wire.Command.PING.frame, wire.Command.RINTR.frame)
_MAX_KNOWN = 32   # frames ``known_frames`` names at most (each costs a look per frame read)
_MAX_CACHED = 4096  # (service, version) resolutions remembered


class Job(NamedTuple):
    """A REQ for a handler: reply to ``alias`` about ``request_id`` (see ``reply``)."""

    alias: bytes
    handler: Handler
    request_id: bytes
    payload: bytes
    request: Optional[Request]


#: makes a ``Job`` from its fields' tuple in one C call (a NamedTuple's own ``__new__`` is
#: a Python function)
_new_tuple = tuple.__new__
#: ``job_each``'s usual case in C (``peermesh.io._zmqbatch.sada_jobs``); None without the
#: extension (or with a build older than it): the Python loop alone, the same behaviour
_jobs_in_c: Optional[Callable[..., int]] = getattr(native, "sada_jobs", None)


class ServerCore(Outputs):
    """The state of one server; no I/O, time given by the caller (see the module)."""

    def __init__(self, *, max_concurrent: Optional[int], max_services: int,
                 forget_after: float, networks: Optional[list[Network]] = None,
                 addressed: bool = False) -> None:
        super().__init__()
        #: every ``Send``'s frames start with the channel's alias (its routing id: a
        #: driver's ``addressed``, a ``RoutedTransport``'s too: sent as they are)
        self.addressed = addressed
        self.max_concurrent = max_concurrent
        self.max_services = max_services
        self.forget_after = forget_after
        #: where a channel named on the mesh may be (None: anywhere the owner says)
        self.networks: list[Network] = networks or []
        #: refusals by limit: ``max_concurrent`` (REQs answered 503), ``channel_networks``
        self.limits = Counters(log, "Safir-Darbaan server hit its limits")
        self.stats: dict[str, int] = dict.fromkeys(
            ("requests", "replies", "errors", "busy", "intr_sent", "dropped", "unsent"), 0)
        self.catalog: dict[str, dict[str, Service]] = {}
        self._size = 0     # (name, version) pairs in the catalog
        self._resolved: dict[tuple[str, str], Any] = {}  # (service, version) -> Service | outcome
        self._by_frames: dict[tuple[bytes, bytes], Service] = {}  # the same, by REQ frames 5-6
        # what ``sada_jobs`` is given to hand a batch's usual REQs on as ``job_each`` does
        self._jobs_shape = (self._by_frames, self.stats, Job, _PROTOCOL, _REQ,
                            wire.MAX_REQUEST_ID)
        self._known: Optional[tuple[bytes, ...]] = _KNOWN   # (None: to be made again)
        self._intr: list[bytes] = self._encode_intr()
        #: handlers running (Deliver given, ``reply`` not yet called) outside the reader
        self.busy = 0
        self.serving = False   # REQs are run (else answered 503)
        self.closed = False    # replies are dropped
        # the channels: alias (routing id) <-> endpoint, and why each is kept
        self.aliases: dict[str, bytes] = {}
        self.endpoints: dict[bytes, str] = {}
        self.generations: dict[str, int] = {}
        self._direct: set[str] = set()              # named by the application: kept
        self._owners: dict[str, set[Any]] = {}      # mesh peers advertising the endpoint
        self._forget_at: dict[str, float] = {}

    # --- the catalog ----------------------------------------------------------

    def add_service(self, service: Service) -> list[Output]:
        """Serve ``service`` (replacing one of the same name and version); the INTRs."""
        versions = self.catalog.get(service.name, {})
        changed = versions.get(service.version) is None
        if changed and self._size >= self.max_services:
            raise CatalogFull(f"cannot serve {service.name} {service.version}: the catalog holds "
                              f"{self._size} services, the most one INTR may list "
                              f"(max_services)")
        self.catalog[service.name] = versions
        versions[service.version] = service
        self._size += changed
        return self._catalog_changed() if changed else []

    def remove_service(self, name: str, version: str) -> list[Output]:
        """Stop serving ``name`` ``version`` (KeyError if not served); the INTRs."""
        versions = self.catalog[name]
        del versions[version]
        self._size -= 1
        if not versions:
            del self.catalog[name]
        return self._catalog_changed()

    def services(self) -> list[ServiceId]:
        """The (name, version) pairs INTRed to channels, sorted."""
        return [ServiceId(name, version) for name in sorted(self.catalog)
                for version in sorted(self.catalog[name], key=version_key)]

    def _encode_intr(self, empty: bool = False) -> list[bytes]:
        return wire.encode(Intr(() if empty else tuple(self.services())))

    def _catalog_changed(self) -> list[Output]:
        self._resolved.clear()
        self._by_frames.clear()
        self._known = None
        self._intr = self._encode_intr()
        return self.intr_all()

    def intr_all(self) -> list[Output]:
        """INTR every channel (the catalog changed, or a connection came up somewhere)."""
        for alias in list(self.endpoints):
            self._send_intr(alias)
        return self.take()

    def _send_intr(self, alias: bytes) -> None:
        self._outputs.append(Send(alias, (alias, *self._intr) if self.addressed
                                  else self._intr))
        self.stats["intr_sent"] += 1

    def stop(self) -> list[Output]:
        """Leaving: INTR an empty catalog everywhere; REQs from now on get 503."""
        self.serving = False
        self._intr = self._encode_intr(empty=True)
        return self.intr_all()

    # --- channels -------------------------------------------------------------

    def link(self, endpoint: str, now: float, *, direct: bool = False, owner: Any = None,
             key: Optional[str] = None, need_key: bool = False) -> list[Output]:
        """Serve the channel at ``endpoint`` (named by the application when ``direct``,
        else advertised by mesh peer ``owner``); ``key``: its public key (Z85), needed
        when ``need_key``. The ``Dial`` and first INTR of a new one."""
        alias = self.aliases.get(endpoint)
        if alias is None:
            if not direct and mesh_endpoint(endpoint, self.networks) is None:
                self.limits.over("channel_networks", f"ignored channel endpoint "
                                 f"{endpoint[:80]!r} from the mesh: not tcp://IP:PORT in "
                                 f"{', '.join(map(str, self.networks)) or 'no network'}")
                return []
            if need_key and key is None:
                log.warning("not connecting to channel %s: its public key is unknown "
                            "(give channel_keys= or connect(endpoint, key))", endpoint)
                return []
            # libzmq aborts when a routing id is reused while its old connection is being
            # torn down: a channel connected to again gets ENDPOINT#N (never on the wire)
            generation = self.generations.get(endpoint, 0)
            self.generations[endpoint] = generation + 1
            alias = endpoint.encode("utf-8")
            if generation:
                alias += b"#%d" % generation
            self.aliases[endpoint] = alias
            self.endpoints[alias] = endpoint
            self._owners[endpoint] = set()
            log.debug("connecting to channel %s", endpoint)
            self._outputs.append(Dial(alias, endpoint, alias,
                                      None if key is None else key.encode("ascii")))
            self._send_intr(alias)  # queued until the connection is up
        if direct:
            self._direct.add(endpoint)
        if owner is not None:
            self._owners[endpoint].add(owner)
        self._forget_at.pop(endpoint, None)
        return self.take()

    def peer_left(self, peer: Any, now: float) -> None:
        """Mesh peer ``peer`` left: a channel only it advertised is forgotten in
        ``forget_after`` seconds (unless advertised again meanwhile)."""
        for endpoint, owners in self._owners.items():
            if peer in owners:
                owners.discard(peer)
                if not owners and endpoint not in self._direct:
                    self._forget_at.setdefault(endpoint, now + self.forget_after)

    def connected(self, endpoint: str) -> list[Output]:
        """A connection was (re-)established: INTR that channel (one reported under
        another spelling of its address: every channel)."""
        alias = self.aliases.get(endpoint)
        if alias is None:
            return self.intr_all()
        self._send_intr(alias)
        return self.take()

    def channel_name(self, alias: bytes) -> str:
        """The endpoint of the channel known by ``alias``."""
        endpoint = self.endpoints.get(alias)
        return endpoint if endpoint is not None else alias.decode("utf-8", "replace")

    # --- time -----------------------------------------------------------------

    def next_deadline(self) -> Optional[float]:
        """When a channel that left is next due to be forgotten (None: none is)."""
        return min(self._forget_at.values()) if self._forget_at else None

    def handle_timer(self, now: float) -> list[Output]:
        """Forget the channels whose time has come: a ``Hangup`` each."""
        for endpoint, when in list(self._forget_at.items()):
            if when > now:
                continue
            del self._forget_at[endpoint]
            alias = self.aliases.pop(endpoint)
            del self.endpoints[alias]
            del self._owners[endpoint]
            log.debug("forgot channel %s", endpoint)
            self._outputs.append(Hangup(alias))
        return self.take()

    # --- messages -------------------------------------------------------------

    def job_of(self, alias: Any, frames: list[bytes], now: float) -> Optional[Job]:
        """The usual message, a REQ as the spec draws it for a service resolved before and
        an action it has, taken in: its ``Job``, as a ``Deliver`` carries it (the driver's
        ``delivery`` fast path: no outputs are made). None for any other message, and for
        one that is answered here (503 past ``max_concurrent``), untouched: ``receive`` it."""
        jobs: list[Job] = []
        self.job_each(((alias, frames),), 0, now, jobs.append)
        return jobs[0] if jobs else None

    def job_each(self, batch: Sequence[tuple[Any, Optional[list[bytes]]]], start: int,
                 now: float, sink: Callable[[Job], Any]) -> int:
        """``job_of`` over the messages of a batch (``(alias, frames)`` each, frames None
        for one over the limits) from index ``start`` on, each job handed to ``sink`` at
        once, for as long as they are the usual REQ: the index of the first that is not
        (``len(batch)``: none), left as it was for ``receive``. One call per batch, not
        per message (a driver's ``delivery_each``)."""
        by_frames, stats = self._by_frames, self.stats
        at, end = start, len(batch)
        take = _jobs_in_c
        if take is not None and at < end:   # (its first unusual message goes on below)
            at = take(batch, at, self, sink, self._jobs_shape)
        while at < end:
            alias, frames = batch[at]
            # (a request id of 1-255 octets is all left to check)
            if (frames is None or len(frames) != 9 or frames[2] != _REQ
                    or frames[1] != _PROTOCOL or frames[0]
                    or not 0 < len(frames[3]) <= wire.MAX_REQUEST_ID):
                return at
            service = by_frames.get((frames[4], frames[5]))
            if service is None:
                return at
            handler = service.by_frames.get((frames[6], frames[7]))
            if handler is None or handler.with_request or not self.serving:
                return at
            if not handler.inline:
                limit = self.max_concurrent
                if limit is not None and self.busy >= limit:
                    return at   # (answered 503 by ``receive``)
                self.busy += 1
            stats["requests"] += 1
            at += 1
            sink(_new_tuple(Job, (alias, handler, frames[3], frames[8], None)))
        return at

    def receive(self, alias: Any, frames: list[bytes], now: float) -> list[Output]:
        """A message from the channel connected under ``alias``; the outputs."""
        job = self.job_of(alias, frames, now)   # the fast path
        if job is not None:
            return [Deliver(job)]
        try:
            command = wire.command_of(frames)
            if command == _REQ:
                self._on_req(alias, wire.parse_req(frames), (frames[4], frames[5]))
                return self.take()
            message = wire.decode(frames)
        except ProtocolError as exc:
            self.stats["dropped"] += 1
            log.debug("dropped message from %r: %s", alias, exc.reason)
            return []
        kind = type(message)
        if kind is Ping:
            return [Send(alias, (alias, *_PONG) if self.addressed else _PONG)]
        if kind is Rintr:
            self._send_intr(alias)
            return self.take()
        self.stats["dropped"] += 1
        log.debug("dropped unexpected %s from %r", kind.__name__, alias)
        return []

    def _resolve(self, service: str, version: str, frames: tuple[bytes, bytes]) -> Any:
        """The Service for ``service`` ``version`` (or the outcome saying why none),
        remembered under the names and under their REQ ``frames`` for the fast path."""
        key = (service, version)
        found = self._resolved.get(key)
        if found is None:
            found = resolve_service(self.catalog, service, version)
            if len(self._resolved) < _MAX_CACHED:
                self._resolved[key] = found
        if type(found) is Service and len(self._by_frames) < _MAX_CACHED:
            self._by_frames[frames] = found
            self._known = None
        return found

    def known_frames(self) -> tuple[bytes, ...]:
        """The frames every usual message from a channel has: the protocol's, the
        commands', and the service, version, category and action frames of the requests
        resolved so far, as the fast path's tables hold them (the driver may read them as
        these very objects, whose hashes are kept: ``HubSocket.wrap_reader``,
        ``zmqbatch.knows_frames``); at most ``_MAX_KNOWN``."""
        known = self._known
        if known is None:
            frames = dict.fromkeys(_KNOWN)
            for (name, version), service in self._by_frames.items():
                frames.update(dict.fromkeys((name, version)))
                for category, action in service.by_frames:
                    frames.update(dict.fromkeys((category, action)))
            known = self._known = tuple(frames)[:_MAX_KNOWN]
        return known

    def _on_req(self, alias: bytes, req: ReqFields, frames: tuple[bytes, bytes]) -> None:
        """A REQ off the fast path; ``frames``: its service name and version frames."""
        self.stats["requests"] += 1
        if not self.serving:
            self._reply(alias, req[0], Status.UNAVAILABLE, b"server is stopping")
            return
        service = self._resolve(req[1], req[2], frames)
        if type(service) is tuple:
            self._reply(alias, req[0], *service)
            return
        handler = service.handler(req[3], req[4])
        if handler is None:
            self._reply(alias, req[0], *unknown_action(service, req[3], req[4]))
            return
        request = Request(req, self.channel_name(alias)) if handler.with_request else None
        self._run(alias, handler, req[0], req[5], request)

    def _run(self, alias: bytes, handler: Handler, request_id: bytes, payload: bytes,
             request: Optional[Request]) -> None:
        """Hand the REQ to its handler (503 when ``max_concurrent`` run already)."""
        if not handler.inline:
            limit = self.max_concurrent
            if limit is not None and self.busy >= limit:
                self.stats["busy"] += 1
                self.limits.over("max_concurrent", f"answered 503 to a request from "
                                 f"{self.channel_name(alias)}: {self.busy} running")
                self._reply(alias, request_id, Status.UNAVAILABLE,
                            f"server busy ({limit} requests running)".encode())
                return
            self.busy += 1
        self._outputs.append(Deliver(Job(alias, handler, request_id, payload, request)))

    def reply(self, job: Job, status: int, payload: bytes) -> list[Output]:
        """The handler of ``job`` came out with ``status`` and ``payload``: the REP."""
        if not job.handler.inline:
            self.busy -= 1
        if self.closed:
            return []
        return self._rep(job.alias, job.request_id, status, payload)

    def _reply(self, alias: bytes, request_id: bytes, status: int, payload: bytes) -> None:
        self._outputs += self._rep(alias, request_id, status, payload)

    def _rep(self, alias: bytes, request_id: bytes, status: int,
             payload: bytes) -> list[Output]:
        stats = self.stats
        if status >= 400:
            stats["errors"] += 1
        stats["replies"] += 1
        if self.addressed:
            return [Send(alias, (alias, _DELIMITER, _PROTOCOL, _REP, request_id,
                                 _STATUS[status], payload))]
        return [Send(alias, (_DELIMITER, _PROTOCOL, _REP, request_id, _STATUS[status],
                             payload))]

    def unsent(self, frames: Any) -> None:
        """A message found no way to its channel (``frames`` as sent: after the routing
        id, or from it when ``addressed``)."""
        command = 3 if self.addressed else 2
        if len(frames) > command and frames[command] == _REP:
            self.stats["replies"] -= 1
            self.stats["unsent"] += 1
