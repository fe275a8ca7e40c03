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

Confirmed content moves too. A gateway that does not serve (it stepped
down, or came back after a crash while another serves) hands what its store
holds to the serving gateway in ZRE whispers::

    MTL-HANDOFF    | group | sequence (8 octets) | field table | body
    MTL-HANDOFF-OK | sequence (8 octets)        ; stored and committed up to it

batches of up to ``HANDOFF_BATCH``, each deleted here once acknowledged
(``peermesh.mtl.delivery``); unacknowledged within ``HANDOFF_WAIT`` seconds,
the rest stays and goes with the next try (every heartbeat while not
serving). Handovers are taken only from peers that advertise a gateway.

Greenlets on the node's hub, each a thin loop around the sans-io cores:

* control reader: each batch of requests -> ``ControlFlow.handle``, the
  reply sent at once (the core decides; the driver only strips and adds
  the ROUTER identity and REQ's empty delimiter);
* data reader: each batch of commands -> ``DataFlow.handle``, then
  ``DataFlow.flush`` (one store commit per batch: the group commit behind
  ``confirm: full``), then the sends and mesh actions;
* mesh: the group shouts the node hears (a listener queues them) ->
  ``DataFlow.shouted``, and handed-over content -> the store, a flush per
  batch (then the handovers are acknowledged);
* handoff (while not serving, with content stored): see above;
* timer: ``DataFlow.tick`` (heartbeats, dead links, lease expiry),
  ``ControlFlow.expire``, and a credentials-file check every second (users
  changed: their leases are revoked, their sessions answered 401).

Bounds: at most ``MAX_QUEUED`` mesh events wait for the mesh greenlet (more
are dropped: shouts are best effort, a handover is sent again); a control
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
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence
from uuid import UUID

import gevent
import gevent.event
import zmq

from ..events import Event, EventType
from ..io import HubSocket, bind, bind_ephemeral, make_socket
from ..io.socket import BATCH
from ..overlay import Overlay
from ..overlay.broker import BrokerTracker
from ..overlay.election import Change
from ..errors import ProtocolError
from ..wire.mtl import (MAX_REQUEST, Failure, Status, decode_table, encode_reply,
                        valid_string)
from .control import ControlFlow
from .credentials import Authenticator, CredentialsError, CredentialsFile
from .dataflow import DataFlow, Join, MeshAction, Shout
from .delivery import DurableQueues
from .store import ContentStore, store_path

if TYPE_CHECKING:
    from ..zre.node import Node

__all__ = ["Gateway", "GATEWAY_HEADER", "parse_gateway_header"]

log = logging.getLogger(__name__)

#: HELLO header of a node running a gateway: JSON ``{"control": endpoint, "data": endpoint}``
GATEWAY_HEADER = "X-PM-MTL-GATEWAY"
RUNS = ("always", "elected")
MAX_CONTENT = 16 * 1024 * 1024
SNDHWM = 10_000
_REFRESH_EVERY = 1.0
#: whispers of the handover of confirmed content between gateways
HANDOFF = b"MTL-HANDOFF"
HANDOFF_OK = b"MTL-HANDOFF-OK"
HANDOFF_BATCH = 256
HANDOFF_WAIT = 10.0
#: mesh events (shouts, handovers) waiting for the mesh greenlet; beyond, new ones are dropped
MAX_QUEUED = 100_000


def parse_gateway_header(raw: Optional[str]) -> Optional[str]:
    """The control endpoint in an ``X-PM-MTL-GATEWAY`` value; None if absent or malformed."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    endpoint = data.get("control") if isinstance(data, dict) else None
    if isinstance(endpoint, str) and endpoint.startswith("tcp://") and endpoint.isprintable() \
            and len(endpoint) < 256:
        return endpoint
    return None


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
                 profiles: Sequence[str] = ("test", "mesh"), plain: bool = False,
                 anonymous: bool = False, heartbeat: float = 1.0, liveness: int = 3,
                 lease_ttl: float = 30.0, session_lifetime: Optional[float] = None,
                 max_content: int = MAX_CONTENT, settle: Optional[float] = None,
                 on_serving: Optional[Callable[[bool], None]] = None) -> None:
        """``on_serving(active)``, if given, is called on the node's hub each time the
        gateway starts or stops serving (``run="elected"``: it was elected, or stepped down)."""
        super().__init__()
        if run not in RUNS:
            raise ValueError(f"run must be one of {', '.join(RUNS)}, not {run!r}")
        self.credentials = credentials if isinstance(credentials, CredentialsFile) \
            else CredentialsFile(credentials)
        mechanisms = ("SCRAM-SHA-256", "PLAIN") if plain else ("SCRAM-SHA-256",)
        self.authenticator = Authenticator(self.credentials, mechanisms)
        self.address = address
        self.run = run
        self.max_content = max_content
        self._on_serving = on_serving
        self._ports = (control_port, data_port)
        self._data_dir = data_dir
        self._core_options: dict[str, Any] = dict(
            virtual_hosts=dict(virtual_hosts) if virtual_hosts is not None else None,
            profiles=profiles, plain=plain, anonymous=anonymous,
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
        self._sockets: list[HubSocket] = []
        self._greenlets: list[gevent.Greenlet] = []
        self._shouts: deque[Event] = deque()
        self._shouted = gevent.event.Event()
        self._dropped_logged = 0.0
        self._handing: Optional[gevent.Greenlet] = None
        self._handoff_peer: Optional[UUID] = None
        self._acked = 0
        self._ack = gevent.event.Event()

    # --- the overlay contract -----------------------------------------------------

    def on_attach(self, node: "Node") -> None:
        """Bind both sockets and advertise them in ``X-PM-MTL-GATEWAY``."""
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

    def _bind(self, which: int, limit: int, frames: int) -> HubSocket:
        sock = make_socket(zmq.ROUTER, {zmq.MAXMSGSIZE: limit, zmq.SNDHWM: SNDHWM,
                                        zmq.RCVHWM: SNDHWM})
        try:
            port = self._ports[which]
            endpoint = bind(sock, _endpoint(self.address, port)) if port \
                else bind_ephemeral(sock, self.address)
        except BaseException:
            sock.close(linger=0)
            raise
        return HubSocket(sock, endpoint=endpoint, limit=limit, max_frames=frames)

    def on_start(self) -> None:
        node = self._node()
        if self._data_dir is not None:
            self.store = ContentStore(store_path(self._data_dir, node.name))
        queues = DurableQueues(self.store) if self.store is not None else None
        self.data = DataFlow(still_valid=self.credentials.still_valid, queues=queues,
                             shout=node.shout, **self._flow_options)
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

    def on_stop(self, timeout: float) -> None:
        node = self._node()
        try:
            node.remove_listener(self._on_node_event)
        except ValueError:
            pass
        self.tracker.stop(timeout)
        greenlets, self._greenlets = self._greenlets, []
        if self._handing is not None:
            greenlets.append(self._handing)
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
            if self._on_serving is not None:
                self._on_serving(elected)
            if not elected and self.data is not None and self.control is not None:
                for token in list(self.data.grants):
                    self.data.revoke(token)
                self.control.sessions.clear()
                self.data.flush()
                self._send(self.data.take())
        if not elected:
            self._hand_over_later()

    def _peer_entered(self, uuid: UUID, headers: Mapping[str, str], name: str) -> None:
        endpoint = parse_gateway_header(headers.get(GATEWAY_HEADER))
        if endpoint is not None:
            self._peers[uuid] = endpoint

    def _peer_left(self, uuid: UUID) -> None:
        self._peers.pop(uuid, None)

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

    def _read_with_address(self, sock: HubSocket, on_batch: Any) -> None:
        """``HubSocket.read``, with each message's peer address (for throttling)."""
        while True:
            try:
                batch = sock.recv_batch(BATCH, metadata="Peer-Address")
            except zmq.ZMQError:
                return
            if batch:
                on_batch(batch)
            if len(batch) == BATCH:
                gevent.sleep(0)  # more may wait: let others run first
            elif not sock.wait_readable():
                return  # closed

    def _data_reader(self) -> None:
        flow = self.data
        assert flow is not None

        def on_batch(batch: list) -> None:
            if not self.active:
                return
            now = time.time()
            handle = flow.handle
            for identity, rest in batch:
                if rest is not None:
                    try:
                        handle(identity, rest, now)
                    except Exception:  # a bug, or the node stopping: never the reader's end
                        log.exception("handling a data command from %r failed", identity[:16])
            flow.flush()
            self._send(flow.take())

        self._data_sock.read(on_batch)

    def _on_node_event(self, event: Event) -> None:
        # may run in a hub callback: queue for the mesh greenlet
        if event.type is EventType.SHOUT and event.group is not None:
            self._queue(event)
        elif event.type is EventType.WHISPER and event.frames:
            kind = event.frames[0]
            if kind == HANDOFF:
                self._queue(event)
            elif kind == HANDOFF_OK and event.peer == self._handoff_peer \
                    and len(event.frames) == 2 and len(event.frames[1]) == 8:
                self._acked = max(self._acked, int.from_bytes(event.frames[1], "big"))
                self._ack.set()

    def _queue(self, event: Event) -> None:
        if len(self._shouts) >= MAX_QUEUED:
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
                    self._take_handoff(event, acks)  # (also while not serving: never lost)
                elif self.active:
                    flow.shouted(event.group or "", list(event.frames),
                                 event.peer.hex if event.peer else "")
            committed = flow.flush()
            self._send(flow.take())
            if committed:
                for peer, sequence in acks.items():
                    self._whisper(peer, HANDOFF_OK, sequence.to_bytes(8, "big"))
            gevent.sleep(0)

    def _whisper(self, peer: UUID, *frames: bytes) -> bool:
        try:
            self._node().whisper(peer, *frames)
        except Exception as error:  # the peer left, the node is stopping
            log.debug("whisper to %s failed: %s", peer, error)
            return False
        return True

    # --- handing confirmed content over ---------------------------------------------

    def _take_handoff(self, event: Event, acks: dict[UUID, int]) -> None:
        """Store one handed-over content (from a gateway, well-formed), noting its ack."""
        flow = self.data
        frames = event.frames
        if flow is None or flow.queues is None or event.peer not in self._peers \
                or len(frames) != 5 or len(frames[2]) != 8:
            return
        _, group_bytes, sequence, table, body = frames
        if len(table) < 2 or int.from_bytes(table[:2], "big") != len(table) - 2:
            return
        try:
            group = group_bytes.decode("utf-8")
            decode_table(table[2:])
        except (UnicodeDecodeError, ProtocolError):
            return
        if not group or not valid_string(group):
            return
        number = int.from_bytes(sequence, "big")
        if event.peer in acks and number <= acks[event.peer]:
            return
        if flow.queues.received(group, body, table):
            acks[event.peer] = number

    def _hand_over_later(self) -> None:
        """Start handing stored content to the serving gateway, unless already doing so."""
        if self.data is None or self.data.queues is None or not self.data.queues.store.count:
            return
        if self._handing is None or self._handing.dead:
            self._handing = gevent.spawn(self._hand_over)

    def _hand_over(self) -> None:
        queues = self.data.queues if self.data is not None else None
        assert queues is not None
        while not self.active:
            broker = self.tracker.current_broker
            target = broker.uuid if broker is not None and broker.uuid in self._peers else None
            if target is None:
                return
            batch = queues.handoff_batch(HANDOFF_BATCH)
            if not batch:
                return
            self._handoff_peer, self._acked = target, 0
            self._ack.clear()
            last = batch[-1].sequence
            sent = all(self._whisper(target, HANDOFF, d.resource.encode("utf-8"),
                                     d.sequence.to_bytes(8, "big"),
                                     d.properties or b"\x00\x00", d.body) for d in batch)
            deadline = time.monotonic() + HANDOFF_WAIT
            while sent and self._acked < last and self._ack.wait(deadline - time.monotonic()):
                self._ack.clear()
            if self._acked:
                queues.handed(self._acked)
            if self._acked < last:
                queues.handoff_failed()
                log.info("handing content over to %s stopped: not all of %d acknowledged",
                         target, len(batch))
                return
            log.debug("handed %d contents over to %s", len(batch), target)


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
                flow.flush()
                self._send(flow.take())
            else:
                wake = now + flow.heartbeat
                if self.run == "elected":
                    self._hand_over_later()  # (again, after a handover that stopped)
            gevent.sleep(max(0.0, min(wake, refreshed + _REFRESH_EVERY) - time.time()))

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
        for action in actions:
            try:
                if type(action) is Shout:
                    shout(action.group, *action.frames)
                elif type(action) is Join:
                    node.join(action.group)
                else:
                    node.leave(action.group)
            except Exception as error:  # the node stopping, a group name it refuses
                log.debug("mesh action %r failed: %s", action, error)

    # --- introspection -----------------------------------------------------------------

    @property
    def data_port(self) -> int:
        """The data ROUTER's port (the one every 202 names)."""
        return self._data_sock.port if self._sockets else 0

    def __repr__(self) -> str:
        state = "serving" if self.active else "standing by"
        return f"<Gateway {self.control_endpoint or 'unbound'} {state}>"

