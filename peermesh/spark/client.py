"""The worker side of ``PMLOG1``: one DEALER per process and service endpoint.

Spark pickles data source objects into its Python worker processes, so they
must not hold sockets. ``log_client(endpoint)`` opens the socket the first
time a process needs it and keeps it for the life of the process (Spark
reuses its Python workers), opening a fresh one after a fork.

Calls are plain blocking pyzmq (no gevent) with a timeout; a call that times
out closes its socket, so a late reply can never answer a later request.

A worker on the driver's machine reads the log file itself instead
(``local_log``): read-only, the same answers as FETCH, without the copies
and the single thread of the log service in between.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
from typing import Any, Optional, Sequence

import zmq

from . import protocol
from .log import MessageLog, host_id
from .protocol import LogServiceError, Op, Request

__all__ = ["LogClient", "log_client", "local_log"]

DEFAULT_TIMEOUT = 30.0


class LogClient:
    """Blocking requests to one log service; thread-safe."""

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT,
                 token: Optional[str] = None, server_key: Optional[str] = None) -> None:
        """``token``: the service's secret (``DriverService.token``), sent with each request;
        ``server_key``: the service's CURVE public key (``DriverService.server_key``), to
        speak CURVE with it (with a keypair made for this client)."""
        if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"log service endpoint {endpoint!r} is not tcp://HOST:PORT")
        self.endpoint = endpoint
        self.timeout = timeout
        self.token = token
        self.server_key = server_key
        self._sock: Optional[zmq.Socket] = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            # the process-wide context: a private one collected while a socket is open
            # would block whichever thread the garbage collector runs in
            from ..io import make_socket
            curve = None
            if self.server_key is not None:
                from ..io.curve import Curve, shared_allowlist
                from ..io.keys import generate
                curve = Curve(generate(), shared_allowlist(None))
            sock = make_socket(zmq.DEALER, {zmq.RCVHWM: 0}, curve=curve,
                               server_key=self.server_key.encode() if self.server_key else None)
            sock.connect(self.endpoint)
            self._sock = sock
        return self._sock

    def call(self, op: Op, body: Optional[dict] = None, timeout: Optional[float] = None
             ) -> dict[str, Any]:
        """Send one request and wait for its reply body; ``LogServiceError`` on ERR or timeout."""
        with self._lock:
            sock = self._socket()
            request_id = b"%x" % next(self._ids)
            body = dict(body or {})
            if self.token is not None:
                body["token"] = self.token
            wait_ms = int(1000 * (self.timeout if timeout is None else timeout))
            # A DEALER with no peer to queue for (its connection gone, e.g. after a failed
            # handshake) blocks a send until it has one: bound that wait too.
            try:
                if not sock.poll(wait_ms, zmq.POLLOUT):
                    raise zmq.Again()
                sock.send_multipart(protocol.encode_request(Request(request_id, op, body)),
                                    zmq.NOBLOCK)
            except zmq.Again:
                raise self._unavailable(op, wait_ms) from None
            while True:
                if not sock.poll(wait_ms):
                    raise self._unavailable(op, wait_ms)
                reply = protocol.decode_reply(sock.recv_multipart())
                if reply.id == request_id:
                    return dict(reply.value())
                # a reply to an older request that timed out: skip it

    def _unavailable(self, op: Op, wait_ms: int) -> LogServiceError:
        self._reset()
        return LogServiceError(
            "unavailable", f"no answer to {op.value} from the peermesh log service "
            f"at {self.endpoint} within {wait_ms / 1000:g} s (is the driver's "
            "service running? see peermesh.spark.start_service)")

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def close(self) -> None:
        """Close the socket (a later call opens a new one)."""
        with self._lock:
            self._reset()

    # --- the ops ------------------------------------------------------------

    def info(self, groups: Sequence[str] = ()) -> dict[str, Any]:
        """Log id, bounds (for ``groups``: default, any group), groups, channel endpoint and
        mesh settings of the service."""
        return self.call(Op.INFO, {"groups": list(groups)} if groups else None)

    def latest(self, groups: Sequence[str], start: int, max_rows: Optional[int] = None,
               ceiling: Optional[int] = None) -> dict[str, Any]:
        """See ``protocol`` (LATEST)."""
        body: dict[str, Any] = {"groups": list(groups), "start": int(start)}
        if max_rows is not None:
            body["max"] = int(max_rows)
        if ceiling is not None:
            body["ceiling"] = int(ceiling)
        return self.call(Op.LATEST, body)

    def fetch(self, groups: Sequence[str], start: int, end: int) -> dict[str, Any]:
        """See ``protocol`` (FETCH)."""
        return self.call(Op.FETCH, {"groups": list(groups), "start": int(start),
                                    "end": int(end)})

    def seek(self, groups: Sequence[str], when: float) -> dict[str, Any]:
        """The first offset of ``groups`` received at or after ``when`` (epoch seconds)."""
        return self.call(Op.SEEK, {"groups": list(groups), "time": float(when)})

    def count(self, groups: Sequence[str], start: int, end: int) -> dict[str, Any]:
        """How many messages of ``groups`` lie in ``[start, end)``."""
        return self.call(Op.COUNT, {"groups": list(groups), "start": int(start),
                                    "end": int(end)})

    def register(self, consumer: str, groups: Sequence[str], offset: int) -> dict[str, Any]:
        """Register a streaming query that starts at ``offset``."""
        return self.call(Op.REGISTER, {"consumer": consumer, "groups": list(groups),
                                       "offset": int(offset)})

    def commit(self, consumer: str, groups: Sequence[str], offset: int) -> dict[str, Any]:
        """The query processed everything below ``offset``: the log may trim it."""
        return self.call(Op.COMMIT, {"consumer": consumer, "groups": list(groups),
                                     "offset": int(offset)})

    def trim(self, before: int, groups: Sequence[str] = ()) -> dict[str, Any]:
        """Delete every message of ``groups`` (default: all) below ``before``."""
        return self.call(Op.TRIM, {"before": int(before), "groups": list(groups)})

    def join(self, groups: Sequence[str]) -> dict[str, Any]:
        """Make the service join ``groups``."""
        return self.call(Op.JOIN, {"groups": list(groups)})


_clients: dict[tuple[str, Optional[str], Optional[str]], LogClient] = {}
_clients_lock = threading.Lock()
_clients_pid = os.getpid()
_forked: list[LogClient] = []


def log_client(endpoint: str, token: Optional[str] = None,
               server_key: Optional[str] = None) -> LogClient:
    """This process's client of the service at ``endpoint`` (opened on first use)."""
    global _clients_pid
    with _clients_lock:
        if _clients_pid != os.getpid():  # forked: the parent's sockets are not ours
            _forked.extend(_clients.values())  # never closed or collected here
            _clients.clear()
            _clients_pid = os.getpid()
        client = _clients.get((endpoint, token, server_key))
        if client is None:
            client = _clients[(endpoint, token, server_key)] = LogClient(
                endpoint, token=token, server_key=server_key)
        return client


_local: dict[tuple[int, str], Optional[MessageLog]] = {}


def local_log(path: Optional[str], host: Optional[str], log_id: str) -> Optional[MessageLog]:
    """The log at ``path`` opened read-only by this process (and kept), when this process
    runs on ``host`` and the file there is log ``log_id``; else None (use the service)."""
    if not path or host != host_id():
        return None
    key = (os.getpid(), path)  # a forked worker opens its own connection
    with _clients_lock:
        found = _local.get(key)
        if found is None or found.log_id != log_id:  # not open yet, or the file was replaced
            if found is not None:
                found.close()
            try:
                found = MessageLog(path, readonly=True)
            except sqlite3.Error:
                found = None
            _local[key] = found
    return found if found is not None and found.log_id == log_id else None
