"""The MTL gateway on a peermesh node: the thin gevent driver of the control and data cores.

How it works
------------
``Gateway`` is an ``Overlay``. At ``attach`` it binds two ROUTER sockets
(through ``peermesh.io``: ``make_socket``, ``bind``/``bind_ephemeral``,
``HubSocket``), one per flow, because the flows differ in everything a
socket is tuned for: the control flow carries REQ envelopes (an empty
delimiter frame) of small JSON requests, the data flow DEALER traffic of
any size at a high rate; its port is the one every 202 names. It
advertises them in the HELLO header ``X-PM-MTL-GATEWAY`` (JSON
``{"control": endpoint, "data": endpoint}``), so that every node, and every
client through the 201's ``"gateways"``, knows where the gateways of the
mesh are.

``run="always"`` serves from ``start`` to ``stop``. ``run="elected"`` (the
default) serves only while the node is the elected broker
(``peermesh.overlay.broker.BrokerTracker``, candidate ``broker`` with
``priority``): a gateway not (or no longer) elected answers every control
request 503 naming the elected gateway's control endpoint, drops data
commands, and forgets its sessions and leases when it steps down. Clients
move to the gateway the 503 or the 201's list names and open their leases
there again.

Confirmed content is copied to the standby gateways (``run="elected"``,
not elected), whispered over the mesh between gateways only::

    standby -> serving, to join it:
    MTL-HANDOFF    | group | id (8) | cid (16) | field table | body   ; what the standby holds
    MTL-HANDOFF-END | id (8) | count (8)        ; end of a batch of count contents
    MTL-HANDOFF-OK | id (8)                     ; all of it stored (or known) and committed
    MTL-SYNC       | copy (8)                   ; then: send me everything (asked again
                                                ; each heartbeat until the copy starts)
    serving -> standby:
    MTL-REPL       [| group | cid (16) | field table | body]...   ; contents to copy
    MTL-FORGET     | cid (16) ...                ; confirmed or dropped: delete the copies
    MTL-MARK       | number (8) | copy (8) or empty   ; commit, and answer (with the
                                                ; copy's number: the copy is complete)
    MTL-MARK-OK    | number (8)                  ; (standby -> serving)
    MTL-RESYNC                                  ; you fell behind: join again

A standby that sees a gateway serve joins it: it offers everything it holds
(``MTL-HANDOFF`` batches of ``HANDOFF_BATCH``, acknowledged within
``REPLICA_WAIT``; the serving gateway stores what it does not know, by
content id, see ``peermesh.mtl.store``), then asks for a copy
(``MTL-SYNC``). The serving gateway sends it its whole store in acknowledged
batches (``MTL-REPL``, ``MTL-MARK``); the last mark ends the copy: the
standby deletes whatever it holds that was not in it (content a reader
confirmed meanwhile) and is a *replica* from then on. A batch or a mark is
acknowledged only if everything before it was stored: a content the
receiver could not store (its store full, its queue of mesh events full)
leaves the batch unacknowledged (offered again later) or, on a replica,
ends the copy (``MTL-RESYNC`` to the serving gateway; it copies again).

After each commit the serving gateway sends its replicas what the commit
wrote and, to replicas and standbys being copied, the content ids readers
confirmed or dropped; then
every answer to a ``confirm: full`` link from that batch (a writer's Confirm,
a reader's Content, Pong ...) is held back until one replica acknowledged
the batch's mark. So a writer's Confirm means the content is committed on two
gateways, and an answered Ping means what the reader confirmed before it is
deleted on both. A replica that does not acknowledge within ``REPLICA_WAIT``
(or leaves) stops being one (``MTL-RESYNC``); with no replica left, answers
go after the local commit alone. The state and decisions of both sides are
sans-io cores in ``peermesh.mtl.replication``: ``Replicas`` (which standbys
are replicas, the marks, the held answers), ``Follower`` (a standby's copy:
what it stores, when it is complete, broken or stalled) and ``Offers`` (what
is offered, and whether a batch may be acknowledged); the gateway whispers
and sends what they decide.

Greenlets on the node's hub, each a thin loop around the sans-io cores:

* control reader: each batch of requests -> ``ControlFlow.handle``, the
  reply sent at once (the core decides; the driver only strips and adds
  the ROUTER identity and REQ's empty delimiter);
* data reader: each batch of commands -> ``DataFlow.handle``, then
  ``DataFlow.flush`` (one store commit per batch: the group commit behind
  ``confirm: full``), then the sends and mesh actions;
* mesh: the group shouts and gateway whispers the node hears (a listener
  queues them, in order) -> ``DataFlow.shouted``, the store, the marks; a
  flush per batch (then the handovers are acknowledged);
* join (a standby: offer, then ask for a copy) and one copy per standby
  being copied (while serving): see above;
* timer: ``DataFlow.tick`` (heartbeats, dead links, lease expiry),
  ``ControlFlow.expire``, and a credentials-file check every second (users
  changed: their leases are revoked, their sessions answered 401).

On keys: on a node with keys (CURVE) both ROUTERs are CURVE servers with the
node's keypair, so clients need only the gateway's public key. They admit
any client key (ZAP domain ``MTL_DOMAIN``, not the node's allowlist):
clients off the LAN are many and come and go, and SASL authenticates the
user. SASL PLAIN, which sends the password, is offered by default only
then (``plain=None``); ``plain=True`` offers it on a plain link too.

Bounds: at most ``MAX_QUEUED`` mesh events wait for the mesh greenlet (more
are dropped: shouts are best effort, a handover is sent again); a control
request is at most ``MAX_REQUEST`` + 1 KiB (libzmq drops
a peer that sends more: ``MAXMSGSIZE``) and of at most 4 frames; a data
command at most ``max_content`` bytes (default 16 MiB) and 2 frames; a
peer's send queue holds ``SNDHWM`` messages (beyond that ROUTER drops, so
a stalled client never stalls the gateway). Sessions, leases and links are
bounded by the cores.

Kept whole: one driver (``Gateway``): its greenlets drive the control, data and
replication cores, which share one store and one commit (an answer waits for a replica's
mark).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence
from uuid import UUID

import gevent
import gevent.event
import zmq

from ..counters import Counters
from ..events import Event, EventType
from ..io import HubSocket, bind, bind_ephemeral, make_socket, shared_context
from ..io.connections import GuardedListener
from ..io.curve import Curve, shared_allowlist
from ..io.socket import BATCH
from ..overlay import Overlay, PeerNetworks, header_endpoint
from ..overlay.broker import BrokerTracker
from ..overlay.election import Change
from ..errors import PeermeshError, ProtocolError
from ..wire import mtl_replication as repl
from ..wire.mtl import MAX_REQUEST, Failure, Status, encode_reply
from ..wire.mtl_replication import (  # (the kinds are importable from here too, as before)
    FORGET, HANDOFF, HANDOFF_END, HANDOFF_OK, MARK, MARK_OK, REPL, RESYNC, SYNC, Forget,
    Handoff, HandoffEnd, HandoffOk, Mark, MarkOk, Repl, Resync, Sync,
)
from .control import ControlFlow
from .credentials import Authenticator, CredentialsError, CredentialsFile
from .dataflow import DataFlow, MeshAction, MeshJoin, MeshShout
from .delivery import DurableQueues
from .replication import Follower, Offers, Replicas
from .store import ContentStore, open_gateway_store

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["Gateway", "GATEWAY_HEADER", "MTL_DOMAIN", "parse_gateway_header"]

log = logging.getLogger(__name__)

#: ZAP domain of the gateways' CURVE sockets: any client key is admitted there
MTL_DOMAIN = "peermesh-mtl"
#: HELLO header of a node running a gateway: JSON ``{"control": endpoint, "data": endpoint}``
GATEWAY_HEADER = "X-PM-MTL-GATEWAY"
RUNS = ("always", "elected")
MAX_CONTENT = 16 * 1024 * 1024
SNDHWM = 10_000
_REFRESH_EVERY = 1.0
#: whispers between gateways (``peermesh.wire.mtl_replication``) handled on the mesh greenlet
_QUEUED_KINDS = repl.KINDS - {HANDOFF_OK}
#: contents per offered or copied batch
HANDOFF_BATCH = 256
#: seconds a batch, a mark or a copy under way may go unanswered
REPLICA_WAIT = 10.0
_FORGET_MAX = 4096     # content ids per MTL-FORGET
COPY_BATCH = 256       # contents per MTL-REPL
COPY_BYTES = 4 * 1024 * 1024   # octets per MTL-REPL, roughly (one content may pass it)
#: mesh events (shouts, handovers) waiting for the mesh greenlet; beyond, new ones are dropped
MAX_QUEUED = 100_000


def _replication(frames: Sequence[bytes]) -> Optional[repl.ReplicationMessage]:
    """The replication message in a whisper from another gateway; None if ill-formed
    (ignored: only gateways send these)."""
    try:
        return repl.decode(frames)
    except ProtocolError:
        return None


def parse_gateway_header(raw: Optional[str]) -> Optional[str]:
    """The control endpoint in an ``X-PM-MTL-GATEWAY`` value; None if absent or malformed."""
    return header_endpoint(raw, "control", GATEWAY_HEADER)


def _mechanisms(plain: bool) -> tuple[str, ...]:
    return ("SCRAM-SHA-256", "PLAIN") if plain else ("SCRAM-SHA-256",)


def _endpoint(address: str, port: int) -> str:
    return f"tcp://{address}:{port}"


class Gateway(Overlay):
    """An 11/MTL gateway riding on one node (see the module doc)."""

    roles = ("mtl-gateway",)

    def __init__(self, credentials: "CredentialsFile | os.PathLike[str] | str", *,
                 address: str = "127.0.0.1", control_port: int = 0, data_port: int = 0,
                 run: str = "elected", broker: str = "auto", priority: int = 0,
                 data_dir: "Optional[os.PathLike[str] | str]" = None,
                 virtual_hosts: Optional[Mapping[str, str]] = None,
                 profiles: Sequence[str] = ("test", "mesh"), plain: Optional[bool] = None,
                 anonymous: bool = False, heartbeat: float = 1.0, liveness: int = 3,
                 lease_ttl: float = 30.0, session_lifetime: Optional[float] = None,
                 max_content: int = MAX_CONTENT, settle: Optional[float] = None,
                 peer_networks: Optional[Sequence[str]] = None,
                 on_state: Optional[Callable[[str], None]] = None,
                 queues: Optional[Callable[[ContentStore], DurableQueues]] = None,
                 local: Optional[Callable[[str], bool]] = None) -> None:
        """``peer_networks``: networks (CIDR) the control endpoints other gateways
        advertise must be in to be used or handed to clients (default: the network
        of the node's interface). ``on_state(state)``, if given, is called on the
        node's hub with ``"serving"`` or ``"standing-by"`` each time the gateway starts
        or stops serving (``run="elected"``), and with ``"replica"`` when a standby
        holds a copy of the serving gateway's content and follows it. ``queues``: what
        makes the ``confirm: full`` side from the store (default ``DurableQueues``; a
        subclass may put confirmed content elsewhere, as the Spark driver's log does).
        ``local(group)``: true for the mesh profile's resources that ``queues`` serves
        itself (the Spark driver's service calls): never joined, left or shouted into
        on the mesh."""
        super().__init__()
        if run not in RUNS:
            raise ValueError(f"run must be one of {', '.join(RUNS)}, not {run!r}")
        self.credentials = credentials if isinstance(credentials, CredentialsFile) \
            else CredentialsFile(credentials)
        self._plain = plain  # None: PLAIN only on CURVE (decided at attach)
        self.authenticator = Authenticator(self.credentials, _mechanisms(bool(plain)))
        #: the CURVE servers' keys (the node's keypair, any client key), on a node with keys
        self.curve: Optional[Curve] = None
        self.address = address
        self.run = run
        self.max_content = max_content
        self._on_state = on_state
        self._ports = (control_port, data_port)
        self._data_dir = data_dir
        self._make_queues: Callable[[ContentStore], DurableQueues] = queues or DurableQueues
        self._local = local
        self._core_options: dict[str, Any] = dict(
            virtual_hosts=dict(virtual_hosts) if virtual_hosts is not None else None,
            profiles=profiles, plain=bool(plain), anonymous=anonymous,
            session_lifetime=session_lifetime)
        self._flow_options: dict[str, Any] = dict(heartbeat=heartbeat, liveness=liveness,
                                                  lease_ttl=lease_ttl)
        self.tracker = BrokerTracker(broker if run == "elected" else "never", priority,
                                     settle=settle, on_change=self._on_change,
                                     on_peer_entered=self._peer_entered,
                                     on_peer_left=self._peer_left)
        self.control_endpoint = ""
        self.data_endpoint = ""
        self.store: Optional[ContentStore] = None
        self.data: Optional[DataFlow] = None
        self.control: Optional[ControlFlow] = None
        #: whether this gateway serves now (always, or while elected)
        self.active = run == "always"
        self._peers: dict[UUID, str] = {}       # peer -> its gateway's control endpoint
        #: refusals by limit: ``peer_networks`` (gateways' endpoints outside them)
        self.limits = Counters(log, "MTL gateway hit its limits")
        self.peer_networks = PeerNetworks(peer_networks, self.limits)
        self._sockets: list[GuardedListener] = []
        self._greenlets: list[gevent.Greenlet] = []
        self._shouts: deque[Event] = deque()
        self._shouted = gevent.event.Event()
        self._dropped_logged = 0.0
        # standby: joining the serving gateway, then copying from it
        self._joining: Optional[gevent.Greenlet] = None
        self._handoff_peer: Optional[UUID] = None
        self._acked = 0                           # highest id the serving one took
        self._follower: Optional[Follower] = None   # the copy from the serving one
        self._offers: Optional[Offers] = None     # what other gateways offer this one
        # serving: the standbys copied to
        self._replicas = Replicas(REPLICA_WAIT)   # and the answers held for them
        self._copies: dict[UUID, gevent.Greenlet] = {}
        self._answer = gevent.event.Event()       # replaced (after set) on each answer

    # --- the overlay contract -----------------------------------------------------

    def on_attach(self, node: "Node") -> None:
        """Bind both sockets and advertise them in ``X-PM-MTL-GATEWAY``."""
        if node.curve is not None:
            self.curve = Curve(node.curve.keypair, shared_allowlist(None), MTL_DOMAIN)
            if self._plain is None:  # the link is encrypted: PLAIN is safe to offer
                self.authenticator = Authenticator(self.credentials, _mechanisms(True))
                self._core_options["plain"] = True
        self._control_sock = self._bind(0, MAX_REQUEST + 1024, 3)
        self._sockets = [self._control_sock]
        try:
            self._data_sock = self._bind(1, self.max_content + 1024, 2)
        except BaseException:
            self._control_sock.close()
            raise
        self._sockets.append(self._data_sock)
        self.control_endpoint = self._control_sock.endpoint
        self.data_endpoint = self._data_sock.endpoint
        node.set_header(GATEWAY_HEADER, json.dumps(
            {"control": self.control_endpoint, "data": self.data_endpoint},
            separators=(",", ":")))
        self.tracker.attach(node)

    def _bind(self, which: int, limit: int, frames: int) -> GuardedListener:
        sock = make_socket(zmq.ROUTER, {zmq.MAXMSGSIZE: limit, zmq.SNDHWM: SNDHWM,
                                        zmq.RCVHWM: SNDHWM}, curve=self.curve)
        try:
            port = self._ports[which]
            endpoint = bind(sock, _endpoint(self.address, port)) if port \
                else bind_ephemeral(sock, self.address)
        except BaseException:
            sock.close(linger=0)
            raise
        # any key may connect (users authenticate by SASL): the connection policy bounds
        # the connections, there are no keys to revoke
        return GuardedListener(HubSocket(sock, endpoint=endpoint, limit=limit, max_frames=frames),
                               self.limits)

    def on_start(self) -> None:
        node = self._node()
        if self._data_dir is not None:
            self.store = open_gateway_store(self._data_dir, node.config.name)
        queues = self._make_queues(self.store) if self.store is not None else None
        if queues is not None:
            self._follower = Follower(queues, REPLICA_WAIT)
            self._offers = Offers(queues)
        if self.store is not None:
            self.store.record = self.active
        self.data = DataFlow(still_valid=self.credentials.still_valid, queues=queues,
                             batch_shouts=True, **self._flow_options)
        self.control = ControlFlow(self.authenticator, self.data, gateways=self.gateways,
                                   **self._core_options)
        self.control.data_port = self._data_sock.port
        node.add_listener(self._on_node_event)
        self.tracker.start()
        self._greenlets = [gevent.spawn(self._control_reader), gevent.spawn(self._data_reader),
                           gevent.spawn(self._mesh_reader), gevent.spawn(self._timer)]

    def stop(self, timeout: float = 1.0) -> None:
        """Stop serving (idempotent); the sockets close even if it never started."""
        super().stop(timeout)
        for sock in self._sockets:
            sock.close()
        if self.curve is not None:
            self.curve.release(shared_context())

    def on_stop(self, timeout: float) -> None:
        node = self._node()
        try:
            node.remove_listener(self._on_node_event)
        except ValueError:
            pass
        self.tracker.stop(timeout)
        greenlets, self._greenlets = self._greenlets, []
        greenlets += [g for g in (self._joining, *self._copies.values()) if g is not None]
        gevent.killall(greenlets, block=True, timeout=timeout)
        for sock in self._sockets:
            sock.close()
        if self.data is not None and self.data.queues is not None:
            self.data.queues.close()
        self.store = None

    def _node(self) -> "Node":
        assert self.node is not None
        return self.node

    # --- who serves -------------------------------------------------------------------

    def _on_change(self, change: Change) -> None:
        if self.run == "always":
            return
        elected = change.new is not None and change.new.uuid == self._node().uuid
        if elected != self.active:
            self.active = elected
            log.info("MTL gateway %s: %s", self.control_endpoint,
                     "serving (elected)" if elected else "standing by")
            self._state("serving" if elected else "standing-by")
            if self.store is not None:
                self.store.record = elected
                self.store.committed, self.store.deleted = [], []
            if self._follower is not None:
                self._follower.stop()
            if not elected and self.data is not None and self.control is not None:
                for token in list(self.data.grants):
                    self.data.revoke(token)
                self.control.sessions.clear()
                self._settle()
                self._stop_copying()
        if not elected:
            self._join_later()

    def _peer_entered(self, uuid: UUID, headers: Mapping[str, str], name: str) -> None:
        endpoint = parse_gateway_header(headers.get(GATEWAY_HEADER))
        if endpoint is not None and self.peer_networks.admit(
                endpoint, self.node, f"MTL gateway endpoint of {name}"):
            self._peers[uuid] = endpoint

    def _peer_left(self, uuid: UUID) -> None:
        self._peers.pop(uuid, None)
        self._replicas.forget(uuid)
        copy = self._copies.pop(uuid, None)
        if copy is not None:
            copy.kill(block=False)
        self._release()

    def _state(self, state: str) -> None:
        if self._on_state is not None:
            self._on_state(state)

    def metrics(self) -> Any:
        """``Overlay.metrics`` plus sessions, logins by result, links, leases (grants),
        replicas, contents (received from writers, delivered to readers, stored,
        confirmed) and what waits for a confirm (contents, octets, handed out, the
        oldest one's age)."""
        yield from super().metrics()
        control, data = self.control, self.data
        yield "mtl_sessions", {}, len(control.sessions) if control is not None else 0
        for result, count in (control.logins.items() if control is not None else ()):
            yield "mtl_logins_total", {"result": result}, count
        yield "mtl_links", {}, len(data.links) if data is not None else 0
        yield "mtl_leases", {}, len(data.grants) if data is not None else 0
        yield "mtl_replicas", {}, len(self.replicas)
        store = self.store
        for what, count in (("received", data.received if data is not None else 0),
                            ("delivered", data.delivered if data is not None else 0),
                            ("stored", store.stored if store is not None else 0),
                            ("confirmed", store.confirmed if store is not None else 0)):
            yield "mtl_contents_total", {"what": what}, count
        yield "mtl_stored_contents", {}, store.count if store is not None else 0
        yield "mtl_stored_bytes", {}, store.size if store is not None else 0
        yield "mtl_unconfirmed_contents", {}, store.handed_out if store is not None else 0
        yield ("mtl_oldest_content_age_seconds", {},
               store.oldest_age() if store is not None else 0.0)

    @property
    def replicas(self) -> frozenset[UUID]:
        """The standby gateways that hold a copy of this (serving) gateway's content."""
        return frozenset(self._replicas)

    def elected_endpoint(self) -> Optional[str]:
        """The control endpoint of the gateway serving now, as this node sees it."""
        if self.active:
            return self.control_endpoint
        broker = self.tracker.current_broker
        return self._peers.get(broker.uuid) if broker is not None else None

    def gateways(self) -> tuple[str, ...]:
        """Control endpoints of the mesh's gateways: the serving one first."""
        first = self.elected_endpoint()
        rest = sorted(set(self._peers.values()) | {self.control_endpoint})
        return tuple(([first] if first else []) + [e for e in rest if e != first])

    # --- greenlets ---------------------------------------------------------------------

    def _control_reader(self) -> None:
        sock = self._control_sock
        control = self.control
        assert control is not None

        def on_batch(batch: list) -> None:
            now = time.time()
            for identity, rest, address in batch:
                if rest is None or len(rest) != 3 or rest[0]:
                    continue  # oversized, or not a REQ envelope: dropped
                if self.active:
                    reply = control.handle(identity, address or "", rest[1:], now)
                else:
                    reply = encode_reply(Failure(
                        Status.SERVICE_UNAVAILABLE,
                        f"not the elected gateway; use {self.elected_endpoint() or 'none yet'}"))
                if reply is not None:
                    sock.try_send([identity, b"", *reply])

        self._read_with_address(sock, on_batch)

    def _read_with_address(self, sock: GuardedListener, on_batch: Any) -> None:
        """``HubSocket.read``, with each message's peer address (for throttling)."""
        while True:
            try:
                batch = sock.recv_batch(BATCH, metadata="Peer-Address")
            except zmq.ZMQError:
                return
            if batch:
                on_batch(batch)
            if len(batch) == BATCH:
                gevent.idle()  # more may wait: what else is ready (I/O too) runs first
            elif not sock.wait_readable():
                return  # closed

    def _data_reader(self) -> None:
        flow = self.data
        assert flow is not None

        def on_batch(batch: list) -> None:
            if not self.active:
                return
            flow.handle_batch(batch, time.time())
            self._shout_outgoing()
            self._settle()

        self._data_sock.read(on_batch)

    def _on_node_event(self, event: Event) -> None:
        # may run in a hub callback: queue for the mesh greenlet
        if event.type is EventType.SHOUT and event.group is not None:
            self._queue(event)
        elif event.type is EventType.WHISPER and event.frames:
            kind = event.frames[0]
            if kind in _QUEUED_KINDS:
                if self._is_gateway(event.peer):
                    self._queue(event)
            elif kind == HANDOFF_OK and event.peer == self._handoff_peer:
                message = _replication(event.frames)
                if isinstance(message, HandoffOk):
                    self._acked = max(self._acked, message.number)
                    self._answered()

    def _is_gateway(self, peer: Optional[UUID]) -> bool:
        """True if ``peer`` advertises a gateway (asked of the node: its ENTER may still
        wait for the tracker)."""
        if peer is None:
            return False
        if peer in self._peers:
            return True
        try:
            raw = self._node().peer_header_value(peer, GATEWAY_HEADER)
        except PeermeshError:
            return False
        return parse_gateway_header(raw) is not None

    def _queue(self, event: Event) -> None:
        if len(self._shouts) >= MAX_QUEUED:
            if event.type is EventType.WHISPER:
                if self._follower is not None:  # (a content copied or offered is lost)
                    self._follower.lost()
                if self._offers is not None and event.peer is not None:
                    self._offers.lost(event.peer)
            now = time.monotonic()
            if now - self._dropped_logged > 1.0:
                self._dropped_logged = now
                log.debug("mesh events arrive faster than the gateway handles them: dropped")
            return
        self._shouts.append(event)
        self._shouted.set()

    def _mesh_reader(self) -> None:
        flow = self.data
        assert flow is not None
        shouts = self._shouts
        while True:
            while not shouts:
                self._shouted.clear()
                self._shouted.wait()
            acks: dict[UUID, int] = {}
            for _ in range(min(len(shouts), 256)):
                event = shouts.popleft()
                if event.type is not EventType.SHOUT:
                    self._whispered(event, acks)
                elif self.active:
                    flow.shouted(event.group or "", list(event.frames),
                                 event.peer.hex if event.peer else "")
            committed = self._settle()
            if committed:
                for peer, sequence in acks.items():
                    self._whisper(peer, *repl.handoff_ok(sequence))
            gevent.sleep(0)

    def _whisper(self, peer: UUID, *frames: bytes) -> bool:
        try:
            self._node().whisper(peer, *frames)
        except Exception as error:  # the peer left, the node is stopping
            log.debug("whisper to %s failed: %s", peer, error)
            return False
        return True

    # --- copies of confirmed content between gateways -----------------------------

    def _whispered(self, event: Event, acks: dict[UUID, int]) -> None:
        """One whisper from another gateway (in order, on the mesh greenlet)."""
        peer = event.peer
        assert peer is not None
        message = _replication(event.frames)
        offers = self._offers
        if isinstance(message, Handoff):
            if offers is not None:             # (also while not serving: never lost)
                offers.offer(peer, message)
        elif isinstance(message, HandoffEnd):
            if offers is not None and offers.ended(peer, message.count):
                acks[peer] = message.last
        elif isinstance(message, Resync) and self.active:
            self._replicas.discard(peer)          # a replica that could not store a copy
            self._release()
        elif isinstance(message, MarkOk):
            self._replicas.acknowledged(peer, message.number)
            self._answered()
            self._release()
        elif isinstance(message, Sync):
            self._copy_to(peer, message.copy)
        elif (follower := self._follower) is not None and peer == follower.upstream \
                and not self.active:
            follower.heard(time.monotonic())
            if isinstance(message, Repl):
                follower.copied(message.frames)
            elif isinstance(message, Forget):
                follower.forgotten(message.blob)
            elif isinstance(message, Mark):
                self._marked(follower, peer, message.number, message.copy)
            elif isinstance(message, Resync):
                follower.stop()

    def _marked(self, follower: Follower, peer: UUID, number: bytes, copy: bytes) -> None:
        """A mark from the serving gateway: commit what came before it, acknowledge it."""
        if self.data is None:
            return
        if follower.broken:                   # something before the mark was not stored
            log.info("MTL gateway %s: a copied content could not be stored; copying again",
                     self.control_endpoint)
            self._whisper(peer, *repl.resync())
            follower.stop()
            return
        dropped = follower.complete(copy)
        if dropped is not None:               # the copy asked for is complete
            log.info("MTL gateway %s: a replica of the serving gateway (%d dropped as "
                     "confirmed there)", self.control_endpoint, dropped)
            self._state("replica")
        if self.data.flush():
            self._whisper(peer, *repl.mark_ok(number))

    def _join_later(self) -> None:
        """Join the serving gateway (offer, then ask for a copy), unless doing so."""
        if self.active or self._follower is None:
            return
        broker = self.tracker.current_broker
        target = broker.uuid if broker is not None and broker.uuid in self._peers else None
        if target is None or target == self._follower.upstream:
            return
        if self._joining is None or self._joining.dead:
            self._joining = gevent.spawn(self._join, target)

    def _join(self, target: UUID) -> None:
        store = self.store
        assert store is not None
        cursor = 0
        while not self.active:
            rows, after = store.snapshot(cursor, HANDOFF_BATCH)
            if after == cursor:
                break
            if rows:
                self._handoff_peer, self._acked = target, 0
                last = rows[-1][0]
                sent = all(self._whisper(target, *repl.handoff(group, number, cid, table, body))
                           for number, cid, group, table, body in rows) \
                    and self._whisper(target, *repl.handoff_end(last, len(rows)))
                if not (sent and self._wait(lambda: self._acked >= last)):
                    log.info("offering content to %s stopped: not acknowledged", target)
                    return
            cursor = after
        if not self.active and self._follower is not None:
            self._whisper(target, *repl.sync(self._follower.follow(target, time.monotonic())))

    def _wait(self, done: Callable[[], bool]) -> bool:
        """Wait (at most ``REPLICA_WAIT``) until ``done()``, woken by each answer."""
        deadline = time.monotonic() + REPLICA_WAIT
        while not done():
            answer = self._answer
            if not answer.wait(deadline - time.monotonic()):
                return False
        return True

    def _answered(self) -> None:
        answer, self._answer = self._answer, gevent.event.Event()
        answer.set()

    def _copy_to(self, peer: UUID, copy: bytes) -> None:
        """A standby asked for a copy: send it (unless not serving, or sending it)."""
        if not self.active or self.store is None:
            return
        old = self._copies.get(peer)
        if old is not None:
            if old.args[1] == copy and not old.dead:
                return                            # asked again: under way
            old.kill(block=False)
        self._replicas.discard(peer)
        self._copies[peer] = gevent.spawn(self._copy, peer, copy)

    def _copy(self, peer: UUID, copy: bytes) -> None:
        store = self.store
        assert store is not None
        cursor = 0
        try:
            while self.active:
                rows, after = store.snapshot(cursor, HANDOFF_BATCH)
                if after == cursor:           # all sent, and nothing yielded since the read:
                    self._replicas.add(peer)  # what commits from now on goes live
                    self._mark(peer, copy)
                    log.info("MTL gateway %s: %s holds a copy", self.control_endpoint, peer)
                    return
                self._send_copies([peer], rows)
                number = self._mark(peer)
                if not self._wait(lambda: self._replicas.reached(peer, number)):
                    log.info("copy to %s stopped: not acknowledged", peer)
                    self._whisper(peer, *repl.resync())
                    return
                cursor = after
        finally:
            if self._copies.get(peer) is gevent.getcurrent():
                del self._copies[peer]

    def _send_copies(self, peers: Sequence[UUID],
                     rows: list[tuple[int, bytes, str, bytes, bytes]]) -> None:
        """Whisper ``rows`` to ``peers`` in ``MTL-REPL`` messages of up to ``COPY_BATCH``
        contents and about ``COPY_BYTES`` octets."""
        for frames in repl.repl_batches(rows, COPY_BATCH, COPY_BYTES):
            for peer in peers:
                self._whisper(peer, *frames)

    def _mark(self, peer: UUID, copy: bytes = b"", number: int = 0) -> int:
        """Whisper ``peer`` its next mark (or mark ``number``); its number."""
        number = number or self._replicas.next_mark(peer)
        self._whisper(peer, *repl.mark(number, copy))
        return number

    def _stop_copying(self) -> None:
        for copy in self._copies.values():
            copy.kill(block=False)
        self._copies.clear()
        self._replicas.clear()
        self._release()

    def _settle(self) -> bool:
        """Flush the data flow (commit), copy what changed to the replicas, send; False if
        the commit failed."""
        flow = self.data
        assert flow is not None
        committed = flow.flush()
        sends, actions = flow.take()
        store = self.store
        if store is not None and store.record and (store.committed or store.deleted):
            new, store.committed = store.committed, []
            gone, store.deleted = store.deleted, []
            sends = self._replicate(new, gone, sends)
        elif self._replicas.holding and sends:
            sends = self._replicate([], [], sends)
        self._send((sends, actions))
        return committed

    def _replicate(self, new: list[tuple[int, bytes, str, bytes, bytes]], gone: list[bytes],
                   sends: list[tuple[bytes, list[bytes]]]) -> list[tuple[bytes, list[bytes]]]:
        """Copy a commit to the replicas; the sends that may go now (the others are held
        until a replica acknowledged)."""
        for frames in repl.forget_batches(gone, _FORGET_MAX):
            for peer in (*self._replicas, *self._copies):
                self._whisper(peer, *frames)
        replicas = list(self._replicas)
        if not replicas:
            return sends
        self._send_copies(replicas, new)
        links = self.data.links if self.data is not None else {}
        now_: list[tuple[bytes, list[bytes]]] = []
        later: list[tuple[bytes, list[bytes]]] = []
        for send in sends:
            link = links.get(send[0])
            (later if link is not None and link.grant.confirm == "full" else now_).append(send)
        if later:
            for peer, number in self._replicas.hold(later, time.monotonic()).items():
                self._mark(peer, number=number)
        return now_

    def _release(self) -> None:
        """Send the held answers a replica acknowledged (or that no replica can)."""
        for sends in self._replicas.release():
            self._send((sends, []))

    def _drop_slow_replicas(self) -> None:
        """Replicas that left a mark unanswered for ``REPLICA_WAIT`` stop being ones."""
        for peer in self._replicas.late(time.monotonic()):
            log.warning("MTL gateway %s: replica %s did not answer in %g s; it copies "
                        "again", self.control_endpoint, peer, REPLICA_WAIT)
            self._whisper(peer, *repl.resync())
        self._release()

    def _timer(self) -> None:
        flow, control = self.data, self.control
        assert flow is not None and control is not None
        refreshed = 0.0
        while True:
            now = time.time()
            if now - refreshed >= _REFRESH_EVERY:
                refreshed = now
                try:
                    changed = self.credentials.refresh()
                except CredentialsError as error:
                    log.warning("%s (the users read before are kept)", error)
                    changed = False
                if changed:
                    flow.revoke_invalid(now)
            if self.active:
                wake = flow.tick(now)
                control.expire(now)
                self._settle()
                self._drop_slow_replicas()
            else:
                wake = now + flow.heartbeat
                follower = self._follower
                if follower is not None and follower.upstream is not None \
                        and follower.due(time.monotonic()) == "ask":
                    # the copy has not started: ask again (it may not have been serving
                    # yet); one that stalled stopped, and is joined again below
                    self._whisper(follower.upstream, *repl.sync(follower.ask(time.monotonic())))
                if self.run == "elected":
                    self._join_later()  # (again, after an offer that stopped)
            gevent.sleep(max(0.0, min(wake, refreshed + _REFRESH_EVERY) - time.time()))

    def _shout_outgoing(self) -> None:
        """Shout the batch's content into its groups: one SHOUT per content, per group at
        once (``Node.shout_each``)."""
        outgoing = self.data.outgoing if self.data is not None else None
        if not outgoing:
            return
        node = self._node()
        local = self._local
        for group, bodies in outgoing.items():
            if local is not None and local(group):
                continue
            try:
                node.shout_each(group, bodies)
            except Exception as error:  # the node stopping
                log.debug("shouting into %s failed: %s", group, error)
        outgoing.clear()

    def _send(self, work: tuple[list[tuple[bytes, list[bytes]]], list[MeshAction]]) -> None:
        sends, actions = work
        sock = self._data_sock
        for identity, frames in sends:
            try:
                sock.try_send([identity, *frames])
            except zmq.ZMQError:
                return  # closed while stopping
        node = self._node()
        shout = node.shout
        local = self._local
        for action in actions:
            if local is not None and local(action.group):
                continue
            try:
                if type(action) is MeshShout:
                    shout(action.group, *action.frames)
                elif type(action) is MeshJoin:
                    node.join(action.group)
                else:
                    node.leave(action.group)
            except Exception as error:  # the node stopping, a group name it refuses
                log.debug("mesh action %r failed: %s", action, error)

    def answer(self, sends: list[tuple[bytes, list[bytes]]]) -> None:
        """Send data-flow commands (identity, frames) now, on the node's hub: answers
        decided after their batch, e.g. a writer's Confirm once content is stored
        elsewhere."""
        self._send((sends, []))

    # --- introspection -----------------------------------------------------------------

    @property
    def data_port(self) -> int:
        """The data ROUTER's port (the one every 202 names)."""
        return self._data_sock.port if self._sockets else 0

    def __repr__(self) -> str:
        state = "serving" if self.active else "standing by"
        return f"<Gateway {self.control_endpoint or 'unbound'} {state}>"

