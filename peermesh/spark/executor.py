"""Mesh nodes inside Spark's Python worker processes, opened lazily, one per process.

How it works
------------
Writers and service calls run in Spark's Python workers, which Spark starts
(and reuses) on executors. The first time a worker process needs the mesh,
``executor_mesh(settings, channel)`` starts a ``ThreadedNode`` there (its
own thread and gevent hub; nothing is monkey-patched) and keeps it for the
life of the process; a forked child starts its own. With ``channel=True``
the node also carries a Safir-Darbaan ``Channel`` advertised in its HELLO,
so the mesh's servers connect to it as to any channel.

Heavy work is handed to the node's hub in batches, one ``ThreadedNode.call``
per batch rather than per row: ``shout_many`` shouts a list of payloads,
``request_many`` keeps up to ``window`` requests in flight on the hub and
returns one ``Outcome`` per payload, in order.

A node nobody reads would fill its event queue; every use drains it.

Through the driver's MTL gateway
--------------------------------
A write whose options name the driver's gateway (``gateway``,
``gatewayUser``, ``gatewayPassword``: ``start_service(..., gateway=...)``
sets them) needs no mesh node, no address on the mesh's network and no
discovery: ``executor_gateway(settings)`` opens one MTL ``Client`` per
process and a ``confirm: full`` writer lease per group, and
``GatewayWriter.confirm`` waits until the gateway confirmed every content,
which it does once the content is in the driver's log
(``peermesh.spark.gateway``).
Service calls with a gateway (``request_many``): ``GatewayWriter.calls``
opens a client with a request lease and a reply queue
(``peermesh.spark.remotecalls``), and the driver's channel makes the calls.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, Sequence

from .errors import MeshWriteError
from .requests import GatewaySettings, Outcome, outcome_of

if TYPE_CHECKING:
    from .service import MeshSettings

__all__ = ["ExecutorMesh", "Outcome", "executor_mesh", "sada_available", "MeshWriteError",
           "GatewaySettings", "GatewayWriter", "executor_gateway", "outcome_of", "request_many"]

log = logging.getLogger(__name__)

_SHOUT_CHUNK = 2000


def sada_available() -> bool:
    """True when ``peermesh.sada`` (Safir-Darbaan) can be imported."""
    try:
        from .. import sada  # noqa: F401
    except ImportError:
        return False
    return True


class GatewayWriter:
    """This worker process's writes (and service calls) through the driver's MTL gateway."""

    def __init__(self, settings: GatewaySettings) -> None:
        from ..mtl.client import Client

        self.settings = settings
        self.client = Client(settings.endpoint, settings.user, settings.password,
                             server_key=settings.server_key)
        self.writers: dict[str, Any] = {}
        #: one task at a time uses this process's leases
        self.lock = threading.Lock()
        self._calls: Any = None
        self._calls_lock = threading.Lock()

    def calls(self) -> Any:
        """This process's ``remotecalls.GatewayCalls`` (its client opened on first use)."""
        from .remotecalls import GatewayCalls

        with self._calls_lock:
            if self._calls is None:
                self._calls = GatewayCalls(self.settings)
            return self._calls

    def send_many(self, group: str, payloads: Sequence[bytes]) -> None:
        """Send every payload to ``group``, in order (waits while the window is full)."""
        from ..mtl.client import ClientError

        try:
            writer = self.writers.get(group)
            if writer is None:
                writer = self.writers[group] = self.client.writer([group], confirm="full")
            send = writer.send
            for payload in payloads:
                send(payload)
        except ClientError as exc:
            raise MeshWriteError(f"the driver's gateway {self.settings.endpoint} did not take "
                                 f"the rows for group {group!r}: {exc} (is the group logged "
                                 "by the driver's service?)") from exc

    def confirm(self, timeout: float) -> None:
        """Wait until the gateway confirmed everything sent (it is in the driver's log);
        ``MeshWriteError`` if it did not within ``timeout`` or refused some."""
        deadline = time.monotonic() + timeout
        for group, writer in self.writers.items():
            if not writer.wait(max(0.0, deadline - time.monotonic())):
                raise MeshWriteError(f"the driver's gateway {self.settings.endpoint} did not "
                                     f"confirm {writer.unconfirmed} rows for group {group!r} "
                                     f"within {timeout:g} s")
            if writer.rejected:
                count = len(writer.rejected)
                writer.rejected.clear()
                raise MeshWriteError(f"the driver's gateway refused {count} rows for group "
                                     f"{group!r} (not a logged group, or larger than the "
                                     "log's largest record)")

    def close(self) -> None:
        """Close the leases and the clients."""
        self.client.close()
        if self._calls is not None:
            self._calls.close()


