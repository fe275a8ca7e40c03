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
go after the local commit alone. Both sides are one sans-io core,
``GatewayCore`` (``peermesh.mtl.gatewaycore``: the offering, the copies and
their deadlines), with the parts in ``peermesh.mtl.replication``:
``Replicas`` (which standbys are replicas, the marks, the held answers),
``Follower`` (a standby's copy: what it stores, when it is complete, broken
or stalled) and ``Offers`` (what is offered, and whether a batch may be
acknowledged); the gateway whispers and sends what the core returns.

The gateway is a thin shell around sans-io cores, on the node's transport
(its sockets and its clock; users expire at a Unix time, see
``peermesh.mtl.clock``) and the one driver (``peermesh.io.driver.Driver``):

* the control mailbox's driver serves ``ControlFlow`` (each request with its
  sender's address, for throttling): the reply goes back at once;
* the data mailbox's driver serves ``GatewayCore``
  (``peermesh.mtl.gatewaycore``): the ``DataFlow`` and the copies between
  gateways; after each batch it commits once (the group commit behind
  ``confirm: full``) and returns the sends, whispers and mesh actions;
* the node's shouts and the gateways' whispers are queued (a listener may run
  on the hub) and fed to the same driver in batches; the whispers, shouts,
  joins and leaves the core asks for are done by one greenlet, since the
  node's sends may wait for room;
* the core's timer (heartbeats, dead links, lease expiry, slow replicas,
  asking for a copy again, the credentials file every second) runs on the
  driver's clock.

On keys: on a node with keys (CURVE) both ROUTERs are CURVE servers with the
node's keypair, so clients need only the gateway's public key. They admit
any client key (ZAP domain ``MTL_DOMAIN``, not the node's allowlist):
clients off the LAN are many and come and go, and SASL authenticates the
user. SASL PLAIN, which sends the password, is offered by default only
then (``plain=None``); ``plain=True`` offers it on a plain link too.

Bounds: at most ``MAX_QUEUED`` mesh events wait for the mesh greenlet (more
are dropped: shouts are best effort, a handover is sent again); while
``MAX_PENDING`` items of work for the node wait (a batch's shouts into one
group, a whisper: a slow mesh peer), the data mailbox is not read; a control
request is at most ``MAX_REQUEST`` + 1 KiB (libzmq drops
a peer that sends more: ``MAXMSGSIZE``) and of at most 4 frames; a data
command at most ``max_content`` bytes (default 16 MiB) and 2 frames; a
peer's send queue holds ``SNDHWM`` messages (beyond that ROUTER drops, so
a stalled client never stalls the gateway). Sessions, leases and links are
bounded by the cores.

"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence
from uuid import UUID

import gevent
import gevent.event

from ..core import Output, Send
from ..counters import Counters
from ..events import Event, EventType
from ..io.connections import default_policy
from ..io.curve import Curve, shared_allowlist
from ..io.driver import Driver
from ..io.transport import Mailbox
from ..overlay import Overlay, PeerNetworks, header_endpoint
from ..overlay.broker import BrokerTracker
from ..overlay.election import Change
from ..errors import PeermeshError
from ..wire import mtl_replication as repl
from ..wire.mtl import MAX_REQUEST
from ..wire.mtl_replication import (  # (the kinds are importable from here too, as before)
    FORGET, HANDOFF, HANDOFF_END, HANDOFF_OK, MARK, MARK_OK, REPL, RESYNC, SYNC, Forget,
    Handoff, HandoffEnd, HandoffOk, Mark, MarkOk, Repl, Resync, Sync,
)
from .clock import unix_offset
from .control import ControlFlow
from .credentials import Authenticator, CredentialsError, CredentialsFile
from .dataflow import DataFlow, MeshJoin, MeshLeave, MeshShout, MeshShouts
from .delivery import DurableQueues
from .gatewaycore import HANDOFF_BATCH, REPLICA_WAIT, GatewayCore, Shouted, Whisper
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
#: mesh events (shouts, handovers) waiting for the core; beyond, new ones are dropped
MAX_QUEUED = 100_000
_MESH_BATCH = 256      # mesh events fed to the core at once
#: what the core asked of the node (a batch's shouts into one group, a whisper, a join)
#: waiting for the mesh greenlet, at most; beyond, the data mailbox is not read until
#: there is room (a slow mesh peer holds writers up, as their own queues fill)
MAX_PENDING = 64


