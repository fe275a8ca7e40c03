"""The driver service's log server: ``PMLOG1`` requests (``peermesh.spark.protocol``) from
executors answered from the ``MessageLog``, on a ZeroMQ ROUTER served by the I/O layer's
``HubSocket`` on the server thread's own gevent hub."""

from __future__ import annotations

import hmac
import logging
import threading
from pathlib import Path
from typing import Any, Optional, Protocol

import gevent
import zmq

from ..counters import Counters
from ..io import HubSocket, make_socket
from ..io.connections import GuardedListener
from . import protocol
from .advert import ServiceStats
from .log import MessageLog, host_id
from .meshsettings import MeshSettings
from .protocol import Op, Reply, Request

__all__ = ["LogServer", "server_socket"]

log = logging.getLogger(__name__)

#: bounds of the log server's socket: a request is a small msgpack map, and a client
#: that does not read its replies holds at most a few FETCH replies (16 MiB each)
_MAX_REQUEST = 1024 * 1024
_SERVER_SNDHWM = 4
_SERVER_RCVHWM = 256


class LogOwner(Protocol):
    """What the log server reads of its service (``DriverService``) and may ask of it."""

    token: str
    stats: ServiceStats
    groups: list[str]
    channel: Any
    mesh: Optional[MeshSettings]
    path: Path
    trim_on_commit: bool
    consumer_ttl: Optional[float]

    def join(self, group: str) -> None: ...


def server_socket(curve: Any) -> zmq.Socket:
    """The log server's ROUTER socket (bounded, CURVE with ``curve`` unless None), unbound."""
    return make_socket(zmq.ROUTER, {zmq.SNDHWM: _SERVER_SNDHWM, zmq.RCVHWM: _SERVER_RCVHWM,
                                    zmq.MAXMSGSIZE: _MAX_REQUEST}, curve=curve)


class LogServer:
    """Serves ``sock`` (bound at ``endpoint``) for ``owner`` until ``close``; connections it
    sheds are counted in ``limits``."""

    def __init__(self, owner: LogOwner, sock: zmq.Socket, endpoint: str, limits: Counters,
                 stopping: threading.Event) -> None:
        self.owner = owner
        self.sock = sock
        self.endpoint = endpoint
        self.limits = limits
        self.stopping = stopping
        self._server: Optional[tuple[GuardedListener, Any]] = None  # and its hub's loop

    def serve(self, reader: MessageLog) -> None:
        """Answer requests with ``reader`` until ``close`` (on this thread's own hub); closes
        ``reader``."""
        sock = self.sock
        hub = gevent.get_hub()  # this thread's own
        server = GuardedListener(HubSocket(sock, endpoint=self.endpoint), self.limits)
        handle = self.handle

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
            if not self.stopping.is_set():  # else stop() came first
                server.serve(on_message)  # until stop() closes it
        finally:
            self._server = None
            server.close()
            reader.close()
            hub.destroy(destroy_loop=True)

    def close(self) -> None:
        """Stop serving (from any thread): the server's hub runs in its own thread."""
        server = self._server
        if server is not None:
            try:
                server[1].run_callback_threadsafe(server[0].close)
            except Exception:  # that thread ended meanwhile, and its hub with it
                pass

    def handle(self, reader: MessageLog, frames: list[bytes]) -> Optional[Reply]:
        """The reply to one request's ``frames`` (None: dropped as malformed)."""
        self.owner.stats.requests += 1
        try:
            request = protocol.decode_request(frames)
        except protocol.ProtocolError as exc:
            self.owner.stats.errors += 1
            if len(frames) == 4 and exc.reason.startswith("unknown op") and frames[1]:
                return protocol.error_reply(bytes(frames[1])[:protocol.MAX_REQUEST_ID],
                                            "unknown-op", exc.reason)
            log.debug("dropped a malformed request: %s", exc.reason)
            return None
        if not hmac.compare_digest(str(request.body.get("token", "")).encode(),
                                   self.owner.token.encode()):
            self.owner.stats.errors += 1
            return protocol.error_reply(request.id, "unauthorised",
                                        "this log service needs its token (DriverService.token,"
                                        " passed to readers as option 'token')")
        try:
            return Reply(request.id, True, self._answer(reader, request))
        except (KeyError, TypeError, ValueError) as exc:
            self.owner.stats.errors += 1
            return protocol.error_reply(request.id, "bad-request",
                                        f"{request.op.value}: {type(exc).__name__}: {exc}")
        except Exception as exc:
            self.owner.stats.errors += 1
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
                    "groups": list(self.owner.groups),
                    "channel": getattr(self.owner.channel, "endpoint", None),
                    "mesh": self.owner.mesh.to_options() if self.owner.mesh else {},
                    "path": str(self.owner.path), "host": host_id()}
        if op is Op.REGISTER:
            reader.register(str(body["consumer"]), int(body["offset"]),
                            _groups(body.get("groups")))
            return {"log": reader.log_id}
        if op is Op.COMMIT:
            groups = _groups(body.get("groups"))
            reader.commit(str(body["consumer"]), int(body["offset"]), groups)
            if self.owner.trim_on_commit:
                self.owner.stats.trimmed += reader.trim_committed(self.owner.consumer_ttl)
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
                self.owner.join(group)
            return {"groups": list(self.owner.groups)}
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
        end = max(end, start)
        # the backlog per group, for the query's progress report: none past the last message
        # of the groups (only a ``max`` or a ``ceiling`` leaves any)
        limited = body.get("max") is not None or ceiling < nxt
        behind = {g: reader.count(end, nxt, [g]) if limited and end < nxt else 0
                  for g in groups}
        return {"log": reader.log_id, "earliest": earliest, "floors": floors, "next": nxt,
                "end": end, "behind": behind}

    def _fetch(self, reader: MessageLog, body: Any) -> dict[str, Any]:
        reply = reader.fetch(int(body["start"]), int(body["end"]), _groups(body.get("groups")),
                             protocol.MAX_FETCH_BYTES)
        self.owner.stats.chunks_served += len(reply["chunks"])
        # chunks as stored: the executors decode them (the driver is the busier side)
        reply["chunks"] = [[c.group, c.seqs, c.data] for c in reply["chunks"]]
        return reply


def _groups(value: Any) -> list[str]:
    if not value:
        return []
    if isinstance(value, str):
        return [g for g in value.split(",") if g]
    return [str(g) for g in value]