def request_many(mesh: MeshSettings, gateway: Optional[GatewaySettings], service: str,
                 action: str, payloads: Sequence[Any], *, version: Optional[str] = None,
                 category: str = "", timeout: Optional[float] = None, window: int = 64,
                 retries: int = 0, discovery_timeout: float = 10.0) -> list[Outcome]:
    """One ``Outcome`` per payload, in order: through the driver's gateway when
    ``gateway`` is given, else through this process's mesh node and channel (after
    waiting up to ``discovery_timeout`` for a server: 404 outcomes if none came).
    ``MeshWriteError`` when the calls cannot be made at all."""
    if not payloads:
        return []
    if gateway is not None:
        from ..mtl.client import ClientError

        try:
            return executor_gateway(gateway).calls().request_many(
                service, action, payloads, version=version, category=category,
                timeout=timeout, window=window, retries=retries)
        except ClientError as exc:
            raise MeshWriteError(f"calls through the driver's gateway {gateway.endpoint} "
                                 f"failed: {exc}") from exc
    if not sada_available():
        raise MeshWriteError("service calls through the mesh need peermesh.sada "
                             "(Safir-Darbaan), which is not importable here")
    node = executor_mesh(mesh, channel=True)
    if not node.wait_service(service, version, discovery_timeout):
        return [Outcome(False, None, 404, f"404 no server offers service {service!r}"
                        f"{' ' + version if version else ''} on the mesh after "
                        f"{discovery_timeout:g} s")] * len(payloads)
    return node.request_many(service, action, payloads, version=version, category=category,
                             timeout=timeout, window=window, retries=retries)


class ExecutorMesh:
    """A node (and optionally a channel) of this worker process."""

    def __init__(self, settings: MeshSettings, channel: bool = False) -> None:
        self.settings = settings
        self.with_channel = channel
        self.node: Any = None
        self.channel: Any = None
        self.curve: Any = None      # the channel's keys, on a mesh with keys
        self.started_at = 0.0
        self.pid = os.getpid()

    def start(self) -> "ExecutorMesh":
        """Start the node (and the channel) now."""
        from ..net.interfaces import select_interface
        from ..zre.threaded import ThreadedNode

        headers: dict[str, str] = {"X-PM-ROLES": "spark-executor"}
        if self.with_channel:
            from .. import sada

            address = select_interface(self.settings.interface).address
            if self.settings.key_file is not None:   # the channel speaks CURVE as its node
                from ..io.curve import Curve

                self.curve = Curve.load(self.settings.key_file, self.settings.allowed_keys)
            self.channel = sada.Channel(address=address, curve=self.curve)
            headers.update({sada.HEADER_CHANNEL: self.channel.endpoint,
                            "X-PM-ROLES": "sada-channel,spark-executor"})
        name = f"spark-{socket.gethostname()[:40]}-{os.getpid()}" + \
            ("-ch" if self.with_channel else "")
        settings = self.settings.node_settings()
        node = ThreadedNode(name, headers=headers, **settings)
        try:
            node.start()
            if self.channel is not None:
                channel = self.channel
                node.call(lambda n: channel.start())
        except BaseException:
            node.stop(0.1)
            if self.channel is not None:
                self.channel.stop()
            if self.curve is not None:
                from ..io import shared_context

                self.curve.release(shared_context())
            raise
        self.node = node
        self.started_at = time.monotonic()
        return self

    def drain(self) -> None:
        """Drop the events nobody reads (the node would stop reading its mailbox)."""
        recv = self.node.recv
        while recv(0) is not None:
            pass

    def settle(self) -> None:
        """Wait until every beaconing peer has had time to be seen (2 beacon intervals)."""
        interval = self.settings.interval or 1.0
        wait = self.started_at + 2 * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    # --- shouting -----------------------------------------------------------

    def wait_group(self, group: str, peers: int = 1, timeout: float = 10.0) -> int:
        """Wait until ``group`` has at least ``peers`` members; how many it has."""
        self.settle()
        deadline = time.monotonic() + timeout
        while True:
            self.drain()
            members = len(self.node.peers_by_group(group))
            if members >= peers:
                return members
            if time.monotonic() >= deadline:
                raise MeshWriteError(
                    f"group {group!r} has {members} member(s) on the mesh, fewer than "
                    f"{peers}, after {timeout:g} s (settings {self.settings}); shouts would "
                    "reach nobody. Check interface/port, or lower option 'peers'.")
            time.sleep(0.05)

    def shout_many(self, group: str, payloads: Sequence[bytes]) -> None:
        """Shout every payload to ``group``, in order, on the node's hub."""
        for begin in range(0, len(payloads), _SHOUT_CHUNK):
            chunk = payloads[begin:begin + _SHOUT_CHUNK]

            def run(node: Any, chunk: Sequence[bytes] = chunk) -> None:
                shout = node.shout
                for payload in chunk:
                    shout(group, payload)

            self.node.call(run)
        self.drain()

    def flush(self, timeout: float = 5.0) -> bool:
        """True once every peer sent to has confirmed all it got (PING / PING-OK)."""
        return bool(self.node.call(lambda n: n.flush(timeout)))

    # --- requests -----------------------------------------------------------

    def wait_service(self, service: str, version: Optional[str] = None,
                     timeout: float = 10.0) -> bool:
        """Wait until some server offers ``service``; False on timeout."""
        channel = self.channel
        ok = bool(self.node.call(lambda n: channel.wait_for(service, version, 1, timeout)))
        self.drain()
        return ok

    def request_many(self, service: str, action: str, payloads: Sequence[Any], *,
                     version: Optional[str] = None, category: str = "",
                     timeout: Optional[float] = None, window: int = 64, retries: int = 0,
                     raw: bool = False) -> list[Outcome]:
        """Send one request per payload, at most ``window`` in flight; outcomes in order."""
        if self.channel is None:
            raise RuntimeError("this mesh node has no channel")
        if not payloads:
            return []
        channel = self.channel
        window = max(1, int(window))

        def run(node: Any) -> list[Outcome]:
            import gevent.event
            import gevent.lock

            results: list[Optional[Outcome]] = [None] * len(payloads)
            room = gevent.lock.Semaphore(window)
            finished = gevent.event.Event()
            left = [len(payloads)]

            def done(i: int, result: Any) -> None:
                if result.successful():
                    results[i] = Outcome(True, result.value, 200)
                else:
                    results[i] = outcome_of(result.exception)
                room.release()
                left[0] -= 1
                if not left[0]:
                    finished.set()

            for i, payload in enumerate(payloads):
                room.acquire()
                try:
                    pending = channel.request_async(service, action, payload, version=version,
                                                    category=category, timeout=timeout,
                                                    retries=retries, raw=raw)
                except Exception as exc:
                    done(i, _Failed(exc))
                    continue
                pending.rawlink(lambda result, i=i: done(i, result))
            finished.wait()
            return results  # type: ignore[return-value]

        outcomes = self.node.call(run)
        self.drain()
        return outcomes

    def stop(self) -> None:
        """Stop the channel and the node."""
        if self.node is None:
            return
        if self.channel is not None and self.node.running:
            channel = self.channel
            try:
                self.node.call(lambda n: channel.stop())
            except Exception as exc:  # stopping anyway: say why the channel did not close
                log.debug("channel did not stop cleanly: %s", exc)
        self.node.stop(0.5)
        if self.curve is not None:
            from ..io import shared_context

            self.curve.release(shared_context())


