"""A ZRE v2 node on gevent.

How it works
------------
A started node runs four greenlets on the hub of the thread that started it:

* **beacon sender** - a 22-octet beacon at once, then every ``interval``;
* **beacon listener** - beacons from unknown UUIDs become peers (a DEALER is
  connected to ``tcp://sender-ip:port`` and HELLO sent first); beacons from
  known peers refresh them; a port-0 beacon removes the peer at once;
* **mailbox reader** - drains the ROUTER without blocking and waits on its
  descriptor only when it is empty. A HELLO from an unknown node makes it a
  peer; any other command from a node that has not said HELLO is ignored.
  Every command after HELLO must carry the next sequence number (mod 65536);
  a gap or an out-of-order message disconnects the peer, which may then be
  rediscovered by its next beacon;
* **reaper** - PINGs silent peers and reports EVASIVE, then SILENT, and
  removes them (EXIT) once ``expired`` passes with no sign of life.

Sends never block the hub: see ``peer.PeerLink``. Application calls that
would exceed a slow peer's backlog wait up to ``send_timeout`` for room, then
the peer counts as not responding: it is disconnected (EXIT, reason given)
and ``whisper`` raises ``PeerNotResponding``.
"""

from __future__ import annotations

import errno
import functools
import logging
import re
import struct
import time
from collections import deque
import uuid as uuid_module
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union
from uuid import UUID

import gevent
import gevent.event
import msgpack
import zmq

from ..config import NodeConfig
from ..discovery import Discovery
from ..discovery.beacon import BeaconDiscovery, parse_seed
from ..errors import (AmbiguousPeerError, NodeStateError, PeermeshError, PeerNotResponding,
                     ProtocolError, UnknownPeerError)
from .eventqueue import GreenEventQueue
from ..events import Event, EventType, until_stop
from ..net.interfaces import Interface
from .peer import Peer, PeerLink
from ..io.transport import ZmqTransport
from ..wire import zre

__all__ = ["Node", "PeerInfo", "Frame"]

log = logging.getLogger(__name__)

Frame = Union[bytes, bytearray, memoryview, str]
PeerRef = Union[UUID, str]

_HEADER = struct.Struct(">HBBH")
_WHISPER_HEADER = _HEADER.pack
_SIGNATURE = zre.SIGNATURE
_WHISPER, _SHOUT, _HELLO = 2, 3, 1
_WHISPER_PREFIX = b"\xaa\xa1\x02\x02"  # signature, WHISPER, version 2
_SHOUT_PREFIX = b"\xaa\xa1\x03\x02"    # signature, SHOUT, version 2
#: HELLO header of nodes that want peer exchange (they use seeds, not broadcast)
PEX_HEADER = "X-PM-PEX"
_PEX_CHUNK = 1024  # peers per PEX message
_PEX_ENTRY = re.compile(r"([0-9a-f]{32}) (tcp://\d{1,3}(?:\.\d{1,3}){3}:\d{1,5})")

ENTER, EXIT, JOIN, LEAVE = EventType.ENTER, EventType.EXIT, EventType.JOIN, EventType.LEAVE
WHISPER, SHOUT = EventType.WHISPER, EventType.SHOUT


class PeerInfo:
    """A snapshot of what a node knows about a peer."""

    __slots__ = ("uuid", "name", "address", "headers", "groups")

    def __init__(self, peer: Peer) -> None:
        self.uuid: UUID = peer.uuid
        self.name: str = peer.name
        self.address: str = peer.endpoint
        self.headers: dict[str, str] = dict(peer.headers)
        self.groups: list[str] = sorted(peer.groups)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return {"peer": self.uuid.hex, "name": self.name, "address": self.address,
                "headers": self.headers, "groups": self.groups}

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


@functools.lru_cache(maxsize=2048)
def _decode_hello(frame: bytes) -> zre.Message:
    """``zre.decode`` of a one-frame HELLO, remembered for the whole process.

    Where many nodes share a process (the simulator, meshes in one process)
    every one of them decodes each sender's same HELLO; a node alone decodes
    each peer's once. Only short frames are cached (see ``_on_hello``), so
    the cache stays under a few megabytes whatever peers send; decoded
    messages are immutable and ``_accept_hello`` copies what it keeps.
    """
    return zre.decode([frame])


