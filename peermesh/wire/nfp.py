"""NFP codec (NORFAB Protocol, ../shared/specs/nfp.txt): commands as lists of frames.

How it works
------------
Every NFP command is one multipart ZeroMQ message. The ROUTER identity frame
that a ROUTER socket prepends is not part of the command (the transport strips
it). Frame layouts, as the spec lays them out::

    OPEN       empty | header        | %x00 | open body
    READY      empty | NFPW01        | %x01 | service
    KEEPALIVE  empty | NFPB01/NFPW01 | %x02 | service
    DISCONNECT empty | NFPB01/NFPW01 | %x03 | service | disconnect body
    POST       empty | NFPC01/NFPB01 | %x04 | service | target | job UUID | body...
    RESPONSE   empty | NFPB01/NFPW01 | %x05 | service | job UUID | status | body...
    GET        empty | NFPC01/NFPB01 | %x06 | service | target | job UUID | body...
    DELETE     empty | NFPC01/NFPB01 | %x07 | service | target | job UUID | body...
    EVENT      empty | NFPW01(NFPB01)| %x08 | service | topic | status | body...

    (frames 0, 1, 2, 3, ...; "body..." is frame 6 and any frames after it)

    header  = "NFPC01" (client) / "NFPW01" (worker) / "NFPB01" (broker), six octets
    status  = 3DIGIT [ SP text ]      ; 200 202 300 400 408 417 500 only
    target  = "all" / "any" / name *( "," name )
    strings = printable UTF-8, never empty

Decisions where the draft is vague or contradicts itself (see README, "NFP
jobs and the broker"):

* DISCONNECT is announced as "3 frames" but laid out as five (0-4): the
  layout wins; it has exactly five frames.
* POST, RESPONSE, GET, DELETE and EVENT have "7 or more frames": at least one
  body frame (it may be empty); further frames are more body.
* EVENT's header is only "NFPW01" in the layout, yet the broker "relays EVENT
  to the client": a relayed EVENT carries "NFPB01". Every other command
  accepts exactly the headers its layout lists.
* Status codes not listed in the spec are invalid ("MAY NOT use status codes
  that are not defined here").

``encode`` builds frames from a message dataclass; ``decode`` parses frames
and raises ``ProtocolError`` (never anything else) on malformed input. Bodies
are opaque to the spec; peermesh's NFP overlay puts one JSON object in the
first body frame (``encode_body`` / ``decode_body``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, Sequence, Union

from ..errors import ProtocolError

__all__ = [
    "Role", "Command", "Status", "Open", "Ready", "Keepalive", "Disconnect", "Post",
    "Response", "Get", "Delete", "Event", "Message", "Target", "ALL", "ANY",
    "encode", "decode", "encode_status", "decode_status", "parse_target", "format_target",
    "encode_body", "decode_body", "to_json", "CLIENT", "WORKER", "BROKER",
]


class Role(bytes, Enum):
    """Frame 1: who speaks (NFP/Client, NFP/Worker, NFP/Broker v0.1)."""

    CLIENT = b"NFPC01"
    WORKER = b"NFPW01"
    BROKER = b"NFPB01"


CLIENT, WORKER, BROKER = Role.CLIENT, Role.WORKER, Role.BROKER


class Command(IntEnum):
    """Frame 2: one octet."""

    OPEN = 0x00
    READY = 0x01
    KEEPALIVE = 0x02
    DISCONNECT = 0x03
    POST = 0x04
    RESPONSE = 0x05
    GET = 0x06
    DELETE = 0x07
    EVENT = 0x08


class Status(IntEnum):
    """The status codes the spec defines (three digits on the wire)."""

    OK = 200               #: the worker executed the request
    ACCEPTED = 202         #: the job was accepted for dispatch
    PENDING = 300          #: not done yet; retry later
    UNKNOWN = 400          #: unknown job UUID; do not retry
    REQUEST_TIMEOUT = 408  #: no response from broker or worker
    EXPECT_FAILED = 417    #: the reply was not what was expected
    ERROR = 500            #: internal error; retry later


#: headers each command may carry (the spec's layout; EVENT also from the broker)
ROLES: dict[Command, frozenset[Role]] = {
    Command.OPEN: frozenset((CLIENT, WORKER, BROKER)),
    Command.READY: frozenset((WORKER,)),
    Command.KEEPALIVE: frozenset((BROKER, WORKER)),
    Command.DISCONNECT: frozenset((BROKER, WORKER)),
    Command.POST: frozenset((CLIENT, BROKER)),
    Command.RESPONSE: frozenset((BROKER, WORKER)),
    Command.GET: frozenset((CLIENT, BROKER)),
    Command.DELETE: frozenset((CLIENT, BROKER)),
    Command.EVENT: frozenset((WORKER, BROKER)),
}

_ROLE_BY_BYTES = {r.value: r for r in Role}
_COMMAND_BY_BYTE = {bytes((c.value,)): c for c in Command}
_STATUS_BY_CODE = {s.value: s for s in Status}
_COMMAND_FRAME = {c: bytes((c.value,)) for c in Command}


# --- messages -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Open:
    """OPEN: introduce a client or worker / confirm the connection (broker)."""

    role: Role
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Ready:
    """READY: a worker registers with a service (header is always NFPW01)."""

    service: str
    role: Role = WORKER


@dataclass(frozen=True, slots=True)
class Keepalive:
    """KEEPALIVE: the broker or worker is still alive."""

    role: Role
    service: str


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT: the sender asks the other end to disconnect."""

    role: Role
    service: str
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Post:
    """POST: distribute a job request to the targeted workers of a service."""

    role: Role
    service: str
    target: str
    uuid: str
    body: tuple[bytes, ...] = (b"",)


