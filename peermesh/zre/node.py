"""A ZRE v2 node on gevent: the driver of a ``session.Session`` over a transport.

How it works
------------
The protocol's state and decisions live in ``session.Session`` (no I/O, no
clock); a ``Node`` feeds it and carries out what it asks. A started node
runs these on the hub of the thread that started it:

* its **discovery sources** (``peermesh.discovery``), which report peers
  through ``peer_appeared`` / ``peer_alive`` / ``peer_left``;
* the one driver, ``peermesh.io.driver.Driver``, serving the session: it
  reads the mailbox in batches (paused while the event queue is full; under
  CURVE each message's key checked inline by the ``curve.KeyGate``) and
  hands each WHISPER or SHOUT from ``Session.delivery`` straight to the
  listeners and the queue, any other message to ``Session.receive``; its
  timer calls ``Session.handle_timer(now)`` at ``next_deadline()``, after
  this node's own checks (``_before_timer``).

What the session returns is carried out at once by the node (``_apply``):
events to the listeners and the queue, each ``Dial`` answered with a
``peer.PeerLink`` (``Session.attach``) before the session is fed again.

Time is the transport's (``transport.now`` / ``transport.sleep``), so on the
simulated network every wait (``stop``, ``flush`` and a send waiting for
room included) is virtual.

Sends never block the hub: see ``peer.PeerLink``. Application calls that
would exceed a peer's send buffer wait up to ``send_timeout`` for room, then
the peer counts as not responding: it is disconnected (EXIT, reason given)
and ``whisper`` raises ``PeerNotResponding`` naming the bound.
``whisper`` and ``shout`` number and queue their messages here, not in the
session: it is the hot path, kept to one call.

Kept whole: ``Node`` is the face of one ``Session`` on one hub: its start and stop, sends
and the answers to the session's requests; ``PeerInfo`` is the view of that session it
hands out.
"""

from __future__ import annotations

import errno
import logging
import uuid as uuid_module
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, Union, cast
from uuid import UUID

import gevent
import gevent.event
import zmq

from ..config import NodeConfig
from ..core import Deliver, Dial, Emit, Output
from ..counters import REPORT_PERIOD
from ..discovery import Discovery
from ..discovery.beacon import BeaconDiscovery, parse_seed
from ..errors import (AmbiguousPeerError, NodeStateError, PeermeshError, PeerNotResponding,
                      UnknownPeerError)
from ..events import Event, EventType, until_stop
from ..io import zmqbatch
from ..io.driver import Driver
from ..io.transport import ZmqTransport
from ..net.interfaces import Interface
from ..wire import zre
from .eventqueue import GreenEventQueue
from .peer import PeerLink
from .session import PEX_HEADER, Peer, Session

if TYPE_CHECKING:  # CURVE (and its key files and ZAP) is loaded only by nodes with keys
    from ..io.curve import Curve
    from .curve import KeyGate

__all__ = ["Node", "PeerInfo", "Frame"]

log = logging.getLogger(__name__)

Frame = Union[bytes, bytearray, memoryview, str]
PeerRef = Union[UUID, str]

_whisper_header = zre.whisper_header
#: a WHISPER's frame 0 as ``PeerLink.send_numbered`` takes it (the sequence written in)
_WHISPER_HEAD = zre.whisper_header(0)
#: the HELLO header where overlays list their roles (``peermesh.overlay.ROLES_HEADER``)
ROLES_HEADER = "X-PM-ROLES"
#: the events ``add_listener(messages=False)`` leaves out
_MESSAGES = frozenset((EventType.WHISPER, EventType.SHOUT))
_NO_CONTENT = ("{} needs at least one content frame (ZRE allows none, but Zyre merges "
               "an empty message into the next one it delivers)")