class _Failed:
    """An AsyncResult-like failure for requests that could not even be sent."""

    def __init__(self, exc: BaseException) -> None:
        self.exception = exc

    def successful(self) -> bool:
        return False


_meshes: dict[tuple[MeshSettings, bool], ExecutorMesh] = {}
_meshes_lock = threading.Lock()
_meshes_pid = os.getpid()
_forked: list[ExecutorMesh] = []


def executor_mesh(settings: MeshSettings, channel: bool = False) -> ExecutorMesh:
    """This process's mesh node for ``settings`` (started on first use)."""
    with _meshes_lock:
        _forget_parent()
        key = (settings, bool(channel))
        mesh = _meshes.get(key)
        if mesh is None or not mesh.node.running:
            mesh = ExecutorMesh(settings, channel).start()
            _meshes[key] = mesh
        return mesh


_gateways: dict[GatewaySettings, GatewayWriter] = {}


def _forget_parent() -> None:
    """In a forked child: drop the parent's nodes and clients (their threads and sockets
    are not this process's); under ``_meshes_lock``."""
    global _meshes_pid
    if _meshes_pid != os.getpid():
        _forked.extend(_meshes.values())
        _meshes.clear()
        _gateways.clear()
        _meshes_pid = os.getpid()


def executor_gateway(settings: GatewaySettings) -> GatewayWriter:
    """This process's writer through the gateway of ``settings`` (opened on first use)."""
    with _meshes_lock:
        _forget_parent()
        writer = _gateways.get(settings)
        if writer is None:
            writer = _gateways[settings] = GatewayWriter(settings)
        return writer


def stop_all() -> None:
    """Stop every mesh node and gateway writer of this process (tests, and the end of a
    driver program)."""
    with _meshes_lock:
        meshes = list(_meshes.values())
        _meshes.clear()
        writers = list(_gateways.values())
        _gateways.clear()
    for mesh in meshes:
        mesh.stop()
    for writer in writers:
        writer.close()
