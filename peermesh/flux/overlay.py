"""The Flux overlay: ``FluxCore`` served by the one driver (``peermesh.io.driver``).

How it works
------------
Each node binds one ROUTER (``transport.bind_mailbox``: its children and
joining nodes connect there) and connects one DEALER to its parent
(``transport.connect``); both are the I/O layer's sockets (``HubSocket``,
made by ``make_socket``, bound by ``bind_ephemeral`` on a random port, or
by ``bind`` at the ``endpoint`` given, so that a restarted node comes back
where its members look for it), or the simulated network's. So a node
holds sockets only to its parent and its children, whatever the size of
the instance. The ROUTER is ROUTER_MANDATORY: a send
to a child whose connection closed fails at once (EHOSTUNREACH), and the
core fails what was in flight through it (``link_down``). Messages over
``max_message`` bytes and ROUTER peers whose identity is not 16 bytes are
dropped (counted in ``dropped``, logged at debug). A send to a peer whose
queue is full (``SNDHWM`` on the DEALER, libzmq's default on the ROUTER)
waits in the driver's backlog of that link, at most its ``send_timeout``.

The mailbox is the ROUTER, the parent's DEALER the link the core dials
(``Dial(PARENT, ...)``); the driver hands the core what arrives in batches,
applies what it returns once a batch is done (sends, deliveries to handles,
notices) looking at each socket it sent on once, and runs the core's timer
at ``next_deadline()`` on the transport's clock, so the same code runs in
virtual time on ``peermesh.sim``.

Bootstrap (how a node finds its instance), one of:

* ``root=True``: this node is rank 0.
* ``parents=[endpoint, ...]``: join through any of these members (a parent
  list, as flux-core's static configuration); ``rank=R`` claims a rank.
* neither, attached to a ZRE node: through the mesh. Every member
  advertises ``X-PM-FLUX-TREE`` (``{"instance", "endpoint", "priority"}``) in
  its HELLO; after ``settle`` seconds the members of one instance elect the
  root with the mesh's broker election (``peermesh.overlay.election``:
  highest priority, then UUID) and the others join through its endpoint.
  Only members whose endpoint is ``tcp://IP:PORT`` in ``peer_networks``
  (default: the network of the node's interface) count; the others are
  refused, counted in ``limits``.
  When the root leaves the mesh the next elected member becomes rank 0 at
  its own endpoint (its old rank falls vacant; event numbers go on from the
  last it saw) and the orphans join it, keeping their ranks; its own subtree
  stays attached to it. When a partition heals, the root that loses
  the election steps down and its nodes join the winner (ranks kept where
  free).

Attach to a ZRE node (``node`` then ``ThreadedNode(overlays=[flux])``) or
run alone: ``FluxOverlay(root=True, address="127.0.0.1").start()``.

On keys (CURVE): attached to a node with keys, or alone with ``curve=`` (a
``peermesh.io.curve.Curve``), the ROUTER is a CURVE server admitting the
allowed keys, and the DEALER to a parent is a CURVE client of the key of the
member at that endpoint: its authenticated ``X-PUBLICKEY`` in the mesh, or
the key given with the endpoint (``parents={endpoint: key}``) alone. An
endpoint whose key is unknown is not connected to (the join tries the next).

Kept whole: the overlay (``FluxOverlay``): its public API, handles and mesh bootstrap
all act on one ``FluxCore`` through one driver.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from dataclasses import replace
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence, Union
from uuid import UUID

import gevent
import gevent.event
import zmq

from ..events import Event as NodeEvent
from ..io.curve import Curve
from ..io.driver import Driver
from ..io.endpoints import check_endpoint
from ..io.transport import ZmqTransport
from ..io import zmqbatch
from ..events import EventType
from ..counters import Counters
from ..io.connections import default_policy
from ..overlay.contract import Lifecycle, Overlay, PeerNetworks, header_json
from ..overlay.election import Candidate, elect
from ..wire.flux import NODEID_ANY
from ..wire.zre import PUBLIC_KEY_HEADER
from .core import IDENTITY_SIZE, FluxCore, FluxSettings, Notice, Output, State
from .outputs import PARENT
from .bodies import ping_body
from .errors import FluxError, FluxStateError
from .handle import FluxHandle, Handler, Payload, RpcFuture, Subscription
from .topology import DEFAULT_TOPOLOGY, Topology

#: the identity of a flux-core broker (its UUID as text), whose hello the core refuses
FLUX_CORE_IDENTITY_SIZE = 36

__all__ = ["FluxOverlay", "FLUX_HEADER", "MAX_MESSAGE", "parse_member"]

log = logging.getLogger(__name__)

#: HELLO header of a Flux member: JSON ``{"instance", "endpoint", "priority"}``
FLUX_HEADER = "X-PM-FLUX-TREE"
#: bytes of one message a node accepts (its sender's message is dropped)
MAX_MESSAGE = 16 * 1024 * 1024
#: messages the DEALER to the parent queues before sends are dropped
SNDHWM = 100_000


def parse_member(headers: Mapping[str, str], instance: str) -> Optional[tuple[int, str]]:
    """``(priority, endpoint)`` of a member of ``instance`` from its ``X-PM-FLUX-TREE``;
    None if the header is absent, malformed or another instance's."""
    data = header_json(headers.get(FLUX_HEADER), FLUX_HEADER)
    if not isinstance(data, dict) or data.get("instance") != instance:
        return None
    endpoint, priority = data.get("endpoint"), data.get("priority", 0)
    if not isinstance(endpoint, str) or not isinstance(priority, int) \
            or isinstance(priority, bool):
        return None
    return priority, endpoint