class PeerInfo:
    """A snapshot of what a node knows about a peer.

    Liveness: ``state`` is "alive", "evasive" (silent for ``evasive``, being
    PINGed) or "silent" (silent for ``silent``); ``last_heard`` the seconds
    since anything came from it; ``rtt`` the smoothed PING to PING-OK time in
    seconds (None until it answered one; ``NodeConfig.rtt_probe``); ``roles``
    what its ``X-PM-ROLES`` header lists; ``leads`` the groups (of this node's)
    that elected the peer their leader.
    """

    __slots__ = ("uuid", "name", "address", "headers", "groups", "state", "last_heard", "rtt",
                 "roles", "leads")

    def __init__(self, peer: Peer, now: float, leads: Sequence[str] = ()) -> None:
        self.uuid: UUID = peer.uuid
        self.name: str = peer.name
        self.address: str = peer.endpoint
        self.headers: dict[str, str] = dict(peer.headers)
        self.groups: list[str] = sorted(peer.groups)
        self.state: str = peer.state
        self.last_heard: float = max(0.0, now - peer.last_seen)
        self.rtt: Optional[float] = peer.rtt.smoothed if peer.rtt is not None else None
        self.roles: list[str] = [r for r in peer.headers.get(ROLES_HEADER, "").split(",") if r]
        self.leads: list[str] = sorted(leads)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``rtt`` and ``last_heard`` in seconds)."""
        return {"peer": self.uuid.hex, "name": self.name, "address": self.address,
                "headers": self.headers, "groups": self.groups, "state": self.state,
                "last_heard": round(self.last_heard, 3),
                "rtt": None if self.rtt is None else round(self.rtt, 6), "roles": self.roles,
                "leads": self.leads}

    def __repr__(self) -> str:
        return f"PeerInfo({self.uuid.hex[:8]} {self.name!r} {self.address})"


def _frame(value: Frame) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a frame must be bytes or str, not {type(value).__name__} "
                    "(use whisper_packed/shout_packed for other objects)")


def _discovery_from_config(config: NodeConfig) -> list[Discovery]:
    """The discovery sources ``config.discovery`` and ``config.seeds`` ask for."""
    sources: list[Discovery] = []
    seeds = [parse_seed(text, config.port) for text in config.seeds]
    sources.append(BeaconDiscovery(broadcast="beacon" in config.discovery, seeds=seeds))
    if "mdns" in config.discovery:
        from ..discovery.mdns import MdnsDiscovery
        sources.append(MdnsDiscovery())
    return sources


def _checked_string(kind: str, value: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    size = len(value.encode("utf-8"))
    if size > zre.MAX_STRING:
        raise ValueError(f"{kind} {value[:40]!r} is {size} UTF-8 octets; the limit is 255")
    return value


class Node:
    """One member of a ZRE mesh, driven by greenlets on the current gevent hub.

    Use it from greenlets (or the main greenlet) of the thread that creates
    it. For threaded programs that do not run gevent, use ``ThreadedNode``.

    ``Node(name, groups=..., headers=..., interface=..., port=..., ...)``:
    keyword settings are those of ``NodeConfig``; ``config`` supplies a base
    (default: ``NodeConfig.load()``, which reads ``PEERMESH_*``).
    """

    def __init__(self, name: Optional[str] = None, *, config: Optional[NodeConfig] = None,
                 transport: Any = None, sources: Optional[Sequence[Discovery]] = None,
                 clock: Optional[Callable[[], float]] = None, _events: Any = None,
                 **settings: Any) -> None:
        base = config if config is not None else NodeConfig.load()
        self.config = base.replace(name=name, **settings)
        #: the keypair and allowed keys (``config.key_file``): every socket speaks CURVE
        self.curve: Optional[Curve] = None
        if self.config.key_file is not None:
            from ..io.curve import Curve

            self.curve = Curve.load(self.config.key_file, self.config.allowed_keys,
                                    self.config.zap_domain)
            if transport is not None:
                raise ValueError("a node with key_file makes its own transport (its sockets "
                                 "need the keys): leave transport unset")
        #: how frames, beacons and time move (``transport.ZmqTransport`` or a simulated one)
        self.transport: Any = transport if transport is not None else ZmqTransport(
            curve=self.curve)
        # max_peers and max_connections left to None follow what the transport can hold
        self.config = self.config.fitted(self.transport.peer_capacity())
        #: discovery sources; by default those ``config.discovery`` and ``config.seeds`` name
        self._discovery = list(sources) if sources is not None else \
            _discovery_from_config(self.config)
        self._uuid = uuid_module.uuid4()
        self._identity = b"\x01" + self._uuid.bytes
        self._name = _checked_string("name", self.config.name or self._uuid.hex[:6].upper())
        self._headers: dict[str, str] = {}
        for key, value in self.config.headers.items():
            self.set_header(key, value)
        if any(isinstance(d, BeaconDiscovery) and (d.seeds or not d.broadcast)
               for d in self._discovery):
            self._headers.setdefault(PEX_HEADER, "1")
        if self.curve is not None:
            self._headers[zre.PUBLIC_KEY_HEADER] = self.curve.public.decode()
        self._clock = clock if clock is not None else self.transport.now
        self._events = _events if _events is not None else GreenEventQueue(self.config.event_queue)
        self._events.bound_bytes(self.config.event_queue_bytes)
        self._listeners: list[Callable[[Event], None]] = []
        #: the listeners that also hear WHISPERs and SHOUTs
        self._message_listeners: list[Callable[[Event], None]] = []
        self._failed_listeners: set[int] = set()   # whose traceback was logged already
        self._session = Session(self._uuid, self._name, self._headers, self.config,
                                linked=self._linked)
        # a batch's WHISPERs and SHOUTs taken in by one C call, put in the queue by one
        # call (``Session.delivery_each``) while no listener hears them
        self._session.compiled_take = getattr(zmqbatch.native, "zre_take", None)
        self._session.batch_sink = getattr(self._events, "put_each", None)
        #: where the session's events go: the queue, or ``_emit`` while listeners listen;
        #: WHISPERs and SHOUTs (``Deliver``) go to ``_message_sink``: the queue unless a
        #: listener hears them
        self._sink: Callable[[Event], None] = self._events.put
        self._message_sink: Callable[[Event], None] = self._events.put
        for group in self.config.contest:
            self._session.contest(_checked_string("group", group))
        for group in self.config.groups:
            self._session.add_group(_checked_string("group", group))
        self._gate: Optional[KeyGate] = None
        if self.curve is not None:
            from .curve import KeyGate

            self._gate = KeyGate(self._session, self.curve.allowlist)
        self._peers = self._session.peers  # the peer table, read by the public API
        self._descriptors_logged = -REPORT_PERIOD  # when the last descriptor refusal was logged
        self._state = "new"
        self.interface: Optional[Interface] = None
        self.endpoint: Optional[str] = None
        self.mailbox_port = 0
        self._last_target: Optional[tuple[PeerRef, Peer]] = None
        self._mailbox: Any = None
        #: what reads the mailbox and runs the session's timer (made by ``start``)
        self._driver: Optional[Driver] = None
        #: WHISPERs and SHOUTs sent (one per peer a SHOUT went to), octets of their content
        self._sent_whispers = self._sent_shouts = self._sent_octets = 0
        #: overlays attached to this node (``Overlay.attach`` adds them; the metrics read them)
        self.overlays: list[Any] = []

    # --- identity -------------------------------------------------------

    @property
    def uuid(self) -> UUID:
        """This node's UUID."""
        return self._uuid

    @property
    def name(self) -> str:
        """This node's public name."""
        return self._name

    @property
    def public_key(self) -> Optional[bytes]:
        """The 32 octets of this node's CURVE public key (its beacons carry them), or None."""
        return self.curve.keypair.public_raw if self.curve is not None else None

    @property
    def headers(self) -> dict[str, str]:
        """A copy of the headers sent in HELLO."""
        return dict(self._headers)

    def set_header(self, key: str, value: str) -> None:
        """Set a HELLO header; only before ``start``."""
        if self._state_is_running():
            raise NodeStateError("headers are fixed once the node has started")
        if not isinstance(value, str):
            raise TypeError(f"header value must be a str, not {type(value).__name__}")
        self._headers[_checked_string("header name", key)] = value

    def _state_is_running(self) -> bool:
        return getattr(self, "_state", "new") != "new"

    # --- life cycle -----------------------------------------------------

    def start(self) -> "Node":
        """Bind the mailbox, start discovery (the first beacon goes out at once)."""
        if self._state != "new":
            raise NodeStateError(f"node is {self._state}; a node starts once")
        cfg = self.config
        self.interface = itf = self.transport.interface(cfg.interface)
        self._mailbox = self.transport.bind_mailbox(
            itf.address, cfg.max_message, max_connections=cfg.max_connections,
            # a dead connection must be gone before its peer expires: with ROUTER_HANDOVER
            # off, a peer back after a network cut reconnects only once the old one is closed
            handshake_timeout=cfg.hello_timeout, dead_after=cfg.expired / 2, keepalive=True,
            counters=self._session.counters, max_per_address=cfg.max_peers_per_address,
            # its peers' connections are never shed; the others (before HELLO, or refused)
            # are at most max_unproven
            keep=self._knows, max_unknown=cfg.max_unproven)
        self.mailbox_port = self._mailbox.port
        # where each message came from, if the mailbox can tell (a HELLO from its host)
        self._session.source = getattr(self._mailbox, "source_of", None)
        self.endpoint = f"tcp://{itf.address}:{self.mailbox_port}"
        self._session.start(self.endpoint)
        self._state = "running"
        started: list[Discovery] = []
        try:
            for source in self._discovery:
                source.start(self)
                started.append(source)
        except BaseException:
            for source in started:
                source.stop()
            self._session.stop()
            self._mailbox.close()
            if self.curve is not None:
                self.curve.release(self.transport.context)
            self._state = "stopped"
            raise
        self._serve()
        log.debug("node %s (%s) started on %s", self._name, self._uuid.hex, self.endpoint)
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Leave the mesh: a port-0 beacon, flush what is queued (up to ``timeout``), close."""
        if self._state != "running":
            return
        self._state = "stopping"
        self._session.running = False  # leaving: take no new peers
        deadline = self._clock() + timeout
        self.flush(timeout)
        try:
            for source in self._discovery:
                source.stop()
        finally:
            if self._driver is not None:
                self._driver.close()   # (the mailbox too: its reader and the timer stop)
            linger = max(0.0, deadline - self._clock())
            for peer in self._session.stop():
                peer.link.close(linger)
            self._last_target = None
            if self.curve is not None:
                self.curve.release(self.transport.context)
            self._state = "stopped"
            self._emit(Event(EventType.STOP))
            self._events.spill()  # nothing reads the mailbox any more: queue what waited

    def flush(self, timeout: float = 1.0) -> bool:
        """Wait until every peer sent to since the last check has processed it.

        Each such peer gets a PING; its PING-OK proves that everything sent
        before has reached its node (commands are handled in order). True if
        all answered within ``timeout`` seconds of the transport's clock.
        ``stop`` calls this first.
        """
        session = self._session
        pending = [(p, p.total) for p in self._peers.values()
                   if p.unconfirmed and p.ready and p.confirmed < p.total]
        if not pending:
            return True
        woken = gevent.event.Event()
        for peer, target in pending:
            peer.unconfirmed = False
            peer.pong = woken
            if not peer.pings or peer.pings[-1][0] < target:
                session.ping(peer, self._clock())  # a PING already on its way may predate the last message
        self._apply_taken()

        def answered() -> bool:
            return all(peer.confirmed >= target or self._peers.get(peer.uuid) is not peer
                       for peer, target in pending)
        try:
            self._wait(answered, woken, timeout)
        finally:
            for peer, target in pending:
                peer.pong = None
                if peer.confirmed < target:
                    peer.unconfirmed = True  # the next flush asks again
        return all(peer.confirmed >= target for peer, target in pending)

    def _wait(self, done: Callable[[], bool], woken: gevent.event.Event,
              timeout: float) -> bool:
        """Wait until ``done()``, checked whenever ``woken`` is set; False after ``timeout``.

        The timeout runs on the transport's clock (virtual in the simulator,
        where something else must advance it).
        """
        if timeout <= 0:
            return done()
        expired = False

        def alarm() -> None:
            nonlocal expired
            self.transport.sleep(timeout)
            expired = True
            woken.set()

        timer = gevent.spawn(alarm)
        try:
            while True:
                woken.clear()
                if done():
                    return True
                if expired:
                    return False
                woken.wait()
        finally:
            timer.kill(block=False)

    def __enter__(self) -> "Node":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._state == "running"

    def hold_confirms(self) -> None:
        """From now on, answer a peer's PING only when the application says so.

        Each PING becomes a ``CONFIRM`` event, queued after every event the peer
        caused before it; the application calls ``confirm(event.peer)`` once it
        has handled those (stored them, say), so the peer's ``flush()`` returns
        True only for what the application holds. Until then the peer waits
        (its ``flush`` timeout); a CONFIRM never answered leaves the peer's
        flush False, as an answer that never came.
        """
        self._session.hold_confirms = True

    def confirm(self, peer: PeerRef) -> bool:
        """Answer ``peer``'s PING (a ``CONFIRM`` event) now; False if it is gone."""
        try:
            target = self._ready_peer(peer)
        except (UnknownPeerError, NodeStateError):
            return False
        self._session.send_control(target, zre.PingOk(target.next_sequence()))
        self._apply_taken()
        return True

    def reload_allowed_keys(self) -> int:
        """Read ``allowed_keys`` again now (it is also re-read whenever the directory
        changes); peers whose keys it no longer holds are removed at the next tick.
        Returns the number of keys allowed; NodeStateError without ``allowed_keys``."""
        if self.curve is None or self.curve.allowlist.any_key:
            raise NodeStateError("this node has no allowed_keys directory to reload")
        count = self.curve.allowlist.reload()
        log.info("allowed keys reloaded: %d from %s", count, self.curve.allowlist.directory)
        return count

    # --- groups ---------------------------------------------------------

    def join(self, group: str) -> None:
        """Join ``group`` and tell every peer (JOIN)."""
        self._check_not_stopped()
        self._session.add_group(_checked_string("group", group))
        self._apply_taken()

    def leave(self, group: str) -> None:
        """Leave ``group`` and tell every peer (LEAVE)."""
        self._check_not_stopped()
        self._session.remove_group(_checked_string("group", group))
        self._apply_taken()

    def groups(self) -> list[str]:
        """The groups this node is in."""
        return sorted(self._session.groups)

    def contest(self, group: str) -> None:
        """Stand for leader of ``group`` in Zyre's election (``zyre_set_contest_in_group``).

        Every node takes part in the elections of its groups; the contesting
        members start them (when a peer joins the group, when its leader
        goes, and here if the node is already in it with peers), and the
        lowest UUID among them wins. Each member then reports a LEADER event
        (``peer``: the winner, this node's UUID if it won); ``leader(group)``
        names it. Set it before ``join`` to stand from the start.
        """
        self._check_not_stopped()
        self._session.contest(_checked_string("group", group))
        self._apply_taken()

    def contested(self) -> list[str]:
        """The groups this node stands for leader of."""
        return sorted(self._session.contested)

    def leader(self, group: str) -> Optional[UUID]:
        """The elected leader of ``group`` (this node's UUID if it won), or None while
        there is none (no election finished, or the leader left)."""
        return self._session.leaders.get(group)

    # --- sending --------------------------------------------------------

    def whisper(self, peer: PeerRef, *frames: Frame) -> None:
        """Send ``frames`` (one message, one or more frames) to one peer.

        Raises ``UnknownPeerError`` if no ready peer has that UUID,
        ``ValueError`` without frames, and ``PeerNotResponding`` if the
        peer's send buffer stayed full for ``send_timeout`` (the peer is
        then disconnected).
        """
        last = self._last_target   # a sender's loop names the same peer each time
        if last is not None and last[0] is peer and last[1].ready:
            target = last[1]       # the same UUID object as the last call: no hashing
        else:
            target = self._ready_peer(peer)
            self._last_target = (peer, target)
        if len(frames) == 1 and type(frames[0]) is bytes:  # the usual case: as given
            content: Sequence[bytes] = frames  # type: ignore[assignment]
            octets = len(frames[0])
        elif frames:
            content = [*map(_frame, frames)]
            octets = sum(map(len, content))
        else:
            raise ValueError(_NO_CONTENT.format("whisper"))
        link: PeerLink = target.link  # type: ignore[assignment]
        backlog = link.backlog
        if backlog and not link.has_room():
            self._wait_room(target)
            backlog = link.backlog
        sequence = target.next_sequence()   # (once there is room)
        send = link.send_numbered
        if send is None or backlog or not send(_WHISPER_HEAD, sequence, content):
            # Queued built whole as a tuple: a tuple of bytes is untracked by Python's
            # garbage collector at its first pass, a list never is, so a backlog of lists
            # made every older-generation pass walk all of it again (with 100,000
            # messages queued: 0.24 us of collection per message, 0.06 with tuples).
            link.offer((_whisper_header(sequence), *content))
        target.unconfirmed = True
        self._sent_whispers += 1
        self._sent_octets += octets

    def shout(self, group: str, *frames: Frame) -> None:
        """Send ``frames`` to every peer in ``group``, one unicast SHOUT each.

        ``ValueError`` without frames. A member whose send buffer stays full
        for ``send_timeout`` is disconnected (EXIT with reason "not
        responding") without delaying the others.
        """
        group_field = zre.encode_string(_checked_string("group", group))
        self._check_running()
        if not frames:
            raise ValueError(_NO_CONTENT.format("shout"))
        content = [_frame(f) for f in frames]   # (each peer's message a tuple: see whisper)
        members = self._session.members.get(group)
        if not members:
            return
        self._sent_shouts += len(members)
        self._sent_octets += len(members) * sum(map(len, content))
        slow = []
        for peer in list(members.values()):
            if peer.link.has_room():
                peer.link.offer((zre.shout_header(peer.next_sequence(), group_field), *content))
                peer.unconfirmed = True
            else:
                slow.append(peer)
        for peer in slow:
            try:
                self._wait_room(peer)
            except PeerNotResponding:
                continue
            peer.link.offer((zre.shout_header(peer.next_sequence(), group_field), *content))
            peer.unconfirmed = True

    def shout_each(self, group: str, bodies: Sequence[bytes]) -> None:
        """``shout(group, body)`` for each of ``bodies``, in order (one SHOUT each), with
        the group checked and encoded once and each peer's batch handed to ZeroMQ in one
        call: a relay's batch of one-frame messages."""
        group_field = zre.encode_string(_checked_string("group", group))
        self._check_running()
        members = self._session.members.get(group)
        if not members or not bodies:
            return
        count = len(bodies)
        self._sent_shouts += count * len(members)
        self._sent_octets += len(members) * sum(map(len, bodies))
        slow = []
        for peer in list(members.values()):
            done = peer.link.offer_each(zre.shouts(peer.sent + 1, group_field, bodies))
            peer.advance(done)   # (the rest take their numbers when they go, below)
            peer.unconfirmed = True
            if done < count:
                slow.append((peer, done))
        for peer, done in slow:
            for body in bodies[done:]:
                if not peer.link.has_room():
                    try:
                        self._wait_room(peer)
                    except PeerNotResponding:
                        break
                peer.link.offer((zre.shout_header(peer.next_sequence(), group_field), body))

    def whisper_packed(self, peer: PeerRef, obj: Any) -> None:
        """``whisper`` one msgpack-encoded object (read it with ``Event.unpack``)."""
        import msgpack  # (only where packed content is used: a plain node does without)

        self.whisper(peer, msgpack.packb(obj, use_bin_type=True))

    def shout_packed(self, group: str, obj: Any) -> None:
        """``shout`` one msgpack-encoded object (read it with ``Event.unpack``)."""
        import msgpack

        self.shout(group, msgpack.packb(obj, use_bin_type=True))

    def _wait_room(self, peer: Peer) -> None:
        """Wait up to ``send_timeout`` for room in ``peer``'s send buffer.

        Raises ``PeerNotResponding`` after removing the peer if none came.
        """
        link: PeerLink = peer.link  # type: ignore[assignment]
        peers, cfg = self._peers, self.config
        if (self._wait(lambda: link.has_room() or peers.get(peer.uuid) is not peer,
                       link.room_event(), cfg.send_timeout)
                and peers.get(peer.uuid) is peer):
            return
        self._session.remove(peer, "not responding: send queue full")  # no-op if already gone
        self._apply_taken()   # its EXIT reaches listeners now
        raise PeerNotResponding(
            f"peer {peer.name} ({peer.uuid}) is not responding: its send buffer "
            f"(send_buffer={cfg.send_buffer} octets, send_queue={cfg.send_queue} messages) "
            f"stayed full for send_timeout={cfg.send_timeout:g} s; it was disconnected")

    # --- receiving ------------------------------------------------------

    def add_listener(self, callback: Callable[[Event], None], messages: bool = True) -> None:
        """Call ``callback(event)`` on the node's hub for every event, before it is queued;
        with ``messages=False`` for every event but WHISPERs and SHOUTs (a listener that
        tracks the mesh: the node's messages then cost it nothing).

        For overlays that track the mesh (ENTER, EXIT, headers); the
        application still gets every event. The callback may run inside a
        hub callback (the mailbox drains there), where blocking raises
        ``BlockingSwitchOutError``: it must not block; hand slow work to a
        greenlet of its own.
        """
        self._listeners.append(callback)
        if messages:
            self._message_listeners.append(callback)
        self._set_sinks()

    def remove_listener(self, callback: Callable[[Event], None]) -> None:
        """Stop calling ``callback``."""
        self._listeners.remove(callback)
        if callback in self._message_listeners:
            self._message_listeners.remove(callback)
        self._set_sinks()

    def _set_sinks(self) -> None:
        put = self._events.put
        self._sink = self._emit if self._listeners else put
        self._message_sink = self._emit if self._message_listeners else put
        self._session.batch_sink = (None if self._message_listeners
                                    else getattr(self._events, "put_each", None))
        if self._driver is not None:
            self._driver.on_deliver = self._message_sink   # (the fast path's messages)

    def _emit(self, event: Event) -> None:
        listeners = (self._message_listeners if event.type in _MESSAGES
                     else self._listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception as exc:  # an overlay's bug must not take the node down
                self._listener_failed(listener, event, exc)
        self._events.put(event)

    def _listener_failed(self, listener: Callable[[Event], None], event: Event,
                         exc: Exception) -> None:
        """Log a listener's first failure with its traceback; count the others
        (``listener_failures``, one line per period): a peer's event that makes an
        overlay fail each time must not fill the log."""
        if id(listener) not in self._failed_listeners:
            self._failed_listeners.add(id(listener))
            log.error("event listener %r failed on %s", listener, event.type.name,
                      exc_info=exc)
        self._session.counters.over("listener_failures", f"{listener!r} on "
                                    f"{event.type.name}: {type(exc).__name__}: {exc}"[:200])

    def recv(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or None after ``timeout`` seconds (None: wait for ever)."""
        if self._state == "stopped" and not len(self._events):
            return None
        return self._events.get(timeout)

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over events until STOP, or until none came for ``timeout`` seconds."""
        return until_stop(self.recv, timeout)

    # --- the peer view --------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Sizes of what remote senders can grow, and totals of what the limits refused.

        ``peers`` (said HELLO), ``pending`` (found, no HELLO yet), ``departed``,
        ``event_queue`` (events) and ``event_queue_bytes`` (octets of content)
        waiting for the application, ``connections`` to the mailbox,
        ``send_backlog`` (messages) and ``send_backlog_bytes`` waiting for slow
        peers, ``event_queue_full`` (times the mailbox stopped being read because
        ``event_queue`` events waited); then
        every counter of a limit hit so far (``peers_refused``,
        ``pending_refused``, ``pending_shed``, ``pending_timed_out``,
        ``unproven_refused``, ``unproven_shed``,
        ``hellos_refused``, ``groups_refused``, ``leaves_ignored``,
        ``reports_ignored``, ``events_dropped``, ``connections_shed``,
        ``held_dropped``, ``sequence_resyncs``...; see the configuration
        reference).
        """
        session, events = self._session, self._events
        result = {"peers": len(self._peers) - len(session.pending),
                  "pending": len(session.pending), "departed": len(session._departed),
                  "event_queue": len(events), "event_queue_bytes": events.octets(),
                  "connections": getattr(self._mailbox, "connections", 0),
                  "send_backlog": 0, "send_backlog_bytes": 0,
                  "event_queue_full": getattr(events, "pauses", 0)}
        for peer in self._peers.values():
            backlog = getattr(peer.link, "backlog", None)
            if backlog:
                result["send_backlog"] += len(backlog)
                result["send_backlog_bytes"] += peer.link.size  # type: ignore[attr-defined]
        self._count_dropped()
        result.update(session.counters.snapshot())
        return result

    def traffic(self) -> dict[str, int]:
        """Totals of what went through the mailbox since start (for the metrics).

        ``received_whispers``, ``received_shouts``, ``received_control`` (other
        ZRE commands), ``received_octets`` (content of WHISPERs and SHOUTs),
        ``sent_whispers``, ``sent_shouts`` (one per member a SHOUT went to),
        ``sent_control``, ``sent_octets`` (content), and ``dropped_REASON`` for
        input dropped as malformed or out of place (``short``,
        ``bad_signature``, ``before_hello``, ``sequence_gap``, ``malformed``).
        """
        session = self._session
        result = {"received_whispers": session.received_whispers,
                  "received_shouts": session.received_shouts,
                  "received_control": session.received_control,
                  "received_octets": getattr(self._events, "admitted", 0),
                  "sent_whispers": self._sent_whispers, "sent_shouts": self._sent_shouts,
                  "sent_control": session.sent_control, "sent_octets": self._sent_octets}
        result.update((f"dropped_{reason}", count) for reason, count in session.dropped.items())
        return result

    def peer_infos(self) -> list[PeerInfo]:
        """A snapshot of every ready peer (``peer_info`` of each, one clock reading)."""
        now = self._clock()
        return [PeerInfo(p, now, self._leads(p)) for p in self._peers.values() if p.ready]

    def round_trips(self) -> dict[UUID, tuple[str, Any]]:
        """(name, ``roundtrip.RoundTrip``) of each ready peer that answered a PING, live:
        read them on the node's hub."""
        return {p.uuid: (p.name, p.rtt) for p in self._peers.values()
                if p.ready and p.rtt is not None}

    def _count_dropped(self) -> None:
        """Move the event queue's drops since the last call into the session's counters."""
        counters = self._session.counters
        moved = self._events.dropped - counters.get("events_dropped")
        if moved:
            counters.add("events_dropped", moved)

    def peers(self) -> list[UUID]:
        """UUIDs of the peers that have said HELLO."""
        return [p.uuid for p in self._peers.values() if p.ready]

    def peers_by_group(self, group: str) -> list[UUID]:
        """UUIDs of the peers in ``group``."""
        return list(self._session.members.get(group, ()))

    def peer_info(self, peer: PeerRef) -> PeerInfo:
        """A snapshot of one peer: name, address, headers, groups, liveness, the groups it
        leads."""
        target = self._ready_peer(peer)
        return PeerInfo(target, self._clock(), self._leads(target))

    def _leads(self, peer: Peer) -> list[str]:
        """The groups that elected ``peer`` their leader."""
        return [g for g, u in self._session.leaders.items() if u == peer.uuid]

    def peer_name(self, peer: PeerRef) -> str:
        """The peer's name."""
        return self._ready_peer(peer).name

    def peer_address(self, peer: PeerRef) -> str:
        """The peer's mailbox endpoint, e.g. ``tcp://10.0.0.5:49200``."""
        return self._ready_peer(peer).endpoint

    def peer_headers(self, peer: PeerRef) -> dict[str, str]:
        """A copy of the peer's HELLO headers."""
        return dict(self._ready_peer(peer).headers)

    def peer_header_value(self, peer: PeerRef, key: str) -> Optional[str]:
        """One HELLO header of the peer, or None."""
        return self._ready_peer(peer).headers.get(key)

    def peer_groups(self, peer: PeerRef) -> list[str]:
        """The groups the peer is in."""
        return sorted(self._ready_peer(peer).groups)

    def known_groups(self) -> list[str]:
        """Every group some peer is in."""
        return sorted(g for g, members in self._session.members.items() if members)

    def find_peer(self, text: str) -> UUID:
        """A ready peer by UUID, unique UUID hex prefix, or name.

        Raises ``UnknownPeerError`` (saying why) when none or several match.
        """
        self._check_running()
        ready = [p for p in self._peers.values() if p.ready]
        key = text.lower().replace("-", "")
        for matches in ([p for p in ready if p.uuid.hex == key],
                        [p for p in ready if p.name == text],
                        [p for p in ready if key and p.uuid.hex.startswith(key)]):
            if len(matches) == 1:
                return matches[0].uuid
            if len(matches) > 1:
                names = ", ".join(f"{p.name} ({p.uuid.hex})" for p in matches)
                raise AmbiguousPeerError(f"{text!r} matches several peers: {names}")
        raise UnknownPeerError(f"no peer named or with UUID {text!r}")

    def _ready_peer(self, ref: PeerRef) -> Peer:
        if isinstance(ref, UUID):
            peer = self._peers.get(ref)
        else:
            try:
                peer = self._peers.get(UUID(str(ref)))
            except ValueError:
                raise UnknownPeerError(f"{ref!r} is not a peer UUID") from None
        if peer is None or not peer.ready:
            self._check_running()
            raise UnknownPeerError(f"no peer with UUID {ref}")
        return peer

    def _check_not_stopped(self) -> None:
        if self._state in ("stopping", "stopped"):
            raise NodeStateError(f"node is {self._state}")

    def _check_running(self) -> None:
        if self._state != "running":
            raise NodeStateError(f"node is {self._state}; call start() first"
                                 if self._state == "new" else f"node is {self._state}")

    # --- discovery (the ``discovery.PeerSink`` a source reports to) -----

    def peer_appeared(self, uuid: UUID, endpoint: str, key: Optional[bytes] = None) -> None:
        """A discovery source saw ``uuid`` accepting connections at ``endpoint``
        (``key``: the CURVE public key its beacon carried)."""
        if self._gate is None or self._gate.appeared(uuid, key):
            self._session.peer_appeared(uuid, endpoint, self._clock())
            self._apply_taken()

    def peer_alive(self, uuid: UUID) -> None:
        """A discovery source heard from ``uuid``: it is alive."""
        self._session.peer_alive(uuid, self._clock())  # (no outputs: a refresh)

    def peer_left(self, uuid: UUID, address: Optional[str] = None,
                  key: Optional[bytes] = None) -> None:
        """A discovery source says ``uuid`` is leaving (a port-0 beacon from ``address``,
        with ``key`` under CURVE)."""
        if self._gate is not None:
            self._gate.left(uuid, key, self._clock())
        else:
            self._session.peer_left(uuid, self._clock(), address)
        self._apply_taken()  # (and a departure to settle may wait on the peer's link)

    # --- for the session: links, the mailbox, the timer -----------------

    def _connect(self, uuid: UUID, endpoint: str) -> Optional[PeerLink]:
        """A link to the peer ``uuid`` at ``endpoint`` (the session's ``Dial``), or None."""
        try:
            self.transport.check_capacity(len(self._peers) + 1)
        except PeermeshError as exc:  # every beacon would say it again: count, log once a period
            counters, now = self._session.counters, self._clock()
            counters.add("descriptors_refused")
            if now >= self._descriptors_logged + REPORT_PERIOD:
                self._descriptors_logged = now
                log.error("not connecting to %s at %s (%d peers refused so far): %s", uuid,
                          endpoint, counters.get("descriptors_refused"), exc)
            return None
        cfg = self.config
        keys = {}
        if self._gate is not None:
            server_key = self._gate.server_key(uuid)
            if server_key is None:
                log.debug("not connecting to %s at %s: its key is unknown", uuid, endpoint)
                return None
            keys["server_key"] = server_key.encode()
        try:
            link = self.transport.connect(self._identity, endpoint, cfg.sndhwm, **keys)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EMFILE:
                log.error("not connecting to %s at %s: out of sockets or descriptors (%s)",
                          uuid, endpoint, exc)
            else:
                log.debug("cannot connect to %s at %r: %s", uuid, endpoint, exc)
            return None
        return PeerLink(link, cfg.send_buffer, cfg.send_queue, self._clock)

    def _knows(self, identity: bytes) -> bool:
        """Whether ``identity`` is a peer that said HELLO (its mailbox connection is kept)."""
        peer = self._session.by_identity.get(identity)
        return peer is not None and peer.ready

    def _linked(self, identity: bytes) -> Optional[bool]:
        """Whether ``identity`` holds a connection to the mailbox now (None: the transport
        cannot tell)."""
        routes_to = getattr(self._mailbox, "routes_to", None)
        return routes_to(identity) if routes_to is not None else None

    def _apply(self, outputs: Sequence[Output]) -> None:
        """Carry out the session's outputs in order: events (``Emit``, and WHISPERs and
        SHOUTs as ``Deliver``) to the listeners and the queue; each ``Dial`` answered with
        a ``PeerLink`` (``Session.attach``). A peer no link could be made to is forgotten,
        and its events that came after its ``Dial`` are dropped (it never entered)."""
        failed: Optional[set[Any]] = None
        for output in outputs:
            cls = type(output)
            if cls is Deliver:
                event = output.item   # type: ignore[union-attr]
                sink = self._message_sink
            elif cls is Emit:
                event = output.event  # type: ignore[union-attr]
                sink = self._sink
            elif cls is Dial:
                dial = cast(Dial, output)
                uuid = cast(UUID, dial.link)
                link = self._connect(uuid, dial.endpoint)
                if not self._session.attach(uuid, link):
                    if link is not None:
                        link.close()
                    else:
                        failed = {uuid} if failed is None else failed | {uuid}
                continue
            else:
                raise TypeError(f"not a ZRE session output: {output!r}")
            if failed is None or event.peer not in failed:
                sink(event)
        if failed is not None:
            self._apply_taken()  # (forgetting a peer may start a wave)

    def _apply_taken(self) -> None:
        """Carry out what the session was asked outside ``receive`` and ``handle_timer``
        (the timer then wakes sooner if the session needs it sooner: a claim or departure
        waiting on a peer's link)."""
        outputs = self._session.take()
        if self._driver is not None:
            self._driver.apply(outputs)
        elif outputs:
            self._apply(outputs)

    def _serve(self) -> None:
        """Serve the mailbox and the session's timer with a ``Driver``: a WHISPER or SHOUT
        goes from ``Session.delivery`` straight to the sink, any other message to
        ``receive``, whose outputs ``_apply`` carries out at once; reading pauses while the
        event queue is full; under CURVE the key gate checks each message's key inline."""
        session = self._session
        driver = self._driver = Driver(
            session, self.transport, on_deliver=self._message_sink, delivery=session.delivery,
            delivery_each=session.delivery_each, carry_out=self._apply,
            on_timer=self._before_timer, on_oversized=self._on_oversized,
            clock=self._clock, name=f"node {self._name}")
        gate = self._gate
        if gate is None:
            driver.listen(self._mailbox, None, self._events, replies=False)
            return
        gate_admit = gate.admit

        def admit(identity: bytes, frames: list[bytes], key: Optional[str]) -> bool:
            if gate_admit(identity, frames, key):
                return True
            self._apply_taken()  # (a key refused may remove its peer)
            return False
        driver.listen(self._mailbox, "User-Id", self._events, admit=admit,
                      admitted=gate.authenticated.get, replies=False)

    @property
    def _greenlets(self) -> list[gevent.Greenlet]:
        """The mailbox's reader and the timer (killing them is a crash, as tests make)."""
        return self._driver.greenlets if self._driver is not None else []

    def _on_oversized(self, identity: bytes) -> None:
        self._session.on_oversized(identity)
        self._apply_taken()

    def _before_timer(self, now: float) -> None:
        """This node's checks, run before the session's timers."""
        self._count_dropped()
        if self._events.blocked():
            self._held_back(now)
        if self._gate is not None:
            self._gate.tick(now)

    def _held_back(self, now: float) -> None:
        """While the application's queue is full the mailbox is not read: the peers'
        silence is this node's, so none is judged by it (EVASIVE, SILENT, expired), and
        each is PINGed every ``evasive / 2`` so that it hears this node is alive."""
        session, evasive = self._session, self.config.evasive
        for peer in list(self._peers.values()):
            peer.last_seen = now
            if peer.ready and now >= peer.next_ping:
                peer.next_ping = now + evasive / 2
                session.ping(peer)

    def __repr__(self) -> str:
        return f"<Node {self._name} {self._uuid.hex[:8]} {self._state} {self.endpoint or ''}>"