class _Room:
    """The data mailbox's backpressure (``HubSocket.serve``): full while ``MAX_PENDING``
    items of the node's work wait."""

    def __init__(self, pending: "deque[Any]") -> None:
        self.pending = pending
        self.event = gevent.event.Event()

    def full(self) -> bool:
        return len(self.pending) >= MAX_PENDING

    def wait_room(self) -> None:
        while len(self.pending) >= MAX_PENDING:
            self.event.clear()
            self.event.wait()

    def freed(self) -> None:
        """The mesh greenlet took some: a paused reader may go on."""
        if len(self.pending) < MAX_PENDING:
            self.event.set()

    def hold(self) -> None:
        """(Nothing to hold: the mesh greenlet is woken per item.)"""

    def release(self) -> None:
        """(See ``hold``.)"""


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
        #: the data side's core: the data flow and the copies between gateways
        self.core: Optional[GatewayCore] = None
        #: whether this gateway serves now (always, or while elected)
        self.active = run == "always"
        self._peers: dict[UUID, str] = {}       # peer -> its gateway's control endpoint
        #: refusals by limit: ``peer_networks`` (gateways' endpoints outside them)
        self.limits = Counters(log, "MTL gateway hit its limits")
        self.peer_networks = PeerNetworks(peer_networks, self.limits)
        self._sockets: list[Mailbox] = []
        self._drivers: list[Driver] = []
        self._data_driver: Optional[Driver] = None
        self._mesh_in: deque[tuple[Any, list[bytes]]] = deque()   # node events for the core
        self._mesh_out: deque[Any] = deque()    # whispers, shouts, joins for the node
        self._wake = gevent.event.Event()
        self._room = _Room(self._mesh_out)
        self._mesh: Optional[gevent.Greenlet] = None
        self._dropped_logged = 0.0

    # --- the overlay contract -----------------------------------------------------

    def on_attach(self, node: "Node") -> None:
        """Bind both sockets and advertise them in ``X-PM-MTL-GATEWAY``."""
        if node.curve is not None:
            self.curve = Curve(node.curve.keypair, shared_allowlist(None), MTL_DOMAIN)
            if self._plain is None:  # the link is encrypted: PLAIN is safe to offer
                self.authenticator = Authenticator(self.credentials, _mechanisms(True))
                self._core_options["plain"] = True
        control = self._bind(node, 0, MAX_REQUEST + 1024, 3)
        self._sockets = [control]
        try:
            data = self._bind(node, 1, self.max_content + 1024, 2)
        except BaseException:
            control.close(0)
            raise
        self._sockets.append(data)
        self.control_endpoint = control.endpoint
        self.data_endpoint = data.endpoint
        node.set_header(GATEWAY_HEADER, json.dumps(
            {"control": self.control_endpoint, "data": self.data_endpoint},
            separators=(",", ":")))
        self.tracker.attach(node)

    def _bind(self, node: "Node", which: int, limit: int, frames: int) -> Mailbox:
        """A mailbox of the node's transport: any key may connect (users authenticate by
        SASL): the connection policy bounds the connections, there are no keys to revoke."""
        port = self._ports[which]
        return node.transport.bind_mailbox(
            self.address, limit, _endpoint(self.address, port) if port else None,
            security=self.curve, hwm=SNDHWM, max_frames=frames, counters=self.limits,
            policy=default_policy())

    def on_start(self) -> None:
        node = self._node()
        transport = node.transport
        offset = unix_offset(transport.now)
        still_valid = self.credentials.still_valid
        if self._data_dir is not None:
            self.store = open_gateway_store(self._data_dir, node.config.name)
        queues = self._make_queues(self.store) if self.store is not None else None
        self.data = DataFlow(still_valid=lambda user, now: still_valid(user, now + offset),
                             queues=queues, batch_shouts=True, **self._flow_options)
        self.control = control = ControlFlow(self.authenticator, self.data,
                                             gateways=self.gateways, unix_offset=offset,
                                             **self._core_options)
        control.data_port = self._data_port()
        control.serving = self.active
        control.elsewhere = self.elected_endpoint
        self.core = core = GatewayCore(self.data, self.store, active=self.active, queues=queues,
                                       serving_peer=self._serving_peer,
                                       credentials_changed=self._credentials_changed,
                                       join=self.run == "elected", name=self.control_endpoint)
        name = f"MTL gateway {self.control_endpoint}"
        control_driver = Driver(control, transport, name=f"{name} control")
        self._data_driver = data_driver = Driver(
            core, transport, on_deliver=self._deliver, on_event=self._state,
            on_batch_end=core.end_batch, name=f"{name} data")
        self._drivers = [control_driver, data_driver]
        control_driver.listen(self._sockets[0], "Peer-Address")
        data_driver.listen(self._sockets[1], backpressure=self._room)
        data_driver.apply(core.start(transport.now()))
        node.add_listener(self._on_node_event)
        self.tracker.start()
        self._mesh = gevent.spawn(self._mesh_work)

    def stop(self, timeout: float = 1.0) -> None:
        """Stop serving (idempotent); the sockets close even if it never started."""
        super().stop(timeout)
        for sock in self._sockets:
            sock.close(0)
        if self.curve is not None and self.node is not None:   # (keys: a real transport)
            self.curve.release(self.node.transport.context)

    def on_stop(self, timeout: float) -> None:
        node = self._node()
        try:
            node.remove_listener(self._on_node_event)
        except ValueError:
            pass
        self.tracker.stop(timeout)
        mesh, self._mesh = self._mesh, None
        if mesh is not None:
            mesh.kill(block=True, timeout=timeout)
        drivers, self._drivers = self._drivers, []
        self._data_driver = None
        for driver in drivers:
            driver.close()
        for sock in self._sockets:
            sock.close(0)
        if self.data is not None and self.data.queues is not None:
            self.data.queues.close()
        self.store = None

    def _node(self) -> "Node":
        assert self.node is not None
        return self.node

    def _apply(self, outputs: list[Output]) -> None:
        if outputs and self._data_driver is not None:
            self._data_driver.apply(outputs)

    def _now(self) -> float:
        driver = self._data_driver
        return driver.transport.now() if driver is not None else 0.0

    def _credentials_changed(self) -> bool:
        try:
            return self.credentials.refresh()
        except CredentialsError as error:
            log.warning("%s (the users read before are kept)", error)
            return False

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
            if self.control is not None:
                self.control.serving = elected
                if not elected:
                    self.control.sessions.clear()
        if self.core is not None:
            self._apply(self.core.changed(elected, self._now()))

    def _serving_peer(self) -> Optional[UUID]:
        broker = self.tracker.current_broker
        return broker.uuid if broker is not None and broker.uuid in self._peers else None

    def _peer_entered(self, uuid: UUID, headers: Mapping[str, str], name: str) -> None:
        endpoint = parse_gateway_header(headers.get(GATEWAY_HEADER))
        if endpoint is not None and self.peer_networks.admit(
                endpoint, self.node, f"MTL gateway endpoint of {name}"):
            self._peers[uuid] = endpoint

    def _peer_left(self, uuid: UUID) -> None:
        self._peers.pop(uuid, None)
        if self.core is not None:
            self._apply(self.core.peer_left(uuid))

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
        return frozenset(self.core.replicas) if self.core is not None else frozenset()

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

    # --- the mesh: what the node hears in, what the core asks of it out --------------

    def _on_node_event(self, event: Event) -> None:
        # may run in a hub callback: queued for the mesh greenlet
        if event.type is EventType.SHOUT and event.group is not None:
            peer = event.peer.hex if event.peer else ""
            self._queue(Shouted(event.group, peer), event.frames)
        elif event.type is EventType.WHISPER and event.frames \
                and event.frames[0] in repl.KINDS and self._is_gateway(event.peer):
            self._queue(event.peer, event.frames)

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

    def _queue(self, link: Any, frames: Sequence[bytes]) -> None:
        if len(self._mesh_in) >= MAX_QUEUED:
            if type(link) is UUID and self.core is not None:
                self.core.lost(link)   # (a content copied or offered is lost)
            now = self._now()
            if now - self._dropped_logged > 1.0:
                self._dropped_logged = now
                log.debug("mesh events arrive faster than the gateway handles them: dropped")
            return
        self._mesh_in.append((link, list(frames)))
        self._wake.set()

    def _deliver(self, item: Any) -> None:
        """What the core asks of the node: done by the mesh greenlet (it may wait)."""
        self._mesh_out.append(item)
        self._wake.set()

    def _mesh_work(self) -> None:
        """Feed the node's events to the core, do what the core asks of the node."""
        mesh_in, mesh_out, wake = self._mesh_in, self._mesh_out, self._wake
        while True:
            while not (mesh_in or mesh_out):
                wake.clear()
                wake.wait()
            if mesh_in and self._data_driver is not None:
                self._data_driver.feed([mesh_in.popleft()
                                        for _ in range(min(len(mesh_in), _MESH_BATCH))])
            while mesh_out:
                self._on_mesh(mesh_out.popleft())
            self._room.freed()
            if mesh_in:
                gevent.sleep(0)   # (more waits: what else is ready runs first)

    def _on_mesh(self, item: Any) -> None:
        node = self._node()
        cls = type(item)
        try:
            if cls is Whisper:
                node.whisper(item.peer, *item.frames)
                return
            local = self._local
            if local is not None and local(item.group):
                return
            if cls is MeshShouts:
                node.shout_each(item.group, item.bodies)
            elif cls is MeshShout:
                node.shout(item.group, *item.frames)
            elif cls is MeshJoin:
                node.join(item.group)
            elif cls is MeshLeave:
                node.leave(item.group)
        except Exception as error:  # the peer left, the node stopping, a group it refuses
            log.debug("mesh action %r failed: %s", item, error)

    def answer(self, sends: list[tuple[bytes, list[bytes]]]) -> None:
        """Send data-flow commands (identity, frames) now, on the node's hub: answers
        decided after their batch, e.g. a writer's Confirm once content is stored
        elsewhere."""
        self._apply([Send(identity, frames) for identity, frames in sends])

    # --- introspection -----------------------------------------------------------------

    def _data_port(self) -> int:
        return self._sockets[1].port if len(self._sockets) > 1 else 0

    @property
    def data_port(self) -> int:
        """The data ROUTER's port (the one every 202 names)."""
        return self._data_port()

    def __repr__(self) -> str:
        state = "serving" if self.active else "standing by"
        return f"<Gateway {self.control_endpoint or 'unbound'} {state}>"