@dataclass(frozen=True, slots=True)
class Response:
    """RESPONSE: status (and result) of a job request."""

    role: Role
    service: str
    uuid: str
    status: Status
    body: tuple[bytes, ...] = (b"",)
    text: str = ""


@dataclass(frozen=True, slots=True)
class Get:
    """GET: retrieve job results."""

    role: Role
    service: str
    target: str
    uuid: str
    body: tuple[bytes, ...] = (b"",)


@dataclass(frozen=True, slots=True)
class Delete:
    """DELETE: cancel a job."""

    role: Role
    service: str
    target: str
    uuid: str
    body: tuple[bytes, ...] = (b"",)


@dataclass(frozen=True, slots=True)
class Event:
    """EVENT: information about a job's execution (topic is usually the job UUID)."""

    role: Role
    service: str
    topic: str
    status: Status = Status.OK
    body: tuple[bytes, ...] = (b"",)
    text: str = ""


Message = Union[Open, Ready, Keepalive, Disconnect, Post, Response, Get, Delete, Event]

_COMMAND_OF: dict[type, Command] = {
    Open: Command.OPEN, Ready: Command.READY, Keepalive: Command.KEEPALIVE,
    Disconnect: Command.DISCONNECT, Post: Command.POST, Response: Command.RESPONSE,
    Get: Command.GET, Delete: Command.DELETE, Event: Command.EVENT,
}


# --- strings and status ---------------------------------------------------

