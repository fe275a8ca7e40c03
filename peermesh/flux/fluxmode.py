"""A peermesh rank inside a flux-core tree ("flux mode"): a leaf broker of flux-core's overlay.

How it works
------------
A flux-core instance booted from a configuration file lists its hosts
(``[[bootstrap.hosts]]``), their ranks follow the list and ``tbon.topo``, and
every broker holds the instance's CURVE certificate (``flux keygen``'s file:
a ZeroMQ certificate, as ``peermesh.io.keys`` reads it). ``FluxModeCore``
(sans-io) is one such rank without children of its own; ``FluxModeMember``
drives it on a gevent hub with one DEALER to its parent's ``connect`` URI
(a CURVE client of the certificate's own public key, as flux-core's
brokers are); ``FluxModeMember.from_config`` reads its place (rank, size,
parent, certificate) from the instance's own configuration file
(``read_config``).

What the parent (flux-core 0.88) expects, and what it gets:

- the DEALER's ZeroMQ identity is the rank's UUID as a 36-character string;
- first an ``overlay.hello`` request, rolemask OWNER, body ``{"rank",
  "version", "uuid", "status", "hostname"}``: version ``0xMMmmpp`` (the
  parent compares MAJOR.MINOR: ``FLUX_VERSION``), status 1 (full: a leaf's
  subtree is itself), hostname the one the configuration gives the rank.
  The answer ``{"uuid"}`` names the parent; an error answer (a hostname or
  rank the configuration does not have, a version mismatch) stops the rank
  with ``Notice("refused")`` naming the parent's message;
- everything sent upstream carries flag ROUTE and an empty route stack,
  CONTROL messages included (without it the parent drops them as
  malformed); a CONTROL HEARTBEAT goes up when nothing else was sent for
  ``heartbeat`` seconds (flux-core's ``torpid_min`` is 5 s);
- a request from the parent is answered with its route stack as it came
  (the parent pops its own hops); ``broker.ping`` (flux's body and answer),
  ``attr.get`` (``rank``, ``size``, ``hostname``, ``version``,
  ``broker.uuid``) and the ``service.method`` topics registered are served,
  anything else gets ENOSYS with flux-core's message;
- events come down from the parent and go to the subscriptions they match;
- a CONTROL DISCONNECT from the parent ends the rank (``Notice("parent-lost")``);
- leaving is ``overlay.goodbye`` (answered by the parent, which marks the
  rank offline), then the link closes.

Bounds: RPCs of this rank in flight (``max_pending``, past it
``FluxStateError``), requests being served at once (``max_serving``, past
it EAGAIN), subscriptions' queues (``SUBSCRIPTION_QUEUE`` events each, the
oldest dropped), messages of at most ``max_message`` octets.
"""

from __future__ import annotations

import errno as errnos
import logging
import uuid as uuids
from collections import deque
from typing import Any, Callable, Optional

import gevent
import gevent.event

from ..errors import ProtocolError
from ..wire.flux import (
    NODEID_ANY, Control, ControlType, Errno, Event, Request, Response, Role,
    decode, encode, json_payload, read_json, string_payload,
)
from .bodies import ping_answer, str_field
from .errors import FluxError, FluxStateError
from .handle import SUBSCRIPTION_QUEUE, FluxRequest, Payload, to_payload
from .outputs import PARENT, Deliver, Notice, Output, Send

__all__ = ["FluxModeCore", "FluxModeMember", "read_config", "FLUX_VERSION", "STATUS_FULL"]

log = logging.getLogger(__name__)

#: the flux-core version this rank says it is (the parent compares MAJOR.MINOR)
FLUX_VERSION = (0, 88, 0)
#: subtree status "full" (flux-core's SUBTREE_STATUS_FULL)
STATUS_FULL = 1
_NORESPONSE, _STREAMING = 0x04, 0x40


