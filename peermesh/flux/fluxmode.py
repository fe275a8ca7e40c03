"""A peermesh rank inside a flux-core tree ("flux mode"): a broker of flux-core's overlay,
at any place of it: a leaf, a rank with flux-core brokers below it, or rank 0.

How it works
------------
A flux-core instance booted from a configuration file lists its hosts
(``[[bootstrap.hosts]]``), their ranks follow the list and ``tbon.topo``, and
every broker holds the instance's CURVE certificate (``flux keygen``'s file:
a ZeroMQ certificate, as ``peermesh.io.keys`` reads it). ``FluxModeCore``
(sans-io, ``peermesh.flux.fluxrank``) is one such rank; ``FluxModeMember``
drives it on a gevent hub: a DEALER to its parent's ``connect`` URI (a CURVE
client of the certificate's own public key, as flux-core's brokers are) unless
it is rank 0, and a ROUTER on its ``bind`` URI when the topology gives it
children (a CURVE server admitting the certificate's key alone).
``FluxModeMember.from_config`` reads its place from the instance's own
configuration file (``read_config``).

What a parent (flux-core 0.88) expects, and what it gets:

- the DEALER's ZeroMQ identity is the rank's UUID as a 36-character string;
- first an ``overlay.hello`` request, rolemask OWNER, body ``{"rank",
  "version", "uuid", "status", "hostname"}``: version ``0xMMmmpp`` (the
  parent compares MAJOR.MINOR: ``FLUX_VERSION``), status the subtree's (full
  for a leaf, partial until its children are), hostname the one the
  configuration gives the rank. The answer ``{"uuid"}`` names the parent; an
  error answer (a hostname or rank the configuration does not have, a version
  mismatch) stops the rank with ``Notice("refused")`` naming the parent's
  message;
- everything sent upstream carries flag ROUTE and a route stack, CONTROL
  messages included (without it the parent drops them as malformed); a
  CONTROL STATUS goes up whenever the subtree's status changes, a CONTROL
  HEARTBEAT when nothing else was sent for ``heartbeat`` seconds (flux-core's
  ``torpid_min`` is 5 s);
- requests are routed as flux-core's brokers route them (``fluxrank``); this
  rank serves ``broker.ping`` (flux's body and answer), ``attr.get``
  (``rank``, ``size``, ``hostname``, ``version``, ``broker.uuid``),
  ``overlay.health`` and ``overlay.topology`` (what ``flux overlay status``
  walks), ``state-machine.monitor`` and ``config.get`` (what a flux-core child
  asks its parent), and the ``service.method`` topics registered; anything
  else addressed to it gets ENOSYS with flux-core's message;
- events come down from the parent, go to the subscriptions they match and
  on to every child;
- a CONTROL DISCONNECT from the parent ends the rank (``Notice("parent-lost")``);
- leaving is as a flux-core broker's: the children's ``state-machine.monitor``
  streams are told SHUTDOWN (each child shuts down and says ``overlay.goodbye``),
  then ``overlay.goodbye`` to the parent (answered by the parent, which marks the
  rank offline), then the links close.

What a flux-core child expects of its parent, and gets: its ``overlay.hello``
checked (a rank that is its child, the configuration's hostname for it,
MAJOR.MINOR) and answered ``{"uuid"}``; ``state-machine.monitor`` answered
with the parent's state (run; shutdown when it leaves); ``config.get``
answered with the configuration file; CONTROL STATUS and heartbeats taken;
``overlay.goodbye`` answered; events sent down. Rank 0 serves besides
``event.publish`` (events numbered from 1), and takes ``groups.update`` and
``log.append`` (which want no answer); other services (``kvs``,
``job-manager``, ...) are answered ENOSYS naming what it serves, so a child
whose ``rc1`` loads modules needing them fails its ``rc1`` and stops.

Bounds: RPCs of this rank in flight (``max_pending``, past it
``FluxStateError``), requests being served at once (``max_serving``, past
it EAGAIN), streams kept for updates (``max_waiters``, past it EAGAIN),
requests sent to a child and not answered, kept to fail them EHOSTUNREACH if
it goes (``FluxModeCore.max_inflight`` per child, past it not kept),
subscriptions' queues (``SUBSCRIPTION_QUEUE`` events each, the oldest
dropped), messages of at most ``max_message`` octets, children (those of the
topology; any other is refused).
"""

from __future__ import annotations

import errno
import logging
from collections import deque
from typing import Any, Callable, Optional, Sequence

import gevent
import gevent.event
import zmq