def _member_identity(identity: bytes) -> bool:
    """Whether a ROUTER peer's identity is a member's (or a flux-core broker's, whose
    hello the core refuses); any other (``^``, ``@n``, libzmq's own) is dropped."""
    return len(identity) == IDENTITY_SIZE or len(identity) == FLUX_CORE_IDENTITY_SIZE


class _FluxDriver(Driver):
    """The one driver, dialling the parent as a Flux node does: as a CURVE client of the
    key known for the endpoint (none known: not dialled; the core's timeout moves on to
    the next), and dropping a message back over ``limit`` bytes. With ``fast`` (real
    sockets and the C extension's ``flux_take``) the common hops of each batch read are
    routed and sent in C (``pass_batch``), the rest by the core."""

    def __init__(self, core: FluxCore, transport: Any, keys: Mapping[str, str], limit: int,
                 fast: bool = False, **options: Any) -> None:
        take = zmqbatch.flux_take if fast else None
        super().__init__(core, transport, pass_each=self.pass_batch if take else None,
                         **options)
        self.keys = keys
        self.limit = limit
        self._take = take

    def pass_batch(self, link: Optional[Hashable], batch: list, start: int, now: float,
                   looking: list[Any], flush: Optional[Callable[[], bool]]) -> int:
        """``pass_each``: ``Routing.pass_through`` in C (``flux_take``) over ``batch``
        from ``start`` on, sending on the ROUTER and the DEALER to the parent (each noted
        in ``looking``; ``flush`` called first); the index of the first message it left
        to ``receive``."""
        core: FluxCore = self.core  # type: ignore[assignment]
        take = self._take
        if take is None or core.state is not State.ONLINE or link is not None \
                and link != PARENT:
            return start
        if link is None:   # (a response for a local handle, rank 0's usual: the core's)
            rest = batch[start][1]
            if rest and rest[0][:1] == b"@":
                return start
        if flush is not None:   # (the batch's earlier outputs go first)
            if not flush():
                return start
            if core.state is not State.ONLINE:   # (as those outputs left it)
                return start
        mailbox: Any = self.mailbox
        parent: Any = self.links.get(PARENT)
        if mailbox is None or mailbox.closed:
            return start
        router = mailbox.socket.underlying
        dealer = 0 if parent is None or parent.closed else parent.socket.underlying
        end, forwarded, used = take(batch, start, link, now,
                                    core.routing.take_shape(router, dealer))
        if forwarded:
            core.stats["forwarded"] += forwarded
        if used & 1 and mailbox not in looking:
            looking.append(mailbox)
        if used & 2 and parent not in looking:
            looking.append(parent)
        return end  # type: ignore[no-any-return]

    def dial(self, name: Hashable, endpoint: str, identity: bytes = b"",
             server_key: Optional[bytes] = None) -> None:
        log.debug("%s: dialing %s as %s", self.name, endpoint, identity.hex())
        if getattr(self.transport, "curve", None) is not None:
            key = self.keys.get(endpoint)
            if key is None:
                self.hangup(name)
                log.warning("flux: not connecting to %s: the public key of the member there "
                            "is unknown", endpoint)
                return
            server_key = key.encode()
        super().dial(name, endpoint, identity, server_key)
        link = self.links.get(name)
        if link is not None:
            link.limit = self.limit  # type: ignore[attr-defined]  # (read once it serves)