def read_config(path: str, hostname: str) -> dict[str, Any]:
    """Where flux-core's config boot puts host ``hostname``: ``{"rank", "size",
    "parent" (the parent's connect URI), "cert"}``; ValueError naming what the file
    lacks. Ranks follow ``[[bootstrap.hosts]]`` (one plain host name per entry); the
    parent follows ``tbon.topo`` (``kary:K``, or flux-core's config-boot default
    ``custom``: an entry's ``parent`` host, else rank 0); a URI is the parent entry's
    ``connect``, else ``bootstrap.default_connect`` with ``%h`` (host) and ``%p``
    (``bootstrap.default_port``); ``curve_cert`` is relative to the file's directory."""
    import os
    import tomllib

    with open(path, "rb") as file:
        try:
            conf = tomllib.load(file)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not TOML: {exc}") from None
    boot = conf.get("bootstrap")
    if not isinstance(boot, dict):
        raise ValueError(f"{path}: no [bootstrap] table")
    hosts = boot.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, dict) and isinstance(
            h.get("host"), str) for h in hosts):
        raise ValueError(f"{path}: no [[bootstrap.hosts]] entries with a host")
    names = [h["host"] for h in hosts]
    if any("[" in name or "," in name for name in names):
        raise ValueError(f"{path}: host lists (node[0-3]) are not read here; one host an entry")
    if hostname not in names:
        raise ValueError(f"{path}: {hostname} is not among the hosts {names}")
    rank = names.index(hostname)
    if rank == 0:
        raise ValueError(f"{path}: {hostname} is rank 0; a peermesh rank is a leaf below it")
    cert = boot.get("curve_cert")
    if not isinstance(cert, str):
        raise ValueError(f"{path}: no bootstrap.curve_cert")
    tbon = conf.get("tbon")
    topo = tbon.get("topo", "custom") if isinstance(tbon, dict) else "custom"
    if isinstance(topo, str) and topo.startswith("kary:") and topo[5:].isdigit():
        k = int(topo[5:])
        parent = 0 if k == 0 else (rank - 1) // k
        if any(k and r and (r - 1) // k == rank for r in range(len(names))):
            raise ValueError(f"{path}: rank {rank} has children under {topo}; a peermesh "
                             "rank in a flux-core tree is a leaf")
    elif topo == "custom":
        above = hosts[rank].get("parent")
        parent = names.index(above) if above in names else 0
        if any(h.get("parent") == hostname for h in hosts):
            raise ValueError(f"{path}: {hostname} has children; a peermesh rank in a "
                             "flux-core tree is a leaf")
    else:
        raise ValueError(f"{path}: tbon.topo {topo!r} is not kary:K or custom")
    uri = hosts[parent].get("connect") or boot.get("default_connect")
    if not isinstance(uri, str):
        raise ValueError(f"{path}: no connect URI for {names[parent]} (rank {parent})")
    uri = uri.replace("%h", names[parent]).replace("%p", str(boot.get("default_port", "")))
    return {"rank": rank, "size": len(names), "parent": uri,
            "cert": os.path.join(os.path.dirname(os.path.abspath(path)), cert)}


class FluxModeCore:
    """One leaf rank of a flux-core tree, sans-io (see the module's docstring).

    Calls return outputs: ``Send(PARENT, frames)``, ``Deliver(0, message)``
    (a request for a registered topic, an event, or a response to ``rpc``)
    and ``Notice(what, rank, detail)`` (``online``, ``refused``,
    ``parent-lost``, ``left``)."""

    def __init__(self, rank: int, size: int, hostname: str, *,
                 version: tuple[int, int, int] = FLUX_VERSION, heartbeat: float = 2.0,
                 max_pending: int = 1024, uuid: Optional[str] = None) -> None:
        if not 0 < rank < size:
            raise FluxStateError(f"rank {rank} is not a non-root rank of {size}")
        self.rank, self.size, self.hostname = rank, size, hostname
        self.uuid = uuid or str(uuids.uuid4())
        self.identity = self.uuid.encode()
        self.version = version
        self.heartbeat = heartbeat
        self.max_pending = max_pending
        self.state = "detached"   # hello -> online -> leaving -> stopped
        self.parent_uuid = ""
        self.topics: set[str] = set()
        self.pending: dict[int, str] = {}  # matchtag -> topic, of this rank's own RPCs
        self._next_tag = 1
        self._sent = 0.0
        self.stats = {"dropped": 0}

    # --- what the driver calls ------------------------------------------------------

    def start(self, now: float) -> list[Output]:
        """Say hello to the parent."""
        self.state = "hello"
        (major, minor, patch) = self.version
        body = {"rank": self.rank, "version": major << 16 | minor << 8 | patch,
                "uuid": self.uuid, "status": STATUS_FULL, "hostname": self.hostname}
        return [self._up(Request("overlay.hello", json_payload(body), NODEID_ANY,
                                 self._tag("overlay.hello"), routes=(),
                                 rolemask=Role.OWNER), now)]

    def leave(self, now: float) -> list[Output]:
        """``overlay.goodbye`` to the parent; ``Notice("left")`` once it answers."""
        if self.state != "online":
            self.state = "stopped"
            return [Notice("left", self.rank, "not online")]
        self.state = "leaving"
        return [self._up(Request("overlay.goodbye", None, NODEID_ANY,
                                 self._tag("overlay.goodbye"), routes=(),
                                 rolemask=Role.OWNER), now)]

    def rpc(self, topic: str, payload: Optional[bytes], nodeid: int, now: float,
            flags: int = 0) -> tuple[int, list[Output]]:
        """A request of this rank, routed by the parent; its matchtag (0: NORESPONSE)."""
        if self.state != "online":
            raise FluxStateError("the rank is not online in the flux-core tree")
        tag = 0 if flags & _NORESPONSE else self._tag(topic)
        return tag, [self._up(Request(topic, payload, nodeid, tag, flags, ()), now)]

    def respond(self, request: Request, payload: Optional[bytes], errnum: int,
                now: float) -> list[Output]:
        """Answer ``request`` (delivered earlier) back along its route stack."""
        if request.flags & _NORESPONSE or self.state not in ("online", "leaving"):
            return []
        return [self._up(Response(request.topic, payload, errnum, request.matchtag,
                                  request.flags & _STREAMING, request.routes or ()), now)]

    def timer(self, now: float) -> list[Output]:
        """A heartbeat when nothing went up for ``heartbeat`` seconds; call every second."""
        if self.state == "online" and now - self._sent >= self.heartbeat:
            return [self._up(Control(ControlType.HEARTBEAT, 0, routes=()), now)]
        return []

    def receive(self, frames: list[bytes], now: float) -> list[Output]:
        """A message from the parent."""
        try:
            message = decode(frames)
        except ProtocolError as exc:
            return self._drop(f"malformed: {exc.reason}")
        if isinstance(message, Response):
            return self._response(message, now)
        if isinstance(message, Control):
            if message.ctype == ControlType.DISCONNECT and self.state != "stopped":
                was = self.state
                self.state = "stopped"
                if was == "hello":
                    return [Notice("refused", self.rank, "DISCONNECT: the parent does not "
                                   "know this rank (its configuration or certificate?)")]
                return [Notice("parent-lost", self.rank, "DISCONNECT")]
            return []
        if self.state != "online":
            return self._drop(f"a {type(message).__name__} before hello was answered")
        if isinstance(message, Event):
            return [Deliver(0, message)]
        assert isinstance(message, Request)
        return self._request(message, now)

    # --- inside ----------------------------------------------------------------------

    def _response(self, response: Response, now: float) -> list[Output]:
        topic = self.pending.get(response.matchtag)
        if topic != response.topic:
            return self._drop(f"a response to no RPC ({response.matchtag})")
        if not response.flags & _STREAMING or response.errnum:
            del self.pending[response.matchtag]
        if topic == "overlay.hello":
            if response.errnum:
                self.state = "stopped"
                name = errnos.errorcode.get(response.errnum, str(response.errnum))
                text = (response.payload or b"").rstrip(b"\0").decode("utf-8", "replace")
                return [Notice("refused", self.rank, f"{name} answering overlay.hello"
                                                      + (f": {text}" if text else ""))]
            try:
                self.parent_uuid = str_field(read_json(response.payload), "uuid", 64)
            except ProtocolError as exc:
                self.state = "stopped"
                return [Notice("refused", self.rank, f"overlay.hello answer: {exc.reason}")]
            self.state = "online"
            return [Notice("online", self.rank, {"parent": self.parent_uuid,
                                                 "size": self.size})]
        if topic == "overlay.goodbye":
            self.state = "stopped"
            return [Notice("left", self.rank, response.errnum)]
        return [Deliver(0, response)]

    def _request(self, request: Request, now: float) -> list[Output]:
        topic = request.topic
        if topic == "broker.ping":
            try:
                answer = ping_answer(request.payload, request.routes or (), self.uuid,
                                     self.rank, request.userid, request.rolemask)
            except ProtocolError as exc:
                return self.respond(request, string_payload(exc.reason), Errno.EPROTO, now)
            return self.respond(request, answer, 0, now)
        if topic == "attr.get":
            try:
                name = str_field(read_json(request.payload), "name", 128)
            except ProtocolError as exc:
                return self.respond(request, string_payload(exc.reason), Errno.EPROTO, now)
            values = {"rank": str(self.rank), "size": str(self.size), "hostname": self.hostname,
                      "version": "%d.%d.%d" % self.version, "broker.uuid": self.uuid}
            if name not in values:
                return self.respond(request, None, Errno.ENOENT, now)
            return self.respond(request, json_payload({"value": values[name], "flags": 1}), 0,
                                now)
        if topic in self.topics:
            return [Deliver(0, request)]
        return self.respond(request, string_payload(
            f"No service matching {topic} is registered"), Errno.ENOSYS, now)

    def _tag(self, topic: str) -> int:
        if len(self.pending) >= self.max_pending:
            raise FluxStateError(f"{len(self.pending)} RPCs in flight (max_pending)")
        tag = self._next_tag
        while tag in self.pending or tag == 0:
            tag = tag % 0xFFFFFFFF + 1
        self._next_tag = tag % 0xFFFFFFFF + 1
        self.pending[tag] = topic
        return tag

    def _up(self, message: Any, now: float) -> Send:
        self._sent = now
        return Send(PARENT, encode(message))

    def _drop(self, why: str) -> list[Output]:
        self.stats["dropped"] += 1
        if self.stats["dropped"] <= 100:
            log.debug("flux-mode rank %d dropped a message: %s", self.rank, why)
        return []


Handler = Callable[[FluxRequest], Payload]


class FluxModeMember:
    """``FluxModeCore`` on a gevent hub: one DEALER to the parent (see the module's
    docstring)::

        member = FluxModeMember("tcp://127.0.0.1:8050", "/etc/flux/curve.cert", rank=1,
                                size=2, hostname="node1").start()
        member.wait_online(10)
        member.register("hello.world", lambda request: {"rank": 1})
    """

    def __init__(self, parent: str, cert: str, *, rank: int, size: int, hostname: str,
                 heartbeat: float = 2.0, max_message: int = 16 << 20,
                 max_serving: int = 1024,
                 version: tuple[int, int, int] = FLUX_VERSION) -> None:
        from ..io.curve import Curve
        from ..io.keys import load_keypair
        from ..io.transport import ZmqTransport
        from ..io.zap import Allowlist

        keypair = load_keypair(cert)  # KeyFileError naming what is wrong
        self.core = FluxModeCore(rank, size, hostname, version=version, heartbeat=heartbeat)
        self.parent = parent
        self.server_key = keypair.public  # every broker of the instance holds this one
        self.transport = ZmqTransport(curve=Curve(keypair, Allowlist(None)))
        self.max_message = max_message
        #: requests being served at once (each its greenlet); past it EAGAIN
        self.max_serving = max_serving
        self._serving = 0
        self.handlers: dict[str, Handler] = {}
        self.refusal: Optional[str] = None
        self._online = gevent.event.Event()
        self._left = gevent.event.Event()
        self._futures: dict[int, gevent.event.AsyncResult] = {}
        self._subscriptions: list[tuple[str, deque[Event], gevent.event.Event]] = []
        self._link: Any = None
        self._greenlets: list[gevent.Greenlet] = []

    @classmethod
    def from_config(cls, path: str, hostname: str, **options: Any) -> "FluxModeMember":
        """The member the flux-core configuration file ``path`` (its ``[bootstrap]``
        and ``[tbon]`` tables, TOML) makes of host ``hostname``: see ``read_config``."""
        place = read_config(path, hostname)
        return cls(place["parent"], place["cert"], rank=place["rank"], size=place["size"],
                   hostname=hostname, **options)

    @property
    def rank(self) -> int:
        return self.core.rank

    def start(self) -> "FluxModeMember":
        link = self.transport.connect(self.core.identity, self.parent, 1000,
                                      server_key=self.server_key, handover=True)
        link.limit = self.max_message
        self._link = link
        self._greenlets = [gevent.spawn(link.serve, self._on_message, None),
                           gevent.spawn(self._run_timer)]
        self._apply(self.core.start(self.transport.now()))
        return self

    def wait_online(self, timeout: Optional[float] = None) -> bool:
        """Wait for the parent's answer to hello; ``FluxStateError`` if it refused."""
        online = self._online.wait(timeout)
        if self.refusal is not None:
            raise FluxStateError(f"refused: {self.refusal}")
        return online and self.core.state == "online"

    def register(self, topic: str, handler: Handler) -> None:
        """Serve ``topic`` with ``handler(request)`` (a ``FluxRequest``, as
        ``FluxOverlay.register``'s): its return value is the answer (a ``FluxError``
        raised answers that error)."""
        self.handlers[topic] = handler
        self.core.topics.add(topic)

    def rpc(self, topic: str, payload: Payload = None, nodeid: int = NODEID_ANY,
            timeout: Optional[float] = None) -> Optional[bytes]:
        """A request to ``nodeid`` through the flux-core tree; its answer's payload
        (``FluxError`` for an error answer or no answer in ``timeout`` seconds)."""
        tag, out = self.core.rpc(topic, to_payload(payload), nodeid, self.transport.now())
        result = self._futures[tag] = gevent.event.AsyncResult()
        self._apply(out)
        try:
            response = result.get(timeout=timeout)
        except gevent.Timeout:
            raise FluxError(Errno.ETIMEDOUT, f"no answer in {timeout:g} s", topic) from None
        finally:
            self._futures.pop(tag, None)
            self.core.pending.pop(tag, None)
        if response.errnum:
            raise FluxError(response.errnum,
                            (response.payload or b"").rstrip(b"\0").decode("utf-8", "replace"),
                            topic)
        return response.payload

    def subscribe(self, prefix: str) -> Callable[[Optional[float]], Optional[Event]]:
        """Events whose topic starts with ``prefix``: a function returning the next one
        (None after ``timeout`` seconds). flux-core sends every event down the tree."""
        queue: deque[Event] = deque(maxlen=SUBSCRIPTION_QUEUE)
        ready = gevent.event.Event()
        self._subscriptions.append((prefix, queue, ready))

        def next_event(timeout: Optional[float] = None) -> Optional[Event]:
            if not queue and not ready.wait(timeout):
                return None
            event = queue.popleft() if queue else None
            if not queue:
                ready.clear()
            return event
        return next_event

    def stop(self, timeout: float = 5.0) -> None:
        """Say goodbye (wait up to ``timeout`` for the answer) and close the link."""
        if self._link is None:
            return
        self._apply(self.core.leave(self.transport.now()))
        self._left.wait(timeout)
        link, self._link = self._link, None
        gevent.killall(self._greenlets, block=False)
        link.close(linger=0.5)

    # --- the driver ------------------------------------------------------------------

    def _on_message(self, first: bytes, rest: list[bytes]) -> None:
        rest.insert(0, first)
        self._apply(self.core.receive(rest, self.transport.now()))

    def _run_timer(self) -> None:
        while True:
            gevent.sleep(min(1.0, self.core.heartbeat / 2))
            self._apply(self.core.timer(self.transport.now()))

    def _apply(self, outputs: list[Output]) -> None:
        for output in outputs:
            if isinstance(output, Send):
                if self._link is not None:
                    self._link.try_send(output.frames)
            elif isinstance(output, Deliver):
                self._deliver(output.message)
            elif isinstance(output, Notice):
                self._notice(output)

    def _deliver(self, message: Any) -> None:
        if isinstance(message, Response):
            future = self._futures.get(message.matchtag)
            if future is not None:
                future.set(message)
        elif isinstance(message, Event):
            for prefix, queue, ready in self._subscriptions:
                if message.topic.startswith(prefix):
                    queue.append(message)
                    ready.set()
        elif isinstance(message, Request):
            if self._serving >= self.max_serving:
                self._apply(self.core.respond(message, string_payload(
                    f"{self.max_serving} requests being served (max_serving)"), Errno.EAGAIN,
                    self.transport.now()))
                return
            self._serving += 1
            gevent.spawn(self._serve, message)

    def _serve(self, message: Request) -> None:
        """Run the handler of ``message`` with a ``FluxRequest``, as ``FluxOverlay``'s
        handlers get: its return value answers unless the handler answered itself."""
        request = FluxRequest(self, message)  # type: ignore[arg-type]  # (its _respond)
        handler = self.handlers.get(message.topic)
        if handler is None:
            self._serving -= 1
            return
        try:
            result = handler(request)
        except FluxError as exc:
            request.error(exc.errnum, exc.message)
        except Exception as exc:  # a handler's bug: an answer, not a silence
            log.exception("flux-mode handler of %s failed", message.topic)
            request.error(Errno.EIO, f"{type(exc).__name__}: {exc}"[:200])
        else:
            if result is not None and not request.finished:
                request.respond(result)
        finally:
            self._serving -= 1

    def _respond(self, request: FluxRequest, payload: Optional[bytes], errnum: int) -> None:
        self._apply(self.core.respond(request.message, payload, errnum, self.transport.now()))

    def _notice(self, notice: Notice) -> None:
        log.debug("flux-mode rank %d: %s %s", notice.rank, notice.what, notice.detail)
        if notice.what == "online":
            self._online.set()
        elif notice.what == "refused":
            self.refusal = str(notice.detail)
            self._online.set()
        elif notice.what in ("left", "parent-lost"):
            self._left.set()
            self._online.set()

