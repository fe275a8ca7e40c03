"""The log service protocol (``PMLOG1``): how Spark workers talk to the driver's log.

Sans-io, like ``peermesh.wire``: frames in, frames out; no sockets, no clock.

The driver-side service binds a ZeroMQ ROUTER; each Spark worker process
connects one DEALER. Requests may be pipelined: every request carries an id
that its reply repeats. ::

    request (DEALER -> ROUTER):  "PMLOG1" | request id | op     | body
    reply   (ROUTER -> DEALER):  "PMLOG1" | request id | status | body

    request id = 1*16 OCTET             chosen by the client, opaque
    op         = "INFO" / "LATEST" / "FETCH" / "REGISTER" / "COMMIT" / "TRIM" / "JOIN"
               / "SEEK" / "COUNT"
    status     = "OK" / "ERR"
    body       = msgpack map            (an ERR body: {"kind": str, "message": str})

Request bodies (offsets are log offsets; ``end`` is exclusive; ``groups``
empty means every group; every body also carries the service's ``token``,
and a request without it is answered ERR ``unauthorised``):

    INFO      {groups?}                               -> {log, earliest, floors, next, groups,
                                                          channel, path, host}
    LATEST    {groups, start, max?, ceiling?}         -> {log, earliest, floors, next, end,
                                                          behind}
    FETCH     {groups, start, end}                    -> {log, earliest, floors, next, chunks,
                                                          resume}
    REGISTER  {consumer, groups, offset}              -> {log}
    COMMIT    {consumer, groups, offset}              -> {log, earliest}
    TRIM      {before, groups?}                       -> {log, earliest}
    JOIN      {groups}                                -> {groups}
    SEEK      {groups, time}                          -> {log, earliest, next, offset}
    COUNT     {groups, start, end}                    -> {log, count}

``floors`` maps each of ``groups`` to its own earliest offset: every message
of that group from it on is still held (trims are per group, and may cut
inside a stored chunk). ``earliest`` is the lowest of them (without groups:
the whole log's). A reader of several groups has lost data only where one
group's floor is above where it reads that group. ``SEEK.offset`` is the first message of ``groups`` received at
or after ``time`` (epoch seconds), or ``next`` when there is none.

``LATEST.end`` is one past the last message of ``groups`` at or after
``start`` and below ``ceiling`` (or ``next``), taking at most ``max``
messages; ``start`` itself when there is none. ``LATEST.behind`` maps each of
``groups`` to how many of its messages lie in ``[end, next)`` (what a query
that reads up to ``end`` is behind). ``FETCH.chunks`` is a list
of ``[group, seqs, data]``, the log's chunks as stored (see ``log``), by
lowest offset; they may hold offsets outside the range asked for, and the
reader keeps those in ``[max(start, floors[group]), min(resume, end))``. Every
message of the range below ``resume`` is in the reply: the next FETCH
starts there (``resume`` is ``end``, or ``next`` when that is lower, once
the range is done). A reply holds at most about ``MAX_FETCH_BYTES`` of chunks.

``INFO.path`` is the log file and ``INFO.host`` names the machine that holds
it (``log.host_id``): a worker on that machine may read the file itself,
read-only, with ``MessageLog.fetch`` (the same answer as FETCH, without the
round trip through the service).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Sequence

import msgpack

from ..errors import ProtocolError
from .errors import SparkError
from ..wire.frames import as_frames

__all__ = ["PROTOCOL", "Op", "Request", "Reply", "encode_request", "decode_request",
           "encode_reply", "decode_reply", "LogServiceError", "DataLossError", "MAX_FETCH_BYTES",
           "ERROR_KINDS"]

PROTOCOL = b"PMLOG1"
MAX_REQUEST_ID = 16
#: chunk octets in one FETCH reply, at most (a single larger chunk is sent alone)
MAX_FETCH_BYTES = 16 * 1024 * 1024


class Op(str, Enum):
    """What a request asks the service for."""

    INFO = "INFO"
    LATEST = "LATEST"
    FETCH = "FETCH"
    REGISTER = "REGISTER"
    COMMIT = "COMMIT"
    TRIM = "TRIM"
    JOIN = "JOIN"
    SEEK = "SEEK"
    COUNT = "COUNT"


#: the ``kind`` of an ERR reply
ERROR_KINDS = ("bad-request", "unknown-op", "data-loss", "internal", "unavailable",
               "unauthorised")


class LogServiceError(SparkError):
    """The log service answered ERR, or could not be reached; ``kind`` says which."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class DataLossError(LogServiceError):
    """Offsets a reader needs are no longer in the log (trimmed, or another log)."""

    def __init__(self, message: str) -> None:
        super().__init__("data-loss", message)