class FluxOverlay(Overlay):
    """One node of a Flux instance (see the module's docstring)."""

    roles = ("flux",)
    #: route a batch's common hops in C (``flux_take``) when the extension has it and the
    #: sockets are real; False: every message through ``FluxCore.receive``
    fast = True

    def __init__(self, instance: str = "flux", *, root: bool = False,
                 rank: Optional[int] = None,
                 parents: Union[Sequence[str], Mapping[str, str]] = (),
                 topology: Union[str, Topology] = DEFAULT_TOPOLOGY,
                 settings: Optional[FluxSettings] = None, priority: int = 0,
                 address: Optional[str] = None, endpoint: Optional[str] = None,
                 transport: Any = None, max_message: int = MAX_MESSAGE,
                 settle: Optional[float] = None, curve: Optional[Curve] = None,
                 peer_networks: Optional[Sequence[str]] = None) -> None:
        super().__init__()
        topo = topology if isinstance(topology, Topology) else Topology.parse(topology)
        self.settings = replace(settings or FluxSettings(), topology=topo)
        if root and parents:
            raise FluxStateError("a root has no parents to join through")
        if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
            raise FluxStateError(f"rank {rank!r} is not a whole number >= 0")
        if root and rank not in (None, 0):
            raise FluxStateError("the root is rank 0")
        if endpoint is not None:
            check_endpoint(endpoint)  # BindError naming what is wrong, before anything starts
        if curve is not None and transport is not None:
            raise FluxStateError("give curve= or transport=, not both (a transport has its keys)")
        self.instance = instance
        self.root = root
        self.claim = rank
        self.parents = list(parents)
        self.priority = priority
        self.address = address
        self.listen = endpoint  # where the ROUTER binds (None: a random port of the address)
        self.max_message = max_message
        self.settle = settle
        self.identity = os.urandom(IDENTITY_SIZE)
        self._transport = transport if curve is None else ZmqTransport(curve=curve)
        self._curve = curve  # released when this overlay alone made CURVE servers of it
        #: endpoint -> the Z85 public key of the member there (CURVE clients connect to it)
        self.keys: dict[str, str] = dict(parents) if isinstance(parents, Mapping) else {}
        self.transport: Any = transport
        self.endpoint = ""
        self._router: Any = None
        self._driver: Optional[_FluxDriver] = None
        self._greenlets: list[gevent.Greenlet] = []
        self._handles: dict[int, FluxHandle] = {}
        self._listeners: list[Callable[[Notice], None]] = []
        self._online = gevent.event.Event()
        #: why joining was refused for good (``Notice("refused")``), else None
        self.refusal: Optional[str] = None
        self._members: dict[UUID, tuple[Candidate, str]] = {}  # mesh: flux peers
        self._root_endpoint: Optional[str] = None
        self.core: FluxCore = FluxCore(self.identity, "", settings=self.settings)
        self._default: Optional[FluxHandle] = None
        self.dropped = 0
        #: refusals by limit: ``peer_networks`` (members' endpoints outside them)
        self.limits = Counters(log, "Flux node hit its limits")
        self.peer_networks = PeerNetworks(peer_networks, self.limits)

    # --- the overlay contract ----------------------------------------------------

    def start(self) -> "FluxOverlay":
        """Start serving: on the attached node's hub, or alone (not attached: the
        caller's hub, ``transport`` or real sockets on ``address``)."""
        if self.lifecycle is Lifecycle.NEW:
            self.lifecycle = Lifecycle.ATTACHED  # on its own, attached to no node
        super().start()
        return self

    def on_attach(self, node: Any) -> None:
        self._bind(node.transport, node.transport.interface(node.config.interface).address)
        node.set_header(FLUX_HEADER, json.dumps(
            {"instance": self.instance, "endpoint": self.endpoint, "priority": self.priority},
            separators=(",", ":")))

    def _bind(self, transport: Any, address: str) -> None:
        if self._router is not None:
            return
        if transport is None:
            transport = ZmqTransport()
        self.transport = transport
        # members re-attach under their identity: the newer connection takes it over
        router = transport.bind_mailbox(address, self.max_message, self.listen, handover=True,
                                        policy=default_policy(), counters=self.limits,
                                        on_revoked=self._revoked)
        sock = getattr(router, "socket", None)
        if sock is not None:  # a real ROUTER: a send to a gone child fails at once
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        else:  # a simulated one remembers the links it answers down
            router.replies = True
        self._router = router
        self.endpoint = router.endpoint
        curve = getattr(transport, "curve", None)
        if curve is not None:
            self.keys[self.endpoint] = curve.public.decode()

    def on_start(self) -> None:
        mesh = self.node is not None and not self.root and not self.parents
        if not mesh and not self.root and not self.parents:
            raise FluxStateError("a Flux node alone needs root=True or parents=[endpoint, ...] "
                                 "(or attach it to a ZRE node to find its instance there)")
        if self._router is None:
            self._bind(self._transport, self.address or "127.0.0.1")
        self.core = self._new_core(root=self.root, rank=self.claim, bootstrap=self.parents)
        # real sockets: the sends of a batch look once at each socket they used
        batched = getattr(self._router, "socket", None) is not None
        self._driver = _FluxDriver(
            self.core, self.transport, self.keys, self.max_message, on_deliver=self._deliver,
            on_event=self._notice, on_send_failed=self._send_failed,
            on_oversized=self._oversized, addressed=True, accept=_member_identity,
            look_once=batched, sndhwm=SNDHWM, batch_clock=True, name=f"flux {self.instance}",
            fast=batched and self.fast)
        self._greenlets = []
        if mesh:
            node = self.node
            assert node is not None
            me = Candidate(node.uuid, self.priority)
            self._members[node.uuid] = (me, self.endpoint)
            for uuid in node.peers():
                self._peer_entered(uuid, node.peer_headers(uuid))
            node.add_listener(self._on_node_event, messages=False)
            settle = self.settle if self.settle is not None else 1.5 * node.config.interval
            self._greenlets.append(gevent.spawn(self._elect_after, settle))
        self._apply(self.core.start(self.now()))  # (in the mesh: detached until elected)
        self._driver.listen(self._router)

    def on_stop(self, timeout: float) -> None:
        if self._root_endpoint is not None or self._members:  # it followed the mesh
            assert self.node is not None
            self.node.remove_listener(self._on_node_event)
            self._members.clear()
            self._root_endpoint = None
        self._apply(self.core.stop(self.now()))
        for handle in list(self._handles.values()):
            handle._fail_all("the node stopped")
        gevent.killall(self._greenlets, block=False)
        self._greenlets = []
        if self._driver is not None:
            self._driver.close(min(timeout, 0.1))
            self._driver = None
        elif self._router is not None:
            self._router.close(linger=min(timeout, 0.1))
        self._router = None
        if self._curve is not None and self.node is None:
            self._curve.release(self.transport.context)

    def _new_core(self, *, root: bool, rank: Optional[int],
                  bootstrap: Sequence[str]) -> FluxCore:
        # the instance's topology, as the last join answer gave it
        settings = replace(self.settings, topology=self.core.topology)
        core = FluxCore(self.identity, self.endpoint, settings=settings, rank=rank,
                        root=root, bootstrap=bootstrap)
        old = self.core  # its totals go on counting (counters never go back)
        core.stats, core.rpcs, core.events = old.stats, old.rpcs, old.events
        for _ in range(max(self._handles, default=0)):  # keep the handles' numbers
            core.open_handle()
        for number, handle in self._handles.items():
            for topic in handle._handlers:
                core.register(number, topic)
            for subscription in handle._subscriptions:
                core.subscribe(number, subscription.prefix)
        return core

    # --- public API --------------------------------------------------------------

    def now(self) -> float:
        """The transport's clock (virtual time on the simulator)."""
        transport = self.transport
        return transport.now() if transport is not None else 0.0

    def handle(self) -> FluxHandle:
        """A new handle (its own matchtags, services and subscriptions)."""
        if not self.running:
            raise FluxStateError("start the Flux overlay first")
        handle = FluxHandle(self)
        self._handles[handle.number] = handle
        return handle

    @property
    def default(self) -> FluxHandle:
        """The handle ``rpc``, ``register``, ``publish`` and ``subscribe`` use."""
        if self._default is None or self._default.number not in self._handles:
            self._default = self.handle()
        return self._default

    def rpc(self, topic: str, payload: Payload = None, nodeid: int = NODEID_ANY,
            flags: int = 0, *, streaming: bool = False) -> RpcFuture:
        """See ``FluxHandle.rpc``."""
        return self.default.rpc(topic, payload, nodeid, flags, streaming=streaming)

    def register(self, topic: str, handler: Handler) -> None:
        """See ``FluxHandle.register``."""
        self.default.register(topic, handler)

    def publish(self, topic: str, payload: Payload = None) -> RpcFuture:
        """See ``FluxHandle.publish``."""
        return self.default.publish(topic, payload)

    def subscribe(self, prefix: str, callback: Optional[Callable[[Any], None]] = None
                  ) -> Subscription:
        """See ``FluxHandle.subscribe``."""
        return self.default.subscribe(prefix, callback)

    def ping(self, rank: int, timeout: Optional[float] = None, seq: int = 0,
             pad: str = "") -> float:
        """Round-trip seconds of ``broker.ping`` to ``rank`` with flux's body
        (``{"seq", "pad"}``), as a flux-core broker and a peermesh rank answer it."""
        start = self.now()
        self.rpc("broker.ping", ping_body(seq, pad), rank).get(timeout)
        return self.now() - start

    @property
    def rank(self) -> Optional[int]:
        """This node's rank (None until it has one)."""
        return self.core.rank

    @property
    def size(self) -> int:
        """The instance's size as this node knows it (rank 0 knows it exactly)."""
        return self.core.size

    @property
    def state(self) -> State:
        return self.core.state

    def info(self) -> dict[str, Any]:
        """This node's place in the tree (what ``peermesh.info`` answers)."""
        return self.core.info()

    def metrics(self) -> Any:
        """``Overlay.metrics`` plus the tree: rank, size, state, children, clients, and the
        core's totals: messages (forwarded, dropped, replayed) as
        ``flux_messages_total{what}``, RPCs as ``flux_rpcs_total{kind}``, events as
        ``flux_events_total{kind}``."""
        yield from super().metrics()
        core, state = self.core, self.core.state
        for gauge, value in (("flux_rank", -1 if core.rank is None else core.rank),
                             ("flux_size", core.size), ("flux_children", len(core.children)),
                             ("flux_torpid_children",
                              sum(1 for c in core.children.values() if c.torpid)),
                             ("flux_clients", len(core.clients))):
            yield gauge, {"instance": self.instance}, value
        for each in type(state):
            yield ("flux_state", {"instance": self.instance, "state": each.value},
                   1 if each is state else 0)
        for what, count in core.stats.items():
            yield "flux_messages_total", {"instance": self.instance, "what": what}, count
        for family, totals in (("flux_rpcs_total", core.rpcs),
                               ("flux_events_total", core.events)):
            for kind, count in totals.items():
                yield family, {"instance": self.instance, "kind": kind}, count

    def wait_online(self, timeout: Optional[float] = None) -> bool:
        """Wait until this node is part of the tree; False after ``timeout`` seconds.
        ``FluxStateError`` naming why when joining was refused for good (the node
        stopped then; ``refusal`` holds the reason)."""
        online = self._online.wait(timeout) if not self.core.online else True
        if self.refusal is not None:
            raise FluxStateError(f"refused: {self.refusal}")
        return online

    def add_listener(self, callback: Callable[[Notice], None]) -> None:
        """Call ``callback(notice)`` on the hub for each ``Notice`` (online, child-lost, ...)."""
        self._listeners.append(callback)

    # --- the driver ----------------------------------------------------------------

    def forget_handle(self, number: int) -> None:
        """Handle ``number`` was closed (``HandleHost``)."""
        self._handles.pop(number, None)

    def _apply(self, outputs: list[Output]) -> None:
        """Carry out the core's outputs (through the driver, while it runs)."""
        driver = self._driver
        if driver is not None:
            driver.apply(outputs)

    def carry_out(self, outputs: list[Output]) -> None:
        """Carry out a handle's outputs at once (``HandleHost``): its sends go now, and
        each socket they used is looked at once at the end of the hub's turn (a burst of
        RPCs, as ``ping all`` sends, costs one look, not one per request)."""
        driver = self._driver
        if driver is not None:
            driver.apply(outputs, look_now=False)

    def _serve(self, core: FluxCore) -> None:
        """Make ``core`` the node's core, on the same sockets."""
        self.core = core
        if self._driver is not None:
            self._driver.replace_core(core)

    def _deliver(self, item: tuple[int, Any]) -> None:
        number, message = item
        handle = self._handles.get(number)
        if handle is not None:
            handle._deliver(message)

    def _send_failed(self, link: Any, frames: Any, error: BaseException) -> None:
        # (ROUTER_MANDATORY) a child's or client's connection is gone: so is what went
        # through it
        if getattr(error, "errno", None) == errno.EHOSTUNREACH and type(link) is bytes:
            self._apply(self.core.link_down(link, self.now()))

    def _notice(self, notice: Notice) -> None:
        log.debug("flux %s rank %s: %s %s %s", self.instance, self.core.rank, notice.what,
                  notice.rank, notice.detail)
        if notice.what == "online":
            self._online.set()
        elif notice.what == "refused":
            self.refusal = str(notice.detail)
            self._online.set()  # wakes wait_online, which says so
        elif notice.what == "parent-lost":
            self._online.clear()
        for listener in self._listeners:
            try:
                listener(notice)
            except Exception:
                log.exception("flux listener failed")

    def _revoked(self, keys: frozenset[str]) -> None:
        # their connections are closed and what they sent unread is dropped (the router's
        # guard); their members are then lost like any other gone member
        self.limits.add("keys_revoked", len(keys))

    def _oversized(self, identity: bytes) -> None:
        self.dropped += 1
        if self.dropped <= 100 or self.dropped % 1000 == 0:
            log.debug("flux: dropped a message from %r (over %d bytes or a bad identity)",
                      identity[:16], self.max_message)

    # --- bootstrap through the mesh ----------------------------------------------------

    def _on_node_event(self, event: NodeEvent) -> None:
        if event.type is EventType.ENTER:
            if event.peer is not None and event.headers is not None:
                self._peer_entered(event.peer, dict(event.headers))
        elif event.type is EventType.EXIT and event.peer is not None:
            member = self._members.pop(event.peer, None)
            if member is not None:
                self.keys.pop(member[1], None)
                self._reelect()

    def _peer_entered(self, uuid: UUID, headers: dict[str, str]) -> None:
        member = parse_member(headers, self.instance)
        if member is None:
            return
        priority, endpoint = member
        if not self.peer_networks.admit(endpoint, self.node, "Flux member endpoint"):
            return
        self._members[uuid] = (Candidate(uuid, priority), endpoint)
        key = headers.get(PUBLIC_KEY_HEADER)  # authenticated by a node with keys
        if key is not None:
            self.keys[endpoint] = key
        if self._root_endpoint is not None:
            self._reelect()

    def _elect_after(self, settle: float) -> None:
        self.transport.sleep(settle)
        self._root_endpoint = ""
        self._reelect()

    def _reelect(self) -> None:
        """Follow the elected root: become it, step down from it, or join through it."""
        if self._root_endpoint is None or not self.running:
            return
        best = elect(c for c, _ in self._members.values())
        if best is None:
            return
        endpoint = self._members[best.uuid][1]
        if endpoint == self._root_endpoint:
            return
        self._root_endpoint = endpoint
        now = self.now()
        node = self.node
        assert node is not None
        if best.uuid == node.uuid:
            if not self.core.root:  # take over as rank 0 at this endpoint
                seq = self.core.seq
                self._apply(self.core.stop(now))
                self._serve(self._new_core(root=True, rank=0, bootstrap=()))
                self.core.seq = seq  # event numbers go on from what this node saw
                self._apply(self.core.start(now))
        elif self.core.root or self.core.state is State.STOPPED:
            self._apply(self.core.stop(now))  # step down: join the elected root
            self._online.clear()
            self._serve(self._new_core(root=False, rank=None, bootstrap=[endpoint]))
            self._apply(self.core.start(now))
        elif self.core.state is State.DETACHED:
            self._apply(self.core.set_bootstrap([endpoint], now))
        else:
            self.core.bootstrap = [endpoint]


def call_all(overlay: FluxOverlay, topic: str, ranks: Sequence[int], payload: Payload = None,
             timeout: Optional[float] = None) -> dict[int, Union[bytes, None, FluxError]]:
    """``topic`` on every rank of ``ranks`` at once; each rank's payload or error."""
    futures = {rank: overlay.rpc(topic, payload, rank) for rank in ranks}
    results: dict[int, Union[bytes, None, FluxError]] = {}
    for rank, future in futures.items():
        try:
            results[rank] = future.get(timeout)
        except FluxError as exc:
            results[rank] = exc
    return results

