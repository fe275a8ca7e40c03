"""A worker's conversations as sans-io cores: with its broker (NFP/Worker), and with the
clients that reach it directly.

How it works
------------
``WorkerSession`` is a core of ``peermesh.core``: it dials the broker
(``Dial`` of the link ``BROKER_LINK``, a fresh routing identity each
conversation), says OPEN (name, service, node, timing), takes the broker's
OPEN (its ``keepalive`` and ``multiplier`` are adopted, within bounds) and
answers READY; from then on requests from the broker come out as
``Deliver(msg)`` (a decoded POST, GET or DELETE) for the worker to handle,
and what the worker sends goes out through ``send``.

* **Liveness.** Every ``keepalive / 2`` seconds: no command from the broker
  for ``keepalive * multiplier`` seconds and the link is hung up and a new
  conversation starts on a new one; nothing sent for ``keepalive`` seconds
  (and READY) and a KEEPALIVE goes.
* **DISCONNECT** from the broker hangs up; a new conversation starts
  ``keepalive`` seconds later (a broker that keeps refusing is not hammered).
* With ``keys`` (CURVE), the link is a client of the key its node advertised;
  an endpoint whose key is unknown is not dialled (logged).
* Malformed messages, and messages not from a broker, are dropped (logged at
  debug).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable, Hashable, Mapping, Optional, Sequence

from ..core import Deliver, Dial, Hangup, Output, Outputs, Send
from ..counters import Counters
from ..errors import ProtocolError
from ..wire import nfp

__all__ = ["WorkerSession", "DirectDoor", "BROKER_LINK", "server_key"]

log = logging.getLogger(__name__)

#: the name of the link to the broker
BROKER_LINK = "broker"


class WorkerSession(Outputs):
    """One worker's side of the NFP/Worker conversation (see the module docstring)."""

    def __init__(self, name: str, service: str, node_name: str, *, keepalive: float = 1.0,
                 multiplier: int = 3, new_identity: Callable[[], bytes],
                 keys: Optional[Mapping[str, str]] = None,
                 stats: Optional[dict[str, int]] = None) -> None:
        super().__init__()
        #: with CURVE: the public key (Z85) of each endpoint's node; None: no keys
        self.keys = keys
        #: counters: ``broker_connects`` (conversations begun)
        self.stats = stats if stats is not None else {}
        self.stats.setdefault("broker_connects", 0)
        self.name, self.service, self.node_name = name, service, node_name
        self.keepalive = float(keepalive)
        self.multiplier = int(multiplier)
        self.new_identity = new_identity
        self.endpoint: Optional[str] = None
        #: none (no link), opening (OPEN sent), ready (READY sent)
        self.state = "none"
        self.linked = False
        self.since = 0.0
        self.last_recv = 0.0
        self.last_sent = 0.0
        self._beat: Optional[float] = None        # the next liveness check
        self._resume: Optional[float] = None      # a new conversation after DISCONNECT
        self._resume_why = ""

    # --- the core contract ----------------------------------------------

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """A message from the broker."""
        try:
            msg = nfp.decode(frames)
        except ProtocolError as exc:
            log.debug("worker %s: dropped a malformed message from the broker: %s", self.name,
                      exc.reason)
            return self.take()
        if msg.role is not nfp.BROKER:
            log.debug("worker %s: dropped %s with header %s on the broker link", self.name,
                      type(msg).__name__, msg.role.value)
            return self.take()
        if link != BROKER_LINK or not self.linked:
            return self.take()
        self.last_recv = now
        cls = type(msg)
        if cls is nfp.Post or cls is nfp.Get or cls is nfp.Delete:
            if self.state == "ready":
                self._out(Deliver(msg))
        elif isinstance(msg, nfp.Disconnect):
            why = msg.body.decode("utf-8", "replace") or "no reason given"
            self._hangup()
            self._resume = now + self.keepalive
            self._resume_why = f"broker sent DISCONNECT: {why}"
        elif isinstance(msg, nfp.Open) and self.state == "opening":
            self._adopt_timing(msg.body)
            self.state = "ready"
            self._send(nfp.encode(nfp.Ready(self.service)), now)
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        """Liveness, KEEPALIVE, and the new conversation after a DISCONNECT."""
        if self._resume is not None and now >= self._resume:
            self._resume = None
            if self.endpoint is not None and not self.linked:
                self._open(now, self._resume_why)
        if self._beat is not None and now >= self._beat:
            self._beat = now + self.keepalive / 2
            liveness = self.keepalive * self.multiplier
            if now - self.last_recv > liveness:
                self._open(now, f"no command from the broker for {liveness:g}s")
            elif self.state == "ready" and now - self.last_sent >= self.keepalive:
                self._send(nfp.encode(nfp.Keepalive(nfp.WORKER, self.service)), now)
        return self.take()

    def next_deadline(self) -> Optional[float]:
        """The next liveness check, or the new conversation after a DISCONNECT."""
        beat, resume = self._beat, self._resume
        if beat is None:
            return resume
        return beat if resume is None or beat < resume else resume

    # --- the worker's calls ---------------------------------------------

    def connect(self, endpoint: Optional[str], now: float) -> list[Output]:
        """Talk to the broker at ``endpoint`` (None: no broker)."""
        if endpoint == self.endpoint and (endpoint is None or self.linked):
            return self.take()
        self._say_goodbye(b"broker changed", now)
        self.endpoint = endpoint
        self._resume = None
        if endpoint is not None:
            self._open(now)
        return self.take()

    def reconnect(self, why: str, now: float) -> list[Output]:
        """A new conversation on a new link (MMI disconnect/restart)."""
        if self.endpoint is not None:
            self._open(now, why)
        return self.take()

    def stop(self, now: float) -> list[Output]:
        """Say DISCONNECT (if talking) and hang up."""
        self._say_goodbye(b"worker stopping", now)
        self._resume = None
        return self.take()

    def send(self, frames: Sequence[bytes], ready_only: bool, now: float) -> list[Output]:
        """``frames`` to the broker, if linked (and READY, with ``ready_only``)."""
        if self.linked and (not ready_only or self.state == "ready"):
            self._send(frames, now)
        return self.take()

    # --- inside ---------------------------------------------------------

    def _open(self, now: float, why: str = "") -> None:
        if why:
            log.info("worker %s: new conversation with broker %s (%s)", self.name,
                     self.endpoint, why)
        endpoint = self.endpoint
        assert endpoint is not None
        dialable, key = server_key(endpoint, self.keys)
        if not dialable:
            self._hangup()
            return
        self._out(Dial(BROKER_LINK, endpoint, self.new_identity(), key))
        self.linked = True
        self.state = "opening"
        self.last_recv = self.since = now
        self._beat = now + self.keepalive / 2
        self.stats["broker_connects"] += 1
        self._send(nfp.encode(nfp.Open(nfp.WORKER, nfp.encode_body(
            {"name": self.name, "service": self.service, "node": self.node_name,
             "keepalive": self.keepalive, "multiplier": self.multiplier}))), now)

    def _say_goodbye(self, why: bytes, now: float) -> None:
        if self.linked and self.state != "none":
            self._send(nfp.encode(nfp.Disconnect(nfp.WORKER, self.service, why)), now)
        self._hangup()

    def _hangup(self) -> None:
        if self.linked:
            self._out(Hangup(BROKER_LINK))
        self.linked = False
        self.state = "none"
        self._beat = None

    def _send(self, frames: Sequence[bytes], now: float) -> None:
        self.last_sent = now
        self._out(Send(BROKER_LINK, frames))

    def _adopt_timing(self, body: bytes) -> None:
        try:
            data = nfp.decode_body(body)
        except ProtocolError:
            return
        keepalive, multiplier = data.get("keepalive"), data.get("multiplier")
        if isinstance(keepalive, (int, float)) and 0.01 <= keepalive <= 3600:
            self.keepalive = float(keepalive)
        if isinstance(multiplier, int) and 2 <= multiplier <= 100:
            self.multiplier = multiplier