@dataclass(frozen=True, slots=True)
class Request:
    """One request: ``op`` and its ``body``; ``id`` pairs it with its reply."""

    id: bytes
    op: Op
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Reply:
    """One reply: ``ok`` and its ``body`` (for errors: ``kind`` and ``message``)."""

    id: bytes
    ok: bool
    body: Mapping[str, Any]

    def value(self) -> Mapping[str, Any]:
        """The body of an OK reply; raises ``LogServiceError`` (or ``DataLossError``) for ERR."""
        if self.ok:
            return self.body
        kind = str(self.body.get("kind", "internal"))
        message = str(self.body.get("message", ""))
        if kind == "data-loss":
            raise DataLossError(message)
        raise LogServiceError(kind, message)


def _pack(body: Mapping[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _unpack(frame: bytes) -> Mapping[str, Any]:
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ProtocolError(f"body is not msgpack: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"body is a {type(body).__name__}, not a map")
    return body


def _check_id(request_id: bytes) -> bytes:
    if not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise ProtocolError(f"request id must be 1-{MAX_REQUEST_ID} octets, not {len(request_id)}")
    return bytes(request_id)


def encode_request(request: Request) -> list[bytes]:
    """The frames of ``request`` (what a DEALER sends)."""
    return [PROTOCOL, _check_id(request.id), request.op.value.encode("ascii"),
            _pack(request.body)]


def _four_frames(frames: Sequence[bytes], what: str) -> list[bytes]:
    """``frames`` as four ``bytes`` starting with ``PROTOCOL`` (``what``: "a request" or
    "a reply"); ``ProtocolError`` if they are not."""
    if type(frames) is not list or len(frames) != 4 or type(frames[0]) is not bytes \
            or type(frames[1]) is not bytes or type(frames[2]) is not bytes \
            or type(frames[3]) is not bytes:
        frames = as_frames(frames, what)
    if len(frames) != 4:
        raise ProtocolError(f"{what} has 4 frames, not {len(frames)}")
    if frames[0] != PROTOCOL:
        raise ProtocolError(f"not {PROTOCOL.decode()}: {frames[0][:16]!r}")
    return frames


def decode_request(frames: Sequence[bytes]) -> Request:
    """A request from its frames (after the ROUTER's identity); ``ProtocolError`` if bad.

    An unknown op raises ``ProtocolError`` whose ``reason`` starts with
    ``unknown op`` (the service answers it with an ERR ``unknown-op``).
    """
    frames = _four_frames(frames, "a request")
    request_id = _check_id(bytes(frames[1]))
    try:
        op = Op(bytes(frames[2]).decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"unknown op {bytes(frames[2])[:16]!r}") from None
    return Request(request_id, op, _unpack(bytes(frames[3])))


def encode_reply(reply: Reply) -> list[bytes]:
    """The frames of ``reply`` (what the ROUTER sends after the identity)."""
    return [PROTOCOL, _check_id(reply.id), b"OK" if reply.ok else b"ERR", _pack(reply.body)]


def decode_reply(frames: Sequence[bytes]) -> Reply:
    """A reply from its frames (what a DEALER receives); ``ProtocolError`` if bad."""
    frames = _four_frames(frames, "a reply")
    status = bytes(frames[2])
    if status not in (b"OK", b"ERR"):
        raise ProtocolError(f"unknown status {status[:16]!r}")
    return Reply(_check_id(bytes(frames[1])), status == b"OK", _unpack(bytes(frames[3])))


def error_reply(request_id: bytes, kind: str, message: str) -> Reply:
    """An ERR reply."""
    return Reply(request_id, False, {"kind": kind, "message": message})