def _encode_string(kind: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    if not value or not value.isprintable():
        raise ValueError(f"{kind} must be a non-empty printable string, not {value!r}")
    return value.encode("utf-8")


def _decode_string(kind: str, frame: bytes) -> str:
    try:
        text = frame.decode("utf-8") if type(frame) is bytes else bytes(frame).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{kind} is not UTF-8") from None
    if not text:
        raise ProtocolError(f"{kind} is empty")
    if not text.isprintable():
        raise ProtocolError(f"{kind} {text[:40]!r} is not printable")
    return text


def encode_status(status: Union[Status, int], text: str = "") -> bytes:
    """The status frame: three digits, then a space and ``text`` if given."""
    code = _STATUS_BY_CODE.get(int(status))
    if code is None:
        raise ValueError(f"{status} is not an NFP status code")
    if not text:
        return b"%d" % code
    if not text.isprintable():
        raise ValueError(f"status text {text!r} is not printable")
    return b"%d %s" % (code, text.encode("utf-8"))


def decode_status(frame: bytes) -> tuple[Status, str]:
    """``(status, text)`` from a status frame; ``ProtocolError`` if malformed."""
    frame = bytes(frame)
    head = frame[:3]
    if len(head) != 3 or not head.isdigit():
        raise ProtocolError(f"status frame {frame[:20]!r} does not start with three digits")
    status = _STATUS_BY_CODE.get(int(head))
    if status is None:
        raise ProtocolError(f"status code {head.decode()} is not defined by NFP")
    if len(frame) == 3:
        return status, ""
    if frame[3:4] != b" ":
        raise ProtocolError("status code is not followed by a space and text")
    try:
        text = frame[4:].decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("status text is not UTF-8") from None
    if not text.isprintable():
        raise ProtocolError("status text is not printable")
    return status, text


# --- targets --------------------------------------------------------------

ALL = "all"
ANY = "any"
Target = Union[str, tuple[str, ...]]


def parse_target(text: str) -> Target:
    """``"all"``, ``"any"`` or a tuple of worker names (comma-separated, no blanks)."""
    if text in (ALL, ANY):
        return text
    names = tuple(name.strip() for name in text.split(","))
    if not text or not all(names):
        raise ValueError(f"target {text!r} is not 'all', 'any' or comma-separated worker names")
    if len(set(names)) != len(names):
        raise ValueError(f"target {text!r} names a worker twice")
    if any(name in (ALL, ANY) for name in names):
        raise ValueError(f"target {text!r} mixes 'all'/'any' with worker names")
    return names


def format_target(target: Target) -> str:
    """The target frame text for ``target`` (a keyword, a name list, or a name tuple)."""
    if isinstance(target, str):
        return format_target(parse_target(target)) if target not in (ALL, ANY) else target
    names = tuple(target)
    if not names:
        raise ValueError("target names no worker")
    for name in names:
        if not name or "," in name or not name.isprintable() or name != name.strip():
            raise ValueError(f"worker name {name!r} cannot be targeted")
    return ",".join(names)


# --- bodies ---------------------------------------------------------------

#: compact JSON, non-ASCII kept as UTF-8 (one encoder, not one per call)
to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_from_json = json.JSONDecoder().decode


def encode_body(obj: Any) -> bytes:
    """One JSON object as a body frame (compact, UTF-8)."""
    return to_json(obj).encode("utf-8")


def decode_body(frame: bytes) -> dict[str, Any]:
    """The JSON object in a body frame; an empty frame is ``{}``; else ``ProtocolError``."""
    if not frame:
        return {}
    try:
        text = frame.decode("utf-8") if type(frame) is bytes else bytes(frame).decode("utf-8")
        obj = _from_json(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"body is not JSON: {str(exc)[:80]}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"body is JSON {type(obj).__name__}, not an object")
    return obj


# --- encode / decode ------------------------------------------------------

def _body_frames(body: Sequence[bytes]) -> list[bytes]:
    if isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError("body must be a sequence of frames (e.g. (b'...',)), not bytes")
    frames = [bytes(f) for f in body]
    return frames or [b""]


def encode(msg: Message) -> list[bytes]:
    """The frames of ``msg`` (frame 0, the empty delimiter, included)."""
    command = _COMMAND_OF.get(type(msg))
    if command is None:
        raise TypeError(f"not an NFP message: {msg!r}")
    role = Role(msg.role)
    if role not in ROLES[command]:
        raise ValueError(f"{command.name} cannot carry header {role.value.decode()}")
    head = [b"", role.value, _COMMAND_FRAME[command]]
    if isinstance(msg, Open):
        return head + [bytes(msg.body)]
    if isinstance(msg, (Ready, Keepalive)):
        return head + [_encode_string("service", msg.service)]
    if isinstance(msg, Disconnect):
        return head + [_encode_string("service", msg.service), bytes(msg.body)]
    if isinstance(msg, (Post, Get, Delete)):
        return head + [_encode_string("service", msg.service),
                       _encode_string("target", format_target(msg.target)),
                       _encode_string("job UUID", msg.uuid), *_body_frames(msg.body)]
    if isinstance(msg, Response):
        return head + [_encode_string("service", msg.service),
                       _encode_string("job UUID", msg.uuid), encode_status(msg.status, msg.text),
                       *_body_frames(msg.body)]
    assert isinstance(msg, Event)
    return head + [_encode_string("service", msg.service), _encode_string("topic", msg.topic),
                   encode_status(msg.status, msg.text), *_body_frames(msg.body)]


_FIXED = {Command.OPEN: 4, Command.READY: 4, Command.KEEPALIVE: 4, Command.DISCONNECT: 5}


def decode(frames: Sequence[bytes]) -> Message:
    """Parse one NFP command (without any ROUTER identity frame)."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        raise ProtocolError("an NFP message is a list of frames, not one byte string")
    count = len(frames)
    if count < 4:
        raise ProtocolError(f"{count} frames; every NFP command has at least 4")
    if frames[0]:
        raise ProtocolError("frame 0 is not empty")
    role = _ROLE_BY_BYTES.get(bytes(frames[1]))
    if role is None:
        raise ProtocolError(f"header {bytes(frames[1])[:12]!r} is not NFPC01, NFPW01 or NFPB01")
    command = _COMMAND_BY_BYTE.get(bytes(frames[2]))
    if command is None:
        raise ProtocolError(f"command frame {bytes(frames[2])[:8]!r} is not one known octet")
    if role not in ROLES[command]:
        raise ProtocolError(f"{command.name} does not come with header {role.value.decode()}")
    fixed = _FIXED.get(command)
    if fixed is not None:
        if count != fixed:
            raise ProtocolError(f"{command.name} has {fixed} frames, not {count}")
        if command is Command.OPEN:
            return Open(role, bytes(frames[3]))
        service = _decode_string("service", frames[3])
        if command is Command.READY:
            return Ready(service)
        if command is Command.KEEPALIVE:
            return Keepalive(role, service)
        return Disconnect(role, service, bytes(frames[4]))
    if count < 7:
        raise ProtocolError(f"{command.name} has 7 or more frames, not {count}")
    service = _decode_string("service", frames[3])
    body = tuple(bytes(f) for f in frames[6:])
    if command is Command.RESPONSE or command is Command.EVENT:
        key = _decode_string("job UUID" if command is Command.RESPONSE else "topic", frames[4])
        status, text = decode_status(frames[5])
        if command is Command.RESPONSE:
            return Response(role, service, key, status, body, text)
        return Event(role, service, key, status, body, text)
    target = _decode_string("target", frames[4])
    try:
        parse_target(target)
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    uuid = _decode_string("job UUID", frames[5])
    cls = Post if command is Command.POST else Get if command is Command.GET else Delete
    return cls(role, service, target, uuid, body)