_HELLO_CACHED = 1024  # octets: longer HELLO frames are decoded every time


def _utf8(data: bytes) -> Optional[str]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


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
        #: how frames, beacons and time move (``transport.ZmqTransport`` or a simulated one)
        self.transport: Any = transport if transport is not None else ZmqTransport()
        #: discovery sources; by default those ``config.discovery`` and ``config.seeds`` name
        self._discovery = list(sources) if sources is not None else \
            _discovery_from_config(self.config)
        self._uuid = uuid_module.uuid4()
        self._uuid_bytes = self._uuid.bytes
        self._identity = b"\x01" + self._uuid_bytes
        self._name = _checked_string("name", self.config.name or self._uuid.hex[:6].upper())
        self._headers: dict[str, str] = {}
        for key, value in self.config.headers.items():
            self.set_header(key, value)
        self._groups: set[str] = set()
        self._status = 0
        for group in self.config.groups:
            self._add_own_group(_checked_string("group", group))
        if any(isinstance(d, BeaconDiscovery) and (d.seeds or not d.broadcast)
               for d in self._discovery):
            self._headers.setdefault(PEX_HEADER, "1")
        self._clock = clock if clock is not None else self.transport.now
        self._events = _events if _events is not None else GreenEventQueue(self.config.event_queue)
        self._listeners: list[Callable[[Event], None]] = []
        self._peers: dict[UUID, Peer] = {}
        self._by_identity: dict[bytes, Peer] = {}
        self._by_endpoint: dict[str, Peer] = {}
        self._restarts: dict[UUID, float] = {}  # when a peer's HELLO last meant a restart
        self._departed: dict[UUID, float] = {}  # when a peer said it was leaving
        self._members: dict[str, dict[UUID, Peer]] = {}
        self._state = "new"
        self._greenlets: list[gevent.Greenlet] = []
        self.interface: Optional[Interface] = None
        self.endpoint: Optional[str] = None
        self.mailbox_port = 0
        self._hello: Optional[list[bytes]] = None
        self._last_target: Optional[tuple[PeerRef, Peer]] = None
        self._mailbox: Any = None

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
        self._mailbox = self.transport.bind_mailbox(itf.address, cfg.max_message)
        self.mailbox_port = self._mailbox.port
        self.endpoint = f"tcp://{itf.address}:{self.mailbox_port}"
        self._state = "running"
        started: list[Discovery] = []
        try:
            for source in self._discovery:
                source.start(self)
                started.append(source)
        except BaseException:
            for source in started:
                source.stop()
            self._mailbox.close()
            self._state = "stopped"
            raise
        self._greenlets = [gevent.spawn(self._mailbox_reader), gevent.spawn(self._reaper)]
        log.debug("node %s (%s) started on %s", self._name, self._uuid.hex, self.endpoint)
        return self

    def stop(self, timeout: float = 1.0) -> None:
        """Leave the mesh: a port-0 beacon, flush what is queued (up to ``timeout``), close."""
        if self._state != "running":
            return
        self._state = "stopping"
        deadline = time.monotonic() + timeout
        self.flush(timeout)
        try:
            for source in self._discovery:
                source.stop()
        finally:
            gevent.killall(self._greenlets)
            linger = max(0.0, deadline - time.monotonic())
            for peer in self._peers.values():
                peer.link.close(linger)
            self._peers.clear()
            self._by_identity.clear()
            self._by_endpoint.clear()
            self._members.clear()
            self._mailbox.close()
            self._state = "stopped"
            self._emit(Event(EventType.STOP))

    def flush(self, timeout: float = 1.0) -> bool:
        """Wait until every peer sent to since the last check has processed it.

        Each such peer gets a PING; its PING-OK proves that everything sent
        before has reached its node (commands are handled in order). True if
        all answered within ``timeout`` seconds. ``stop`` calls this first.
        """
        pending = [(p, p.total) for p in self._peers.values() if p.unconfirmed and p.ready]
        for peer, target in pending:
            peer.unconfirmed = False
            if not peer.pings or peer.pings[-1] < target:
                self._ping(peer)  # a PING already on its way may predate the last message
        deadline = time.monotonic() + timeout
        for peer, target in pending:
            while peer.confirmed < target and self._peers.get(peer.uuid) is peer:
                if peer.pong is None:
                    peer.pong = gevent.event.Event()
                peer.pong.clear()
                if not peer.pong.wait(max(0.0, deadline - time.monotonic())):
                    return False
        return all(peer.confirmed >= target for peer, target in pending)

    def _ping(self, peer: Peer) -> None:
        self._send_control(peer, zre.Ping(peer.next_sequence()))
        if peer.pings is None:
            peer.pings = deque()
        peer.pings.append(peer.total)

    def __enter__(self) -> "Node":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._state == "running"

    # --- groups ---------------------------------------------------------

    def join(self, group: str) -> None:
        """Join ``group`` and tell every peer (JOIN)."""
        self._check_not_stopped()
        _checked_string("group", group)
        if group in self._groups:
            return
        self._add_own_group(group)
        for peer in list(self._peers.values()):
            self._send_control(peer, zre.Join(peer.next_sequence(), group, self._status))

    def leave(self, group: str) -> None:
        """Leave ``group`` and tell every peer (LEAVE)."""
        self._check_not_stopped()
        _checked_string("group", group)
        if group not in self._groups:
            return
        self._groups.discard(group)
        self._status = (self._status + 1) & 0xFF
        self._hello = None
        for peer in list(self._peers.values()):
            self._send_control(peer, zre.Leave(peer.next_sequence(), group, self._status))

    def _add_own_group(self, group: str) -> None:
        self._groups.add(group)
        self._status = (self._status + 1) & 0xFF
        self._hello = None

    def groups(self) -> list[str]:
        """The groups this node is in."""
        return sorted(self._groups)

    # --- sending --------------------------------------------------------

    def whisper(self, peer: PeerRef, *frames: Frame) -> None:
        """Send ``frames`` (one message, one or more frames) to one peer.

        Raises ``UnknownPeerError`` if no ready peer has that UUID, and
        ``PeerNotResponding`` if the peer's queue stayed full for
        ``send_timeout`` (the peer is then disconnected).
        """
        target = self._ready_peer(peer)
        if len(frames) == 1 and type(frames[0]) is bytes:
            content = [b"", frames[0]]
        else:
            content = [b"", *map(_frame, frames)]
        link = target.link
        if link.backlog and not link.has_room() and not self._wait_room(target):
            raise PeerNotResponding(f"peer {target.name} ({target.uuid}) is not responding")
        content[0] = _WHISPER_HEADER(_SIGNATURE, _WHISPER, zre.VERSION, target.next_sequence())
        link.offer(content)
        target.unconfirmed = True

    def shout(self, group: str, *frames: Frame) -> None:
        """Send ``frames`` to every peer in ``group``, one unicast SHOUT each.

        A member whose queue stays full for ``send_timeout`` is disconnected
        (EXIT with reason "not responding") without delaying the others.
        """
        group_field = zre.encode_string(_checked_string("group", group))
        self._check_running()
        content = [_frame(f) for f in frames]
        members = self._members.get(group)
        if not members:
            return
        slow = []
        for peer in list(members.values()):
            if peer.link.has_room():
                peer.link.offer([zre.shout_header(peer.next_sequence(), group_field), *content])
                peer.unconfirmed = True
            else:
                slow.append(peer)
        for peer in slow:
            if self._wait_room(peer):
                peer.link.offer([zre.shout_header(peer.next_sequence(), group_field), *content])
                peer.unconfirmed = True

    def whisper_packed(self, peer: PeerRef, obj: Any) -> None:
        """``whisper`` one msgpack-encoded object (read it with ``Event.unpack``)."""
        self.whisper(peer, msgpack.packb(obj, use_bin_type=True))

    def shout_packed(self, group: str, obj: Any) -> None:
        """``shout`` one msgpack-encoded object (read it with ``Event.unpack``)."""
        self.shout(group, msgpack.packb(obj, use_bin_type=True))

    def _wait_room(self, peer: Peer) -> bool:
        link = peer.link
        if link.has_room():
            return True
        if link.wait_room(self.config.send_timeout) and self._peers.get(peer.uuid) is peer:
            return True
        self._remove(peer, "not responding: send queue full")  # no-op if already gone
        return False

    def _send_control(self, peer: Peer, message: zre.Message) -> None:
        link = peer.link
        if link.queued() > 2 * link.limit:
            self._remove(peer, "not responding: send queue full")
            return
        link.offer(zre.encode(message))

    # --- receiving ------------------------------------------------------

    def add_listener(self, callback: Callable[[Event], None]) -> None:
        """Call ``callback(event)`` on the node's hub for every event, before it is queued.

        For overlays that track the mesh (ENTER, EXIT, headers); the
        application still gets every event. The callback may run inside a
        hub callback (the mailbox drains there), where blocking raises
        ``BlockingSwitchOutError``: it must not block; hand slow work to a
        greenlet of its own.
        """
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[Event], None]) -> None:
        """Stop calling ``callback``."""
        self._listeners.remove(callback)

    def _emit(self, event: Event) -> None:
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # an overlay's bug must not take the node down
                log.exception("event listener %r failed", listener)
        self._events.put(event)

    def recv(self, timeout: Optional[float] = None) -> Optional[Event]:
        """The next event, or None after ``timeout`` seconds (None: wait for ever)."""
        if self._state == "stopped" and not len(self._events):
            return None
        return self._events.get(timeout)

    def events(self, timeout: Optional[float] = None) -> Iterator[Event]:
        """Iterate over events until STOP, or until none came for ``timeout`` seconds."""
        return until_stop(self.recv, timeout)

    # --- the peer view --------------------------------------------------

    def peers(self) -> list[UUID]:
        """UUIDs of the peers that have said HELLO."""
        return [p.uuid for p in self._peers.values() if p.ready]

    def peers_by_group(self, group: str) -> list[UUID]:
        """UUIDs of the peers in ``group``."""
        return list(self._members.get(group, ()))

    def peer_info(self, peer: PeerRef) -> PeerInfo:
        """A snapshot of one peer: name, address, headers, groups."""
        return PeerInfo(self._ready_peer(peer))

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
        return sorted(g for g, members in self._members.items() if members)

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
        last = self._last_target
        if last is not None and last[0] is ref and last[1].ready:
            return last[1]  # the same UUID object as the last call: skip hashing it
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
        self._last_target = (ref, peer)
        return peer

    def _check_not_stopped(self) -> None:
        if self._state in ("stopping", "stopped"):
            raise NodeStateError(f"node is {self._state}")

    def _check_running(self) -> None:
        if self._state != "running":
            raise NodeStateError(f"node is {self._state}; call start() first"
                                 if self._state == "new" else f"node is {self._state}")

    # --- discovery ------------------------------------------------------

    def peer_appeared(self, uuid: UUID, endpoint: str) -> None:
        """A discovery source saw ``uuid`` accepting connections at ``endpoint``."""
        if self._state != "running" or uuid == self._uuid:
            return
        peer = self._peers.get(uuid)
        if peer is not None:
            peer.refresh(self._clock())
        elif self._clock() - self._departed.get(uuid, -1e18) >= self.config.expired:
            self._require_peer(uuid, endpoint)
        # else: it said it was leaving; a stale report (PEX, mDNS cache) must not revive it

    def peer_alive(self, uuid: UUID) -> None:
        """A discovery source heard from ``uuid``: it is alive."""
        peer = self._peers.get(uuid)
        if peer is not None:
            peer.refresh(self._clock())

    def peer_left(self, uuid: UUID) -> None:
        """A discovery source says ``uuid`` is leaving (a port-0 beacon)."""
        peer = self._peers.get(uuid)
        self._departed[uuid] = self._clock()
        if peer is not None:
            self._remove(peer, "left")

    # --- peers ----------------------------------------------------------

    def _require_peer(self, uuid: UUID, endpoint: str) -> Optional[Peer]:
        peer = self._peers.get(uuid)
        if peer is not None:
            return peer
        if not endpoint.startswith("tcp://") or endpoint == self.endpoint:
            log.debug("ignored peer %s with endpoint %r", uuid, endpoint)
            return None
        holder = self._by_endpoint.get(endpoint)
        if holder is not None:
            if self._clock() - holder.last_seen < self.config.evasive:
                log.debug("ignored peer %s: %s already lives at %s", uuid, holder.name, endpoint)
                return None
            self._remove(holder, "replaced by another node at its endpoint")
        assert self.endpoint is not None
        try:
            self.transport.check_capacity(len(self._peers) + 1)
        except PeermeshError as exc:
            log.error("not connecting to %s at %s: %s", uuid, endpoint, exc)
            return None
        try:
            link = self.transport.connect(self._identity, endpoint, self.config.sndhwm)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EMFILE:
                log.error("not connecting to %s at %s: out of sockets or descriptors (%s)",
                          uuid, endpoint, exc)
            else:
                log.debug("cannot connect to %s at %r: %s", uuid, endpoint, exc)
            return None
        peer = Peer(uuid, endpoint, PeerLink(link, self.config.send_queue, self._clock),
                    self._clock())
        self._peers[uuid] = peer
        self._by_identity[peer.identity] = peer
        self._by_endpoint[endpoint] = peer
        if self._hello is None:  # the same for every peer until our groups change
            self._hello = zre.encode(zre.Hello(1, self.endpoint, tuple(self._groups),
                                               self._status, self._name, self._headers))
        peer.next_sequence()  # HELLO is always number 1
        peer.link.offer(self._hello)
        return peer

    def _remove(self, peer: Peer, reason: str) -> None:
        if self._peers.get(peer.uuid) is not peer:
            return
        del self._peers[peer.uuid]
        self._last_target = None
        del self._by_identity[peer.identity]
        if self._by_endpoint.get(peer.endpoint) is peer:
            del self._by_endpoint[peer.endpoint]
        for group in peer.groups:
            members = self._members.get(group)
            if members is not None:
                members.pop(peer.uuid, None)
        peer.link.close()
        if peer.pong is not None:
            peer.pong.set()  # wake flush(): the peer is gone
        if peer.ready:
            log.debug("peer %s (%s) removed: %s", peer.name, peer.uuid.hex, reason)
            self._emit(Event(EXIT, peer.uuid, peer.name, address=peer.endpoint,
                                   reason=reason))

    def _peer_join(self, peer: Peer, group: str) -> None:
        if group in peer.groups:
            return
        peer.groups = {*peer.groups, group}  # joins are rare; an idle peer holds no set
        self._members.setdefault(group, {})[peer.uuid] = peer
        self._emit(Event(JOIN, peer.uuid, peer.name, group))

    def _peer_leave(self, peer: Peer, group: str) -> None:
        if group not in peer.groups:
            return
        peer.groups = peer.groups - {group}
        self._members.get(group, {}).pop(peer.uuid, None)
        self._emit(Event(LEAVE, peer.uuid, peer.name, group))

    # --- mailbox --------------------------------------------------------

    def _mailbox_reader(self) -> None:
        self._mailbox.serve(self._on_message, self._on_oversized, self._events)

    def _on_oversized(self, identity: bytes) -> None:
        log.debug("dropped message over max_message=%d from %r", self.config.max_message,
                  identity)
        peer = self._by_identity.get(identity)
        if peer is not None:
            self._remove(peer, f"sent a message over max_message ({self.config.max_message})")

    def _on_message(self, identity: bytes, frames: list[bytes]) -> None:
        head = frames[0] if frames else b""
        peer = self._by_identity.get(identity)
        # Fast path: the next WHISPER or SHOUT from a ready peer (most of the traffic).
        if (peer is not None and peer.ready and len(head) >= 6
                and head[4] << 8 | head[5] == peer.want):
            prefix = head[:4]
            group = None
            if prefix == _SHOUT_PREFIX and len(head) == 7 + head[6]:
                group = _utf8(head[7:])  # None if not UTF-8: the slow path drops it
            if group is not None or prefix == _WHISPER_PREFIX and len(head) == 6:
                peer.want = (peer.want + 1) & 0xFFFF
                peer.last_seen = self._clock()
                if peer.next_ping:
                    peer.refresh(peer.last_seen)
                if group is None or group in self._groups:
                    event = Event(WHISPER if group is None else SHOUT, peer.uuid, peer.name,
                                  group, tuple(frames[1:]))
                    if self._listeners:
                        self._emit(event)
                    else:
                        self._events.put(event)
                return
        if len(head) < 6:
            log.debug("dropped short message from %r", identity)
            return
        signature, command, version, sequence = _HEADER.unpack_from(head)
        if signature != _SIGNATURE or version != zre.VERSION:
            log.debug("dropped message with bad signature/version from %r", identity)
            return
        if command == _HELLO:
            self._on_hello(identity, frames, peer)
            return
        if peer is None or not peer.ready:
            log.debug("ignored command %d before HELLO from %r", command, identity)
            return
        if sequence != peer.want:
            log.debug("sequence gap from %s: expected %d, got %d", peer.name, peer.want, sequence)
            self._remove(peer, f"sequence gap (expected {peer.want}, got {sequence})")
            return
        peer.want = (sequence + 1) & 0xFFFF
        peer.last_seen = self._clock()
        if peer.evasive or peer.next_ping:
            peer.refresh(peer.last_seen)
        try:
            message = zre.decode(frames)
        except ProtocolError as exc:
            log.debug("dropped malformed command from %s: %s", peer.name, exc.reason)
            return
        if isinstance(message, zre.Shout):
            if message.group in self._groups:
                self._emit(Event(SHOUT, peer.uuid, peer.name, message.group,
                                       message.content))
        elif isinstance(message, zre.Join):
            self._peer_status(peer, message.status)
            self._peer_join(peer, message.group)
        elif isinstance(message, zre.Leave):
            self._peer_status(peer, message.status)
            self._peer_leave(peer, message.group)
        elif isinstance(message, zre.Ping):
            self._send_control(peer, zre.PingOk(peer.next_sequence()))
        elif isinstance(message, zre.PeerExchange):
            self._on_peer_exchange(peer, message)
        elif isinstance(message, zre.PingOk):
            if peer.pings:
                peer.confirmed = peer.pings.popleft()
            if peer.pong is not None:
                peer.pong.set()
        # Unknown commands (Zyre's ELECT/LEADER) only advance the sequence

    def _peer_status(self, peer: Peer, status: int) -> None:
        expected = (peer.status + 1) & 0xFF
        if status != expected:
            log.debug("group status of %s is %d, expected %d", peer.name, status, expected)
        peer.status = status

    def _on_hello(self, identity: bytes, frames: list[bytes], peer: Optional[Peer]) -> None:
        try:
            if len(frames) == 1 and len(frames[0]) <= _HELLO_CACHED:
                hello = _decode_hello(frames[0])
            else:
                hello = zre.decode(frames)
        except ProtocolError as exc:
            log.debug("dropped malformed HELLO from %r: %s", identity, exc.reason)
            return
        assert isinstance(hello, zre.Hello)
        if len(identity) != 17 or identity[0] != 1 or identity[1:] == self._uuid_bytes:
            log.debug("dropped HELLO with identity %r", identity)
            return
        if hello.sequence != 1:
            log.debug("dropped HELLO with sequence %d", hello.sequence)
            return
        if self._state != "running":
            return  # leaving: take no new peers
        now = self._clock()
        if peer is not None and peer.ready:
            if (hello.endpoint == peer.endpoint
                    and now - self._restarts.get(peer.uuid, -1e18) < self.config.interval):
                # The HELLO answers one we sent for its restart moments ago: take it
                # in without answering again, or two nodes would restart each other
                # for ever.
                self._accept_hello(peer, hello, announce=False)
                return
            self._restarts[peer.uuid] = now
            self._remove(peer, "restarted (new HELLO)")
            peer = None
        elif peer is not None and hello.endpoint != peer.endpoint:
            # Found at another address (a stale or forged report): the peer's own
            # word wins, or it would never hear from us.
            self._remove(peer, "connected to the wrong endpoint")
            peer = None
        if peer is None:
            peer = self._require_peer(UUID(bytes=identity[1:]), hello.endpoint)
            if peer is None:
                return
        self._accept_hello(peer, hello, announce=True)

    def _accept_hello(self, peer: Peer, hello: zre.Hello, announce: bool) -> None:
        peer.ready = True
        peer.want = 2
        peer.name = hello.name
        peer.headers = dict(hello.headers)
        peer.status = hello.status
        peer.refresh(self._clock())
        if announce:
            self._emit(Event(ENTER, peer.uuid, peer.name, headers=dict(peer.headers),
                             address=peer.endpoint))
            if peer.headers.get(PEX_HEADER) == "1":
                self._send_peer_exchange(peer)
        for group in peer.groups - set(hello.groups):
            self._peer_leave(peer, group)
        for group in hello.groups:
            self._peer_join(peer, group)

    # --- peer exchange (a peermesh extension, only with peers that ask) --

    def _send_peer_exchange(self, peer: Peer) -> None:
        """Tell a peer that asked for it (X-PM-PEX) every other peer we know."""
        entries = [f"{p.uuid.hex} {p.endpoint}" for p in self._peers.values()
                   if p.ready and p is not peer]
        for start in range(0, len(entries), _PEX_CHUNK):
            chunk = tuple(entries[start:start + _PEX_CHUNK])
            self._send_control(peer, zre.PeerExchange(peer.next_sequence(), chunk))

    def _on_peer_exchange(self, peer: Peer, message: zre.PeerExchange) -> None:
        if self._headers.get(PEX_HEADER) != "1":
            log.debug("ignored PEX from %s: this node did not ask for it", peer.name)
            return
        for entry in message.peers[:_PEX_CHUNK]:
            match = _PEX_ENTRY.fullmatch(entry)
            if match is None:
                log.debug("ignored malformed PEX entry %r from %s", entry[:80], peer.name)
                continue
            self.peer_appeared(UUID(hex=match[1]), match[2])

    # --- timers ---------------------------------------------------------

    def _reaper(self) -> None:
        cfg = self.config
        period = min(cfg.interval, cfg.evasive / 2)
        while True:
            self.transport.sleep(period)
            self._reap(self._clock())

    def _reap(self, now: float) -> None:
        cfg = self.config
        for uuid, when in list(self._restarts.items()):
            if now - when >= cfg.interval:
                del self._restarts[uuid]
        for uuid, when in list(self._departed.items()):
            if now - when >= cfg.expired:
                del self._departed[uuid]
        for peer in list(self._peers.values()):
            stalled = peer.link.stalled_since
            if stalled is not None and now - stalled >= cfg.expired:
                self._remove(peer, "not responding: send queue stalled")
                continue
            idle = now - peer.last_seen
            if idle >= cfg.expired:
                self._remove(peer, "expired")
                continue
            if idle >= cfg.evasive and now >= peer.next_ping:
                peer.next_ping = now + cfg.evasive
                self._ping(peer)
                if not peer.evasive and peer.ready:
                    peer.evasive = True
                    self._emit(Event(EventType.EVASIVE, peer.uuid, peer.name))
            if idle >= cfg.silent and not peer.silent and peer.ready:
                peer.silent = True
                self._emit(Event(EventType.SILENT, peer.uuid, peer.name))

    def __repr__(self) -> str:
        return f"<Node {self._name} {self._uuid.hex[:8]} {self._state} {self.endpoint or ''}>"