def server_key(endpoint: str, keys: Optional[Mapping[str, str]]) -> tuple[bool, Optional[bytes]]:
    """Whether ``endpoint`` may be dialled, and the CURVE server key to dial it with: with
    ``keys`` (a mesh with keys: each endpoint's node's authenticated ``X-PUBLICKEY``) the
    key held for it, and not at all (logged) when none is; ``inproc://`` needs no key."""
    if keys is None or endpoint.startswith("inproc://"):
        return True, None
    key = keys.get(endpoint)
    if key is None:
        log.warning("not connecting to %s: the public key of its node is unknown", endpoint)
        return False, None
    return True, key.encode()


class DirectDoor(Outputs):
    """A worker's own ROUTER, for clients without a broker, as a core: a request comes out
    as ``Deliver((identity, key, msg))`` (``key``: the CURVE key it came with, on a mailbox
    read with ``User-Id``), OPEN is answered at once, anything else is dropped.

    Bounds: the clients heard are remembered for ``show_clients``, at most
    ``max_clients`` (the least recently heard is forgotten, counted in ``limits``);
    requests whose target is over ``MAX_TARGET`` are dropped and counted.
    """

    def __init__(self, name: str, service: str, max_clients: int, limits: Counters) -> None:
        super().__init__()
        self.name, self.service = name, service
        self.max_clients = max_clients
        self.limits = limits
        #: direct clients by identity: when last heard, least recently heard first
        self.clients: OrderedDict[bytes, float] = OrderedDict()

    def receive(self, link: Hashable, frames: list[bytes], now: float) -> list[Output]:
        """A message on the worker's ROUTER from ``link`` (identity, or (identity, key))."""
        identity, key = link if type(link) is tuple else (link, None)
        try:
            msg = nfp.decode(frames)
        except ProtocolError as exc:
            if isinstance(exc, nfp.TargetTooLong):
                self.limits.over("max_target", f"worker {self.name} dropped a request: "
                                 f"{exc.reason}")
            else:
                log.debug("worker %s: dropped a malformed message: %s", self.name, exc.reason)
            return self.take()
        if not isinstance(msg, (nfp.Post, nfp.Get, nfp.Delete)) or msg.role is not nfp.CLIENT:
            if isinstance(msg, nfp.Open) and msg.role is nfp.CLIENT:
                self._out(Send(identity, nfp.encode(nfp.Open(nfp.WORKER, nfp.encode_body(
                    {"name": self.name, "service": self.service})))))
            return self.take()
        clients = self.clients
        clients[identity] = now
        clients.move_to_end(identity)
        if len(clients) > self.max_clients:
            clients.popitem(last=False)
            self.limits.over("max_clients", f"worker {self.name} forgot its least recently "
                             f"heard direct client ({self.max_clients} remembered)")
        self._out(Deliver((identity, key, msg)))
        return self.take()

    def handle_timer(self, now: float) -> list[Output]:
        """Nothing waits on time here."""
        return []

    def next_deadline(self) -> Optional[float]:
        """None: only messages move it."""
        return None
