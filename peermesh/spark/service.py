"""The driver-side service: a mesh node whose group traffic becomes a log Spark reads.

How it works
------------
``DriverService`` runs in the Spark driver's own process, beside the user's
program, with no monkey-patching:

* a ``ThreadedNode`` (its own thread and private gevent hub) joins the
  configured groups and, when ``peermesh.sada`` is importable, carries a
  Safir-Darbaan channel (``X-PM-SADA-CHANNEL`` in its HELLO), so servers on
  the LAN connect to it as to any channel;
* an **ingest** thread takes every SHOUT the node receives in its groups and
  appends it, in arrival order, to a ``MessageLog`` (SQLite, WAL) under the
  configured directory, in batches of whatever has arrived;
* a **log server** thread answers the ``PMLOG1`` protocol (see
  ``protocol``) on a ZeroMQ ROUTER, served by the I/O layer's ``HubSocket``
  on that thread's own gevent hub: offsets, ranges of rows, consumer
  registration, commits and trims. Spark calls the data source only in
  Python worker processes, never in the driver's own; they reach the log
  through this socket.

Nothing here imports pyspark.
"""

from __future__ import annotations

import logging
import os
import hmac
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import gevent
import zmq

from ..counters import Counters
from ..errors import NodeStateError, PeermeshError
from ..events import EventType
from ..io import HubSocket, bind, bind_ephemeral, make_socket, shared_context
from ..io.connections import COUNTERS, GuardedListener
from ..net.interfaces import select_interface
from ..overlay import Lifecycle, Overlay
from . import protocol
from .gateway import GATEWAY_USER, HandOver, LogQueues, new_password, parse_gateway, \
    write_patterns
from .log import MessageLog, host_id
from .remotecalls import CALLS, REPLIES, Call, CallRelay, is_local, submit
from .protocol import Op, Reply, Request

__all__ = ["DriverService", "LogAdvert", "MeshSettings", "start_service", "current_service",
           "HEADER_LOG", "DEFAULT_DIRECTORY"]

log = logging.getLogger(__name__)

#: HELLO header of the driver node: the log service's endpoint
HEADER_LOG = "X-PM-SPARK-LOG"
#: where logs go when no directory is given: $PEERMESH_SPARK_DIR, else ./peermesh-data
DEFAULT_DIRECTORY = "peermesh-data"
#: bounds of the log server's socket: a request is a small msgpack map, and a client
#: that does not read its replies holds at most a few FETCH replies (16 MiB each)
_MAX_REQUEST = 1024 * 1024
_SERVER_SNDHWM = 4
_SERVER_RCVHWM = 256
#: how long the log keeps a message by default (Kafka's ``retention.ms``: 7 days)
DEFAULT_RETENTION = 7 * 24 * 3600.0
_INGEST_BATCH = 20_000              #: messages appended in one transaction, at most
_INGEST_BYTES = 64 * 1024 * 1024    #: payload bytes appended in one transaction, at most
_RETAIN_EVERY = 1.0                 #: seconds between two retention passes
_POLL_MS = 100
_GATEWAY_POLL_MS = 10   #: with a gateway: how soon its hand-overs are appended, at most


