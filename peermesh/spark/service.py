"""The driver-side service: a mesh node whose group traffic becomes a log Spark reads.

How it works
------------
``DriverService`` runs in the Spark driver's own process, beside the user's
program, with no monkey-patching:

* a ``ThreadedNode`` (its own thread and private gevent hub) joins the
  configured groups and, when ``peermesh.sada`` is importable, carries a
  Safir-Darbaan channel (``X-PM-SADA-CHANNEL`` in its HELLO), so servers on
  the LAN connect to it as to any channel;
* an **ingest** thread (``ingest.Ingest``) takes every SHOUT the node
  receives in its groups and appends it, in arrival order, to a
  ``MessageLog`` (SQLite, WAL) under the configured directory, in batches of
  whatever has arrived;
* a **log server** thread (``logserver.LogServer``) answers the ``PMLOG1``
  protocol (see ``protocol``) on a ZeroMQ ROUTER, served by the I/O layer's
  ``HubSocket`` on that thread's own gevent hub: offsets, ranges of rows,
  consumer registration, commits and trims. Spark calls the data source only in
  Python worker processes, never in the driver's own; they reach the log
  through this socket.

This module holds the service's settings and life cycle; what the mesh sees of
it (``ServiceStats``, ``LogAdvert``) is in ``advert``, ``MeshSettings`` in
``meshsettings``. Nothing here imports pyspark.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import zmq

from ..counters import Counters
from ..errors import NodeStateError
from ..io import bind, bind_ephemeral, shared_context
from ..io.connections import COUNTERS
from ..net.interfaces import select_interface
from ..overlay import Lifecycle, Overlay
from .advert import HEADER_LOG, LogAdvert, ServiceStats
from .gateway import GATEWAY_USER, HandOver, LogQueues, new_password, parse_gateway, \
    write_patterns
from .ingest import Ingest
from .log import MessageLog
from .logserver import LogServer, server_socket
from .meshsettings import MeshSettings
from .remotecalls import CALLS, REPLIES, Call, CallRelay, is_local, submit

__all__ = ["DriverService", "LogAdvert", "MeshSettings", "start_service", "current_service",
           "HEADER_LOG", "DEFAULT_DIRECTORY"]

log = logging.getLogger(__name__)

#: where logs go when no directory is given: $PEERMESH_SPARK_DIR, else ./peermesh-data
DEFAULT_DIRECTORY = "peermesh-data"
#: how long the log keeps a message by default (Kafka's ``retention.ms``: 7 days)
DEFAULT_RETENTION = 7 * 24 * 3600.0


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
    later batch read no longer sees it. ``max_record_bytes`` caps what one
    stored chunk of messages may take (default: SQLite's limit, about 1 GB); a SHOUT too large to store
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
        self._log_server: Optional[LogServer] = None
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
        sock = server_socket(self._curve)
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

        ingest = Ingest(self.node, self.gateway, self._handover, self.stats, self._stopping,
                        self.path, self.retention, self.retention_bytes)
        self._log_server = LogServer(self, sock, self.endpoint, self.limits, self._stopping)
        ingester = threading.Thread(target=ingest.run, args=(writer,), daemon=True,
                                    name=f"peermesh-ingest-{self.name}")
        server = threading.Thread(target=self._log_server.serve, args=(MessageLog(self.path),),
                                  daemon=True, name=f"peermesh-log-{self.name}")
        self._threads = [ingester, server]
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
        if self._log_server is not None:
            self._log_server.close()
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

    def _release_keys(self) -> None:
        for curve in (self._curve, self._channel_curve):
            if curve is not None:
                curve.release(shared_context())
        self._curve = self._channel_curve = None

    def __repr__(self) -> str:
        return (f"<DriverService {self.name} {self.lifecycle.value} {self.endpoint or ''} "
                f"{self.path}>")


def _advertised(endpoint: str, host: Optional[str]) -> str:
    """``endpoint`` (``tcp://HOST:PORT``) with its host replaced by ``host``, if given."""
    if host is None:
        return endpoint
    port = endpoint.rpartition(":")[2]
    return f"tcp://{host}:{port}"


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