from ..io.zap import Allowlist
from ..wire.flux import NODEID_ANY, Errno, EventMessage, Request, Response, string_payload
from .errors import FluxError, FluxStateError
from .fluxrank import FLUX_VERSION, STATUS_FULL, FluxModeCore
from .fluxtree import read_config
from .handle import SUBSCRIPTION_QUEUE, FluxRequest, Payload, to_payload
from .outputs import PARENT, Deliver, Emit, Notice, Output, Send

__all__ = ["FluxModeCore", "FluxModeMember", "read_config", "FLUX_VERSION", "STATUS_FULL"]

log = logging.getLogger(__name__)

Handler = Callable[[FluxRequest], Payload]


class InstanceKey(Allowlist):
    """An allowlist of one key: the instance certificate's (config boot's CURVE)."""

    def __init__(self, key: bytes) -> None:
        super().__init__(None)
        self.keys = frozenset({key})

    @property
    def any_key(self) -> bool:
        return False

    def allows(self, key: bytes) -> bool:
        return key in self.keys

    def refresh(self) -> bool:
        return False


class FluxModeMember:
    """``FluxModeCore`` on a gevent hub (see the module's docstring)::

        member = FluxModeMember("tcp://127.0.0.1:8050", "/etc/flux/curve.cert", rank=1,
                                size=2, hostname="node1").start()
        member.wait_online(10)
        member.register("hello.world", lambda request: {"rank": 1})

    ``parent`` is None for rank 0; ``bind`` is where children connect (needed when
    ``parents`` gives this rank children; ``hosts`` the hostname of each rank)."""

    def __init__(self, parent: Optional[str], cert: str, *, rank: int, size: int,
                 hostname: str, bind: Optional[str] = None,
                 parents: Optional[Sequence[int]] = None, hosts: Optional[Sequence[str]] = None,
                 config: Optional[dict[str, Any]] = None, heartbeat: float = 2.0,
                 max_message: int = 16 << 20, max_serving: int = 1024, max_waiters: int = 1024,
                 version: tuple[int, int, int] = FLUX_VERSION) -> None:
        from ..io.curve import Curve
        from ..io.keys import load_keypair
        from ..io.transport import ZmqTransport

        keypair = load_keypair(cert)  # KeyFileError naming what is wrong
        self.core = FluxModeCore(rank, size, hostname, parents=parents, hosts=hosts,
                                 config=config, version=version, heartbeat=heartbeat,
                                 max_waiters=max_waiters)
        if (parent is None) != (rank == 0):
            raise FluxStateError("rank 0 has no parent URI; every other rank has one")
        if self.core.children and bind is None:
            raise FluxStateError(f"rank {rank} has children: it needs a bind URI")
        self.parent = parent
        self.bind = bind
        self.server_key = keypair.public  # every broker of the instance holds this one
        self.transport = ZmqTransport(curve=Curve(keypair, InstanceKey(keypair.public)))
        self.max_message = max_message
        #: requests being served at once (each its greenlet); past it EAGAIN
        self.max_serving = max_serving
        self._serving = 0
        self.handlers: dict[str, Handler] = {}
        self.refusal: Optional[str] = None
        self._online = gevent.event.Event()
        self._left = gevent.event.Event()
        self._futures: dict[int, gevent.event.AsyncResult] = {}
        self._subscriptions: list[tuple[str, deque[EventMessage], gevent.event.Event]] = []
        self._link: Any = None
        self._router: Any = None
        self._greenlets: list[gevent.Greenlet] = []

    @classmethod
    def from_config(cls, path: str, hostname: str, **options: Any) -> "FluxModeMember":
        """The member the flux-core configuration file ``path`` (its ``[bootstrap]``
        and ``[tbon]`` tables, TOML) makes of host ``hostname``: see ``read_config``."""
        place = read_config(path, hostname)
        return cls(place["parent"], place["cert"], rank=place["rank"], size=place["size"],
                   hostname=hostname, bind=place["bind"], parents=place["parents"],
                   hosts=place["hosts"], config=place["config"], **options)

    @property
    def rank(self) -> int:
        return self.core.rank

    def start(self) -> "FluxModeMember":
        if self.core.children:
            router = self.transport.bind_mailbox("127.0.0.1", self.max_message, self.bind,
                                                 handover=True)
            router.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone child: EHOSTUNREACH
            self._router = router
            self._greenlets.append(gevent.spawn(router.serve, self._on_child, None, None))
        if self.parent is not None:
            link = self.transport.connect(self.core.identity, self.parent, 1000,
                                          server_key=self.server_key, handover=True)
            link.limit = self.max_message
            self._link = link
            self._greenlets.append(gevent.spawn(link.serve, self._on_message, None))
        self._greenlets.append(gevent.spawn(self._run_timer))
        self._apply(self.core.start(self.transport.now()))
        return self

    def wait_online(self, timeout: Optional[float] = None) -> bool:
        """Wait for the parent's answer to hello; ``FluxStateError`` if it refused."""
        online = self._online.wait(timeout)
        if self.refusal is not None:
            raise FluxStateError(f"refused: {self.refusal}")
        return online and self.core.state == "online"

    @property
    def ended(self) -> gevent.event.Event:
        """Set once the rank is out of the tree: it left, its parent shut down or
        dropped it, or the parent refused it."""
        return self._left

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

    def subscribe(self, prefix: str) -> Callable[[Optional[float]], Optional[EventMessage]]:
        """Events whose topic starts with ``prefix``: a function returning the next one
        (None after ``timeout`` seconds). flux-core sends every event down the tree."""
        queue: deque[EventMessage] = deque(maxlen=SUBSCRIPTION_QUEUE)
        ready = gevent.event.Event()
        self._subscriptions.append((prefix, queue, ready))

        def next_event(timeout: Optional[float] = None) -> Optional[EventMessage]:
            if not queue and not ready.wait(timeout):
                return None
            event = queue.popleft() if queue else None
            if not queue:
                ready.clear()
            return event
        return next_event

    def publish(self, topic: str, payload: Payload = None, timeout: Optional[float] = None
                ) -> int:
        """Publish an event to the whole instance; its sequence number. Rank 0 numbers
        it itself; another rank asks rank 0 (``event.publish``, flux's body)."""
        if self.rank == 0:
            self._apply(self.core.publish(topic, to_payload(payload), self.transport.now()))
            return self.core.seq
        from .bodies import publish_body
        from ..wire.flux import read_json
        answer = self.rpc("event.publish", publish_body(topic, to_payload(payload)), 0, timeout)
        return int(read_json(answer)["seq"])

    def stop(self, timeout: float = 5.0) -> None:
        """Leave: the children are told this rank shuts down and say goodbye (waited for
        up to ``timeout``), then goodbye to the parent (its answer waited for up to
        ``timeout``); then the links close."""
        if not self._greenlets:
            return
        now = self.transport.now
        self._apply(self.core.leave(now()))
        if not self._left.wait(timeout) and self.core.state == "draining":
            log.info("flux-mode rank %d: children still online after %g s: leaving without "
                     "them", self.rank, timeout)
            self._apply(self.core.leave(now(), force=True))
            self._left.wait(timeout)
        gevent.killall(self._greenlets, block=False)
        self._greenlets = []
        link, self._link = self._link, None
        router, self._router = self._router, None
        if link is not None:
            link.close(linger=0.5)
        if router is not None:
            router.close(linger=0.5)

    # --- the driver ------------------------------------------------------------------

    def _on_message(self, first: bytes, rest: list[bytes]) -> None:
        rest.insert(0, first)
        self._apply(self.core.receive(rest, self.transport.now()))

    def _on_child(self, identity: bytes, frames: list[bytes]) -> None:
        self._apply(self.core.receive_child(identity, frames, self.transport.now()))

    def _run_timer(self) -> None:
        while True:
            gevent.sleep(min(1.0, self.core.heartbeat / 2))
            self._apply(self.core.timer(self.transport.now()))

    def _apply(self, outputs: list[Output]) -> None:
        for output in outputs:
            if isinstance(output, Send):
                if output.link == PARENT:
                    if self._link is not None:
                        self._link.try_send(output.frames)
                elif self._router is not None:
                    try:
                        self._router.try_send(output.frames)
                    except zmq.ZMQError as exc:  # (ROUTER_MANDATORY) the child is gone
                        if exc.errno != errno.EHOSTUNREACH:
                            raise
                        assert isinstance(output.link, bytes)
                        self._apply(self.core.child_lost(output.link, self.transport.now()))
            elif isinstance(output, Deliver):
                self._deliver(output.item[1])
            elif isinstance(output, Emit):
                self._notice(output.event)

    def _deliver(self, message: Any) -> None:
        if isinstance(message, Response):
            future = self._futures.get(message.matchtag)
            if future is not None:
                future.set(message)
        elif isinstance(message, EventMessage):
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
            self._left.set()
        elif notice.what in ("left", "parent-lost"):
            self._left.set()
            self._online.set()