@dataclass(frozen=True)
class MeshSettings:
    """How a node in a Spark worker process joins the same mesh as the driver.

    Picklable; the data source and ``ServiceCaller`` carry one to executors.
    Fields are ``NodeConfig`` settings (None: the worker's own default,
    ``PEERMESH_*`` or built-in).
    """

    interface: Optional[str] = None
    port: Optional[int] = None
    interval: Optional[float] = None
    evasive: Optional[float] = None
    silent: Optional[float] = None
    expired: Optional[float] = None
    discovery: Optional[tuple[str, ...]] = None
    seeds: Optional[tuple[str, ...]] = None
    #: the secret certificate and allowed-keys directory of the worker's host (options
    #: ``keyFile``, ``allowedKeys``), for a mesh with keys; never taken from the driver
    key_file: Optional[str] = None
    allowed_keys: Optional[str] = None

    def node_settings(self) -> dict[str, Any]:
        """Keyword settings for ``ThreadedNode`` (only those that are set)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def to_options(self) -> dict[str, str]:
        """As data source options (strings; tuples comma-separated)."""
        result = {}
        for key, value in asdict(self).items():
            if value is None:
                continue
            name = _OPTION_NAMES.get(key, key)
            result[name] = ",".join(value) if isinstance(value, tuple) else str(value)
        return result

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "MeshSettings":
        """From data source options (lower-cased keys, string values)."""
        values: dict[str, Any] = {}
        for key in ("interface",):
            if options.get(key):
                values[key] = options[key]
        for key, name in _OPTION_NAMES.items():
            if options.get(name.lower()):
                values[key] = options[name.lower()]
        if options.get("port"):
            values["port"] = int(options["port"])
        for key in ("interval", "evasive", "silent", "expired"):
            if options.get(key):
                values[key] = float(options[key])
        for key in ("discovery", "seeds"):
            if options.get(key) is not None and key in options:
                values[key] = tuple(v.strip() for v in options[key].split(",") if v.strip())
        return cls(**values)

    @classmethod
    def from_config(cls, config: Any, interface: Any = None) -> "MeshSettings":
        """The settings of a running node's ``NodeConfig``.

        ``interface`` (the node's ``Interface``) is passed on as its network in
        CIDR form, so that a worker picks its own interface on the same network
        whatever that interface is named on its host.
        """
        where = str(interface.network) if interface is not None else config.interface
        return cls(interface=where, port=config.port, interval=config.interval,
                   evasive=config.evasive, silent=config.silent, expired=config.expired,
                   discovery=tuple(config.discovery), seeds=tuple(config.seeds))


#: MeshSettings fields whose data source option is spelled otherwise
_OPTION_NAMES = {"key_file": "keyFile", "allowed_keys": "allowedKeys"}


@dataclass
class ServiceStats:
    """Counters of a running ``DriverService``."""

    messages: int = 0          #: SHOUTs appended to the log
    batches: int = 0           #: append transactions
    requests: int = 0          #: PMLOG1 requests answered
    errors: int = 0            #: of which ERR
    chunks_served: int = 0     #: log chunks sent in FETCH replies
    trimmed: int = 0           #: messages deleted (commits, retention, trims)
    rejected: int = 0          #: SHOUTs that could not be stored (too large for SQLite)
    #: writes through the gateway refused: not a logged group, too large, or (sent again)
    #: while the log was behind
    gateway_refused: int = 0
    #: service calls relayed through the gateway (``peermesh.spark.remotecalls``)
    gateway_calls: int = 0


class LogAdvert(Overlay):
    """The driver's log service as the mesh sees it: ``X-PM-SPARK-LOG`` and role
    ``spark-log`` on the driver node's HELLO."""

    roles = ("spark-log",)

    def __init__(self, endpoint: str, stats: Optional[ServiceStats] = None,
                 path: Optional[Path] = None) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.service_stats = stats
        self.path = path                          # the log, read when metrics are scraped
        self._reader: Optional[MessageLog] = None  # opened on first scrape, on the hub

    def on_stop(self, timeout: float) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def headers(self) -> dict[str, str]:
        return {HEADER_LOG: self.endpoint}

    def metrics(self) -> Any:
        """``Overlay.metrics`` plus the service's totals as ``spark_log_total{what}``, the
        log's offsets and each streaming query's committed offset and lag (messages)."""
        yield from super().metrics()
        if self.service_stats is not None:
            for what, count in asdict(self.service_stats).items():
                yield "spark_log_total", {"what": what}, count
        if self.path is None or not self.running:
            return
        if self._reader is None:
            self._reader = MessageLog(self.path)
        earliest, following = self._reader.bounds()
        yield "spark_log_earliest_offset", {}, earliest
        yield "spark_log_next_offset", {}, following
        for consumer in self._reader.consumers():
            labels = {"consumer": consumer.id, "groups": ",".join(consumer.groups)}
            yield "spark_consumer_committed_offset", labels, consumer.committed
            yield "spark_consumer_lag", labels, max(0, following - consumer.committed)


def _check_group(group: str) -> None:
    """``ValueError`` for a group name the gateway keeps for service calls."""
    if is_local(group):
        raise ValueError(f"group {group!r} is kept for service calls through the gateway "
                         f"({CALLS!r}, {REPLIES!r}...): log another group")


def _sada() -> Any:
    """``peermesh.sada`` when it is importable, else None."""
    try:
        from .. import sada
    except ImportError:
        return None
    return sada


class DriverService:
    """Mesh node + durable log + log server, in the current (driver) process.

    ``DriverService(groups=["telemetry"], directory="/data", interface="lo",
    port=5670)``; other keyword settings go to the ``ThreadedNode``
    (``interval``, ``evasive``, ``headers`` ...). ``bind`` is the address the
    log server listens on (default: the mesh interface's address, so
    executors on other hosts of the LAN reach it; 127.0.0.1 is enough for a
    local master), ``bind_port`` its TCP port (0: any free one), and
    ``advertise`` the host executors are told to connect to (default: the
    bound address, or the mesh interface's address when ``bind`` is
    ``0.0.0.0``). Every request must carry the service's ``token`` (handed
    to readers through the plan); requests over 1 MiB are refused, and a
    client that does not read its replies holds at most a few of them.

    ``retention`` (seconds, default 7 days) and ``retention_bytes`` (default
    None: no bound) bound the log by age and size whether or not any query
    runs, as Kafka's ``retention.ms`` and ``retention.bytes`` do, with the
    same defaults. ``trim`` (default False; opt in): also delete, group by
    group, what every registered streaming query of that group has committed
    (consumers silent for ``consumer_ttl`` seconds no longer count), so a
    later batch read no longer sees it. ``max_record_bytes`` caps what one stored chunk of messages may
    take (default: SQLite's limit, about 1 GB); a SHOUT too large to store
    is dropped with a logged reason (``stats.rejected``), never retried.
    ``channel``: add a Safir-Darbaan channel to the node (needs
    ``peermesh.sada``; None: when available). ``gateway``: also run an MTL
    gateway for executors that cannot join the mesh (True: at the log
    server's address, any port; ``"HOST"`` or ``"HOST:PORT"``: where it
    listens, the data port being PORT+1); writes through it are confirmed
    once they are in the log (``peermesh.spark.gateway``), and ``options()``
    hands executors its endpoint (with ``advertise``) and credentials.
    Executors' Safir-Darbaan calls go through it too, made by the driver's
    channel (``peermesh.spark.remotecalls``): ``gateway_services`` names the
    services they may call (None, the default: every service on the mesh;
    ``()``: none).
    """

    def __init__(self, groups: Iterable[str] = (), *,
                 directory: Union[str, os.PathLike[str], None] = None,
                 name: str = "spark-driver", interface: Optional[str] = None,
                 port: Optional[int] = None, bind: Optional[str] = None, bind_port: int = 0,
                 advertise: Optional[str] = None,
                 trim: bool = False, consumer_ttl: Optional[float] = 24 * 3600.0,
                 retention: Optional[float] = DEFAULT_RETENTION,
                 retention_bytes: Optional[int] = None,
                 max_record_bytes: Optional[int] = None, channel: Optional[bool] = None,
                 gateway: Union[bool, str, None] = None,
                 gateway_services: Optional[Iterable[str]] = None,
                 **node_settings: Any) -> None:
        if isinstance(groups, str):
            groups = [groups]
        self.groups: list[str] = list(dict.fromkeys(groups))
        for group in self.groups:
            _check_group(group)
        if isinstance(gateway_services, str):
            gateway_services = [gateway_services]
        base = directory or os.environ.get("PEERMESH_SPARK_DIR") or DEFAULT_DIRECTORY
        self.directory = Path(base).resolve()
        self.name = name
        self.path = self.directory / f"{name}.sqlite"
        self.trim_on_commit = trim
        self.consumer_ttl = consumer_ttl
        for what, value in (("retention", retention), ("retention_bytes", retention_bytes)):
            if value is not None and (isinstance(value, bool) or not 0 < value < float("inf")):
                raise ValueError(f"{what} must be a positive number or None, not {value!r}")
        self.retention = retention
        self.retention_bytes = retention_bytes
        self.max_record_bytes = max_record_bytes
        self._interface = interface
        self._port = port
        self._bind = bind
        self._bind_port = bind_port
        self._advertise = advertise
        self._want_channel = channel
        self._node_settings = node_settings
        self._gateway_at = parse_gateway(gateway) if gateway not in (None, False) else None
        #: the MTL gateway for executors (``gateway``), its endpoint and user's password
        self.gateway: Any = None
        self.gateway_endpoint: Optional[str] = None
        self._gateway_password = ""
        self._handover = HandOver()
        self._relay = CallRelay(GATEWAY_USER, gateway_services)
        self.stats = ServiceStats()
        #: the Prometheus endpoint (``metrics`` setting, ``$PEERMESH_METRICS``) once started
        self.metrics: Any = None
        self.node: Any = None
        self.channel: Any = None
        self.endpoint: Optional[str] = None
        self.mesh: Optional[MeshSettings] = None
        self.log_id: Optional[str] = None
        #: the secret every request must carry: handed to Spark's workers in the plan,
        #: so a process that merely reaches the port can neither read nor trim the log
        self.token = secrets.token_urlsafe(24)
        #: with a node ``key_file``: the log server speaks CURVE with the node's keypair
        #: (readers get its public key as option ``serverKey``), besides the token
        self.server_key: Optional[str] = None
        self._curve: Any = None
        self._channel_curve: Any = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sock: Optional[zmq.Socket] = None
        self._server: Optional[tuple[GuardedListener, Any]] = None  # and its hub's loop
        #: connections the log server shed (``peermesh.io.connections``)
        self.limits = Counters(log, "Spark log server hit its limits", COUNTERS)
        #: NEW, ATTACHED while starting or stopping (resources held), RUNNING, STOPPED
        self.lifecycle = Lifecycle.NEW

    # --- life cycle -----------------------------------------------------

    def start(self) -> "DriverService":
        """Open the log, start the node (and channel), the ingest and the log server."""
        if self.lifecycle is not Lifecycle.NEW:
            raise NodeStateError(f"service is {self.lifecycle.value}; a service starts once")
        from ..zre.threaded import ThreadedNode

        self.lifecycle = Lifecycle.ATTACHED
        try:
            self._start(ThreadedNode)
        except BaseException:
            self.stop()
            raise
        self.lifecycle = Lifecycle.RUNNING
        _services.append(self)
        return self

    def _start(self, node_class: Any) -> None:
        writer = MessageLog(self.path, max_value=self.max_record_bytes)
        self.log_id = writer.log_id
        itf = select_interface(self._interface)
        self._curve = _log_curve(self._node_settings)
        sock = make_socket(zmq.ROUTER, {zmq.SNDHWM: _SERVER_SNDHWM, zmq.RCVHWM: _SERVER_RCVHWM,
                                        zmq.MAXMSGSIZE: _MAX_REQUEST}, curve=self._curve)
        if self._curve is not None:
            self.server_key = self._curve.public.decode()
        self._sock = sock
        address = self._bind or itf.address
        bound = (bind(sock, f"tcp://{address}:{self._bind_port}") if self._bind_port
                 else bind_ephemeral(sock, address))
        wildcard = address in ("0.0.0.0", "*")
        self.endpoint = _advertised(bound, self._advertise or (itf.address if wildcard else None))

        headers = dict(self._node_settings.pop("headers", None) or {})
        sada = _sada() if self._want_channel is not False else None
        if self._want_channel and sada is None:
            raise RuntimeError("channel=True needs peermesh.sada, which is not importable")
        if sada is not None:
            self._channel_curve = _node_curve(self._curve, self._node_settings)
            self.channel = sada.ThreadedChannel(address=itf.address, curve=self._channel_curve)
            headers.update(self.channel.headers)
        settings = dict(self._node_settings)
        if self._port is not None:
            settings["port"] = self._port
        overlays: list[Overlay] = [LogAdvert(self.endpoint, self.stats, self.path)]
        if self._gateway_at is not None:
            overlays.append(self._make_gateway(self._gateway_at[0] or address,
                                               self._gateway_at[1], writer.max_payload))
        # a sender's flush() says True only once what it sent is in the log
        self.node = node_class(self.name, groups=self.groups, interface=self._interface,
                               headers=headers, overlays=overlays,
                               setup=lambda node: node.hold_confirms(), **settings).start()
        if self.gateway is not None:
            self.gateway_endpoint = _advertised(
                self.gateway.control_endpoint,
                self._advertise or (itf.address if self.gateway.address in ("0.0.0.0", "*")
                                    else None))
        from ..metrics import serve_configured

        self.metrics = self.node.call(serve_configured)  # config.metrics, $PEERMESH_METRICS
        if self.channel is not None:
            self.channel.start(self.node)
        self.mesh = MeshSettings.from_config(self.node.call(lambda n: n.config),
                                             self.node.interface)

        ingest = threading.Thread(target=self._ingest, args=(writer,), daemon=True,
                                  name=f"peermesh-ingest-{self.name}")
        server = threading.Thread(target=self._serve, args=(MessageLog(self.path),),
                                  daemon=True, name=f"peermesh-log-{self.name}")
        self._threads = [ingest, server]
        for thread in self._threads:
            thread.start()
        log.info("spark service %s: log %s at %s, groups %s", self.name, self.path,
                 self.endpoint, ", ".join(self.groups) or "(none)")

    def _make_gateway(self, address: str, port: int, largest: int) -> Overlay:
        """The MTL gateway for executors, with a user of its own (see ``gateway``)."""
        from ..mtl.credentials import CredentialsFile
        from ..mtl.gateway import Gateway

        self.directory.mkdir(parents=True, exist_ok=True)
        credentials = CredentialsFile(self.directory / f"{self.name}-gateway-users.json")
        self._gateway_password = new_password()
        self._gateway_user(credentials)

        def queues(store: Any) -> LogQueues:  # (on start: the node is attached)
            assert gateway.node is not None
            return LogQueues(store, logged=self.groups.__contains__, hand=self._handover.put,
                             sender=gateway.node.uuid.hex, largest=largest,
                             stats=self.stats, relay=self._relay, call=self._call)

        gateway = Gateway(credentials, address=address, control_port=port,
                          data_port=port + 1 if port else 0, run="always",
                          data_dir=self.directory, profiles=("mesh",), queues=queues,
                          local=is_local)
        self.gateway = gateway
        return gateway

    def _gateway_user(self, credentials: Any) -> None:
        """(Re)write the executors' user: write access to exactly the logged groups."""
        from ..mtl.credentials import make_user

        user = make_user(GATEWAY_USER, self._gateway_password,
                         write=write_patterns(self.groups + [CALLS]),
                         read=[write_patterns([REPLIES])[0] + "*"])
        credentials.update(lambda users: users.update({GATEWAY_USER: user}))

    def _call(self, call: Call) -> None:
        """Make an executor's call with the driver's channel (on the node's hub)."""
        self.stats.gateway_calls += 1
        gateway = self.gateway
        submit(self.channel, self._relay, call, gateway.answer)

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the channel, the node (port-0 beacon), the ingest and the log server."""
        if self.lifecycle in (Lifecycle.STOPPED, Lifecycle.NEW):
            self.lifecycle = Lifecycle.STOPPED
            return
        self.lifecycle = Lifecycle.ATTACHED
        if self.channel is not None:
            try:
                self.channel.stop()
            except Exception:
                log.debug("stopping the channel failed", exc_info=True)
        metrics, self.metrics = self.metrics, None
        if metrics is not None and self.node is not None:
            self.node.call(lambda node: metrics.close())
        if self.node is not None:
            self.node.stop(timeout)
        self._stopping.set()
        server = self._server
        if server is not None:  # the log server's hub runs in its own thread
            try:
                server[1].run_callback_threadsafe(server[0].close)
            except Exception:  # that thread ended meanwhile, and its hub with it
                pass
        for thread in self._threads:
            thread.join(timeout + 5)
        if self._sock is not None:
            self._sock.close(linger=0)
        self._release_keys()
        self.lifecycle = Lifecycle.STOPPED
        _services[:] = [s for s in _services if s is not self]

    def __enter__(self) -> "DriverService":
        return self.start() if self.lifecycle is Lifecycle.NEW else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self.lifecycle is Lifecycle.RUNNING

    # --- driver-side conveniences ----------------------------------------

    def join(self, group: str) -> None:
        """Join ``group``: its SHOUTs are logged from now on."""
        _check_group(group)
        self.node.join(group)
        if group not in self.groups:
            self.groups.append(group)
            if self.gateway is not None:
                self._gateway_user(self.gateway.credentials)

    def options(self) -> dict[str, str]:
        """Data source options that point readers and writers at this service and mesh."""
        assert self.endpoint is not None and self.mesh is not None
        keyed = {"serverKey": self.server_key} if self.server_key is not None else {}
        if self.gateway_endpoint is not None:
            keyed.update(gateway=self.gateway_endpoint, gatewayUser=GATEWAY_USER,
                         gatewayPassword=self._gateway_password)
        return {"endpoint": self.endpoint, "token": self.token, **keyed,
                **self.mesh.to_options()}

    def bounds(self, groups: Optional[Sequence[str]] = None) -> tuple[int, int]:
        """``(earliest, next)`` offsets of the log for ``groups`` (default: any group)."""
        with MessageLog(self.path) as reader:
            return reader.bounds(groups)

    def consumers(self) -> list[Any]:
        """The streaming queries registered with the log (``log.Consumer``)."""
        with MessageLog(self.path) as reader:
            return reader.consumers()

    def forget_consumer(self, consumer: str) -> bool:
        """Stop ``consumer`` (a query that will not run again; a ``consumerName``: every
        query of that name) from holding the log back."""
        with MessageLog(self.path) as writer:
            known = writer.forget(consumer)
            if self.trim_on_commit:
                self.stats.trimmed += writer.trim_committed(self.consumer_ttl)
            return known

    def trim(self, before: int, groups: Optional[Sequence[str]] = None) -> int:
        """Delete the messages of ``groups`` (default: all) below offset ``before`` (a cut
        inside a stored chunk hides them at once); the new earliest offset of those
        groups (the lowest of them)."""
        with MessageLog(self.path) as writer:
            return writer.trim(before, groups)

    def wait_for_offset(self, offset: int, timeout: float = 10.0) -> bool:
        """Wait until the log's next offset is at least ``offset``; False on timeout."""
        deadline = time.monotonic() + timeout
        with MessageLog(self.path) as reader:
            while reader.next_offset < offset:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
        return True

    # --- ingest ---------------------------------------------------------

    def _ingest(self, writer: MessageLog) -> None:
        recv = self.node.recv
        shout, stop, confirm = EventType.SHOUT, EventType.STOP, EventType.CONFIRM
        now = time.time
        stats = self.stats
        largest = writer.max_payload
        senders: dict[Any, tuple[str, dict]] = {}  # peer UUID -> (hex, HELLO headers)
        retain_at = time.monotonic()
        poll = (_POLL_MS if self.gateway is None else _GATEWAY_POLL_MS) / 1000
        try:
            while True:
                if time.monotonic() >= retain_at:
                    self._retain(writer)
                    retain_at = time.monotonic() + _RETAIN_EVERY
                if len(self._handover):
                    self._from_gateway(writer)
                event = recv(poll)
                if event is None:
                    if self._stopping.is_set():
                        return
                    continue
                batch = []
                size = 0
                stopped = False
                confirms = []
                while event is not None:
                    kind = event.type
                    if kind is confirm:  # answered once what came before it is stored
                        confirms.append(event.peer)
                        break
                    if kind is shout:
                        message = event.message
                        if len(message) > largest:
                            stats.rejected += 1
                            _log_rejected(event.group, event.peer, len(message), largest)
                        else:
                            peer = event.peer
                            sender = senders.get(peer)
                            if sender is None:
                                if len(senders) > 65536:
                                    senders.clear()
                                sender = senders[peer] = (peer.hex, self._headers_of(peer))
                            batch.append((event.group, sender[0], event.name, now(), message,
                                          sender[1]))
                            size += len(message)
                            if len(batch) >= _INGEST_BATCH or size >= _INGEST_BYTES:
                                break
                    elif kind is stop:
                        stopped = True
                        break
                    event = recv(0)
                if batch:
                    stats.messages += self._append(writer, batch)
                    stats.batches += 1
                for peer in confirms:
                    self._confirm(peer)
                if stopped:
                    return
        finally:
            writer.close()

    def _from_gateway(self, writer: MessageLog) -> None:
        """Append what the gateway handed over, then confirm it to its writers."""
        gateway = self.gateway
        queues = gateway.data.queues
        handed = self._handover.take()
        while handed is not None:
            records = handed[0]
            stored = self._append(writer, records)
            self.stats.messages += stored
            self.stats.batches += 1
            confirms = queues.appended(handed, stored == len(records))
            if confirms:
                try:
                    self.node.call(lambda node: gateway.answer(confirms))
                except PeermeshError:  # stopping: the writers send it again elsewhere
                    log.debug("could not confirm %d gateway writes", len(records))
            handed = self._handover.take()

    def _confirm(self, peer: Any) -> None:
        """Answer ``peer``'s PING: everything it sent before is in the log."""
        try:
            self.node.call(lambda node: node.confirm(peer))
        except PeermeshError:  # the node is stopping: the peer's flush says False
            log.debug("could not confirm to %s", peer)

    def _headers_of(self, peer: Any) -> dict:
        """The HELLO headers of ``peer`` ({} once it has left)."""
        try:
            return dict(self.node.peer_headers(peer))
        except PeermeshError:
            return {}

    def _append(self, writer: MessageLog, batch: list) -> int:
        """Append ``batch``, retrying what may pass later (a full disk); how many were stored.

        A message SQLite refuses outright (too big, even without its stored
        ``text``) is dropped with a logged reason and never holds up the others.
        """
        delay = 0.05
        texts = True
        while True:
            try:
                writer.append(batch, texts)
                return len(batch)
            except sqlite3.DataError as exc:
                if len(batch) == 1 and texts:
                    texts = False  # its text made it too big: leave the text to readers
                    continue
                if len(batch) == 1:
                    self.stats.rejected += 1
                    record = batch[0]
                    log.warning("a SHOUT to %s from %s (%d bytes) cannot be stored: %s",
                                record[0], record[2], len(record[4]), exc)
                    return 0
                half = len(batch) // 2
                return self._append(writer, batch[:half]) + self._append(writer, batch[half:])
            except Exception:
                # e.g. a full disk: keep the batch, let the node's queue push back on peers
                log.exception("appending %d messages to %s failed; retrying", len(batch),
                              self.path)
                if self._stopping.wait(delay):
                    return 0
                delay = min(delay * 2, 2.0)

    def _retain(self, writer: MessageLog) -> None:
        if self.retention is None and self.retention_bytes is None:
            return
        try:
            self.stats.trimmed += writer.retain(self.retention, self.retention_bytes)
        except sqlite3.Error:
            log.warning("the retention pass over %s failed; trying again later", self.path,
                        exc_info=True)

    # --- the log server ---------------------------------------------------

    def _serve(self, reader: MessageLog) -> None:
        sock = self._sock
        assert sock is not None
        hub = gevent.get_hub()  # this thread's own
        server = GuardedListener(HubSocket(sock, endpoint=self.endpoint or ""), self.limits)
        handle = self._handle

        def on_message(identity: bytes, body: list[bytes]) -> None:
            reply = handle(reader, body)
            if reply is None:
                return
            try:
                if not server.try_send([identity, *protocol.encode_reply(reply)]):
                    log.debug("could not reply to %r", identity)
            except zmq.ZMQError:
                log.debug("could not reply to %r", identity)

        self._server = (server, hub.loop)
        try:
            if not self._stopping.is_set():  # else stop() came first
                server.serve(on_message)  # until stop() closes it
        finally:
            self._server = None
            server.close()
            reader.close()
            hub.destroy(destroy_loop=True)

    def _release_keys(self) -> None:
        for curve in (self._curve, self._channel_curve):
            if curve is not None:
                curve.release(shared_context())
        self._curve = self._channel_curve = None

    def _handle(self, reader: MessageLog, frames: list[bytes]) -> Optional[Reply]:
        self.stats.requests += 1
        try:
            request = protocol.decode_request(frames)
        except protocol.ProtocolError as exc:
            self.stats.errors += 1
            if len(frames) == 4 and exc.reason.startswith("unknown op") and frames[1]:
                return protocol.error_reply(bytes(frames[1])[:protocol.MAX_REQUEST_ID],
                                            "unknown-op", exc.reason)
            log.debug("dropped a malformed request: %s", exc.reason)
            return None
        if not hmac.compare_digest(str(request.body.get("token", "")).encode(),
                                   self.token.encode()):
            self.stats.errors += 1
            return protocol.error_reply(request.id, "unauthorised",
                                        "this log service needs its token (DriverService.token,"
                                        " passed to readers as option 'token')")
        try:
            return Reply(request.id, True, self._answer(reader, request))
        except (KeyError, TypeError, ValueError) as exc:
            self.stats.errors += 1
            return protocol.error_reply(request.id, "bad-request",
                                        f"{request.op.value}: {type(exc).__name__}: {exc}")
        except Exception as exc:
            self.stats.errors += 1
            log.exception("answering %s failed", request.op.value)
            return protocol.error_reply(request.id, "internal", f"{type(exc).__name__}: {exc}")

    def _answer(self, reader: MessageLog, request: Request) -> dict[str, Any]:
        body = request.body
        op = request.op
        if op is Op.FETCH:
            return self._fetch(reader, body)
        if op is Op.LATEST:
            return self._latest(reader, body)
        if op is Op.INFO:
            floors, nxt = reader.group_bounds(_groups(body.get("groups")))
            return {"log": reader.log_id, "earliest": min(floors.values(),
                                                          default=reader.earliest),
                    "floors": floors, "next": nxt,
                    "groups": list(self.groups),
                    "channel": getattr(self.channel, "endpoint", None),
                    "mesh": self.mesh.to_options() if self.mesh else {},
                    "path": str(self.path), "host": host_id()}
        if op is Op.REGISTER:
            reader.register(str(body["consumer"]), int(body["offset"]),
                            _groups(body.get("groups")))
            return {"log": reader.log_id}
        if op is Op.COMMIT:
            groups = _groups(body.get("groups"))
            reader.commit(str(body["consumer"]), int(body["offset"]), groups)
            if self.trim_on_commit:
                self.stats.trimmed += reader.trim_committed(self.consumer_ttl)
            return {"log": reader.log_id, "earliest": reader.bounds(groups)[0]}
        if op is Op.TRIM:
            earliest = reader.trim(int(body["before"]), _groups(body.get("groups")))
            return {"log": reader.log_id, "earliest": earliest}
        if op is Op.SEEK:
            groups = _groups(body.get("groups"))
            earliest, nxt = reader.bounds(groups)
            return {"log": reader.log_id, "earliest": earliest, "next": nxt,
                    "offset": reader.offset_at(float(body["time"]), groups)}
        if op is Op.COUNT:
            return {"log": reader.log_id,
                    "count": reader.count(int(body["start"]), int(body["end"]),
                                          _groups(body.get("groups")))}
        if op is Op.JOIN:
            for group in _groups(body.get("groups")):
                self.join(group)
            return {"groups": list(self.groups)}
        raise ValueError(f"op {op.value} is not served")  # pragma: no cover

    def _latest(self, reader: MessageLog, body: Any) -> dict[str, Any]:
        groups = _groups(body.get("groups"))
        start = int(body["start"])
        floors, nxt = reader.group_bounds(groups)
        earliest = min(floors.values(), default=reader.earliest)
        ceiling = nxt if body.get("ceiling") is None else min(nxt, int(body["ceiling"]))
        begin = max(start, earliest)
        end = start
        if begin < ceiling:
            most = body.get("max")
            found = None
            if most is not None:
                found = reader.nth_offset(begin, ceiling, int(most), groups)
            if found is None:
                found = reader.last_offset(begin, ceiling, groups)
            if found is not None:
                end = found + 1
        return {"log": reader.log_id, "earliest": earliest, "floors": floors, "next": nxt,
                "end": max(end, start)}

    def _fetch(self, reader: MessageLog, body: Any) -> dict[str, Any]:
        reply = reader.fetch(int(body["start"]), int(body["end"]), _groups(body.get("groups")),
                             protocol.MAX_FETCH_BYTES)
        self.stats.chunks_served += len(reply["chunks"])
        # chunks as stored: the executors decode them (the driver is the busier side)
        reply["chunks"] = [[c.group, c.seqs, c.data] for c in reply["chunks"]]
        return reply

    def __repr__(self) -> str:
        return (f"<DriverService {self.name} {self.lifecycle.value} {self.endpoint or ''} "
                f"{self.path}>")


_last_rejected = 0.0


def _log_rejected(group: str, peer: Any, size: int, largest: int) -> None:
    """Say, at most once a minute, that a SHOUT was too large to store."""
    global _last_rejected
    moment = time.monotonic()
    if moment - _last_rejected >= 60.0:
        _last_rejected = moment
        log.warning("a SHOUT to %s from %s is %d bytes, more than the log can store in one "
                    "row (%d); it was dropped (counted in stats.rejected)", group, peer, size,
                    largest)


def _advertised(endpoint: str, host: Optional[str]) -> str:
    """``endpoint`` (``tcp://HOST:PORT``) with its host replaced by ``host``, if given."""
    if host is None:
        return endpoint
    port = endpoint.rpartition(":")[2]
    return f"tcp://{host}:{port}"


def _groups(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [g for g in value.split(",") if g]
    return [str(g) for g in value]


_services: list[DriverService] = []


def current_service() -> Optional[DriverService]:
    """The service started last in this process (and still running), or None."""
    for service in reversed(_services):
        if service.running:
            return service
    return None


#: the ZAP domain of log servers: any key may connect (readers make a keypair each),
#: the token still decides who may read
LOG_DOMAIN = "peermesh-spark-log"


def _node_curve(log_curve: Any, node_settings: Mapping[str, Any]) -> Any:
    """The node's own CURVE settings (its allowed keys and ZAP domain), for its channel."""
    if log_curve is None:
        return None
    from ..config import NodeConfig
    from ..io.curve import Curve, shared_allowlist

    config = NodeConfig.load().replace(**{k: v for k, v in node_settings.items()
                                          if k in ("key_file", "allowed_keys", "zap_domain")})
    return Curve(log_curve.keypair, shared_allowlist(config.allowed_keys), config.zap_domain)


def _log_curve(node_settings: Mapping[str, Any]) -> Any:
    """The log server's CURVE settings: the node's keypair (``key_file`` given or from
    ``PEERMESH_KEY_FILE``), admitting any key; None for a node without keys."""
    from ..config import NodeConfig

    key_file = node_settings.get("key_file") or NodeConfig.load().key_file
    if key_file is None:
        return None
    from ..io.curve import Curve, shared_allowlist
    from ..io.keys import load_keypair

    return Curve(load_keypair(key_file), shared_allowlist(None), LOG_DOMAIN)
