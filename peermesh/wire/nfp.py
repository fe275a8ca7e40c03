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

``encode`` builds frames from a message dataclass (``EncodeError``, a
``LocalProtocolError`` that is also a ``ValueError``, for a value the wire cannot
carry); ``decode`` parses frames and raises ``RemoteProtocolError`` (never
anything else) on malformed input. Hot paths build frames without a message
object (``request_frames``, ``response_frames``, ``event_frames``) and a broker
relays a decoded command with only its header changed (``reheaded``). Bodies
are opaque to the spec; peermesh's NFP overlay puts one JSON object in the
first body frame (``encode_body`` / ``decode_body``).

Kept whole: one codec, both directions of every NFP command over the same frame
layouts and the checks they share (a decoder and its encoder change together).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any, Callable, Sequence, Union

from ..errors import RemoteProtocolError
from . import jsonsafe
from .frames import EncodeError, as_bytes, as_frames

__all__ = [
    "Role", "Command", "Status", "Open", "Ready", "Keepalive", "Disconnect", "Post",
    "Response", "Get", "Delete", "EventCommand", "Message", "Target", "ALL", "ANY",
    "encode", "decode", "encode_status", "decode_status", "parse_target", "format_target",
    "encode_body", "decode_body", "to_json", "CLIENT", "WORKER", "BROKER", "request_frames",
    "response_frames", "event_frames", "reheaded", "MAX_MESSAGE", "MAX_BODY", "MAX_CONTENT",
    "check_size", "MAX_TARGET", "TargetTooLong",
]

MAX_MESSAGE = 64 * 1024 * 1024   # bytes of one message peermesh accepts (its sender is cut off)
MAX_BODY = MAX_MESSAGE - 65536   # bytes of a body frame peermesh sends (the rest: other frames)
MAX_CONTENT = MAX_BODY - 65536   # bytes of JSON in a job's arguments, result or event (the rest:
                                 # the answer around it)
#: octets of a request's target frame (a comma-separated list of worker names); a longer
#: one is a RemoteProtocolError (dropped by whoever decodes it). Process-wide: set it before
#: starting nodes to change it.
MAX_TARGET = 65536


class TargetTooLong(RemoteProtocolError):
    """A request's target frame is over ``MAX_TARGET`` octets."""


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
class EventCommand:
    """EVENT: information about a job's execution (topic is usually the job UUID)."""

    role: Role
    service: str
    topic: str
    status: Status = Status.OK
    body: tuple[bytes, ...] = (b"",)
    text: str = ""


Message = Union[Open, Ready, Keepalive, Disconnect, Post, Response, Get, Delete, EventCommand]

_COMMAND_OF: dict[type, Command] = {
    Open: Command.OPEN, Ready: Command.READY, Keepalive: Command.KEEPALIVE,
    Disconnect: Command.DISCONNECT, Post: Command.POST, Response: Command.RESPONSE,
    Get: Command.GET, Delete: Command.DELETE, EventCommand: Command.EVENT,
}


# --- strings and status ---------------------------------------------------

def _encode_string(kind: str, value: str) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    if not value or not value.isprintable():
        raise EncodeError(f"{kind} must be a non-empty printable string, not {value!r}")
    return value.encode("utf-8")


_STATUS_FRAME = {s: b"%d" % s for s in Status}


def encode_status(status: Union[Status, int], text: str = "") -> bytes:
    """The status frame: three digits, then a space and ``text`` if given."""
    if not text:
        frame = _STATUS_FRAME.get(status)  # type: ignore[arg-type]
        if frame is not None:
            return frame
    code = _STATUS_BY_CODE.get(int(status))
    if code is None:
        raise EncodeError(f"{status} is not an NFP status code")
    if not text:
        return b"%d" % code
    if not text.isprintable():
        raise EncodeError(f"status text {text!r} is not printable")
    return b"%d %s" % (code, text.encode("utf-8"))


def decode_status(frame: bytes) -> tuple[Status, str]:
    """``(status, text)`` from a status frame; ``RemoteProtocolError`` if malformed."""
    frame = bytes(frame)
    head = frame[:3]
    if len(head) != 3 or not head.isdigit():
        raise RemoteProtocolError(f"status frame {frame[:20]!r} does not start with three digits")
    status = _STATUS_BY_CODE.get(int(head))
    if status is None:
        raise RemoteProtocolError(f"status code {head.decode()} is not defined by NFP")
    if len(frame) == 3:
        return status, ""
    if frame[3:4] != b" ":
        raise RemoteProtocolError("status code is not followed by a space and text")
    try:
        text = frame[4:].decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("status text is not UTF-8") from None
    if not text.isprintable():
        raise RemoteProtocolError("status text is not printable")
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
        raise EncodeError("target names no worker")
    for name in names:
        if not name or "," in name or not name.isprintable() or name != name.strip():
            raise EncodeError(f"worker name {name!r} cannot be targeted")
    return ",".join(names)


# --- bodies ---------------------------------------------------------------

#: compact JSON, non-ASCII kept as UTF-8 (one encoder, not one per call)
_to_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# The C encoder, made once: ``JSONEncoder.encode`` builds a new C encoder per call. Same
# output, same errors (circular or very deep data takes the full path). Bodies are
# decoded by ``jsonsafe.loads`` (bounded in size and depth).
_c_encoder = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, json.JSONEncoder().default, json.encoder.encode_basestring, None, ":", ",",
    False, False, True) if json.encoder.c_make_encoder is not None else None  # type: ignore


def to_json(obj: Any) -> str:
    """``obj`` as compact JSON text (non-ASCII kept)."""
    if _c_encoder is not None:
        try:
            return "".join(_c_encoder(obj, 0))
        except RecursionError:
            pass   # circular (or very deep): the full encoder says which
    return _to_json(obj)


def encode_body(obj: Any) -> bytes:
    """One JSON object as a body frame (compact, UTF-8)."""
    return to_json(obj).encode("utf-8")


def check_size(text: str, what: str) -> None:
    """``EncodeError``, naming ``what``, if JSON ``text`` is more than a job's arguments,
    result or event may be (``MAX_CONTENT`` bytes)."""
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > MAX_CONTENT:
        raise EncodeError(f"{what} cannot be sent: it is {size:,} bytes as JSON; at most "
                          f"{MAX_CONTENT:,} go in an NFP message")


def decode_body(frame: bytes) -> dict[str, Any]:
    """The JSON object in a body frame; an empty frame is ``{}``; else ``RemoteProtocolError``."""
    if type(frame) is not bytes:
        frame = as_bytes(frame, "a body")
    if not frame:
        return {}
    try:
        obj = jsonsafe.loads(frame, MAX_MESSAGE)
    except ValueError as exc:
        raise RemoteProtocolError(f"body is not JSON: {str(exc)[:80]}") from None
    if type(obj) is not dict:
        raise RemoteProtocolError(f"body is JSON {type(obj).__name__}, not an object")
    return obj


# --- encode / decode ------------------------------------------------------
#
# The commands on every job's path (POST, GET, DELETE, RESPONSE, EVENT) are built by
# ``request_frames`` / ``response_frames`` / ``event_frames`` straight from their fields
# (``encode`` uses the same functions), and parsed by one function per command found in
# a table keyed by (header, command octet): one dict lookup checks both and their pairing.

def _body_frames(body: Sequence[bytes]) -> list[bytes]:
    if isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError("body must be a sequence of frames (e.g. (b'...',)), not bytes")
    frames = [f if type(f) is bytes else bytes(f) for f in body]
    return frames or [b""]


#: valid target texts and their frames (keywords, and worker names as they are met)
_TARGETS: dict[str, bytes] = {ALL: ALL.encode(), ANY: ANY.encode()}
_MAX_TARGETS = 4096
_MAX_CACHED_TARGET = 255      # octets of a target remembered (at most ~1 MB in all)


def _string(kind: str, value: str) -> bytes:
    """``_encode_string``'s fast path: a plain non-empty printable str."""
    if type(value) is str and value and value.isprintable():
        return value.encode("utf-8")
    return _encode_string(kind, value)


def _target_frame(target: Target) -> bytes:
    if type(target) is str:
        frame = _TARGETS.get(target)
        if frame is not None:
            return frame
    frame = _encode_string("target", format_target(target))
    if len(frame) > MAX_TARGET:
        raise EncodeError(f"target is over {MAX_TARGET} octets (MAX_TARGET)")
    if (type(target) is str and len(frame) <= _MAX_CACHED_TARGET
            and len(_TARGETS) < _MAX_TARGETS and frame == target.encode("utf-8")):
        _TARGETS[target] = frame        # worker names repeat: remember valid ones
    return frame


def _bodies(body: Sequence[bytes]) -> list[bytes]:
    if type(body) is tuple and len(body) == 1 and type(body[0]) is bytes:
        return [body[0]]
    return _body_frames(body)


#: the header frame each command may carry, by the role's bytes
_HEADERS: dict[Command, dict[bytes, bytes]] = {
    c: {r.value: bytes(r.value) for r in roles} for c, roles in ROLES.items()}
_REQUESTS = (Command.POST, Command.GET, Command.DELETE)


def _header(command: Command, role: Role) -> bytes:
    header = _HEADERS[command].get(role)   # type: ignore[call-overload]
    if header is None:
        name = role.value.decode() if isinstance(role, Role) else repr(role)
        raise EncodeError(f"{command.name} cannot carry header {name}")
    return header


def request_frames(command: Command, role: Role, service: str, target: Target, uuid: str,
                   body: Sequence[bytes] = (b"",)) -> list[bytes]:
    """The frames of a POST, GET or DELETE (what ``encode`` gives for its message)."""
    if command not in _REQUESTS:
        raise EncodeError(f"{command!r} is not POST, GET or DELETE")
    frames = [b"", _header(command, role), _COMMAND_FRAME[command], _string("service", service),
              _target_frame(target), _string("job UUID", uuid)]
    frames += _bodies(body)
    return frames


def response_frames(role: Role, service: str, uuid: str, status: Union[Status, int],
                    body: Sequence[bytes] = (b"",), text: str = "") -> list[bytes]:
    """The frames of a RESPONSE."""
    frames = [b"", _header(Command.RESPONSE, role), b"\x05", _string("service", service),
              _string("job UUID", uuid), encode_status(status, text)]
    frames += _bodies(body)
    return frames


def event_frames(role: Role, service: str, topic: str, status: Union[Status, int] = Status.OK,
                 body: Sequence[bytes] = (b"",), text: str = "") -> list[bytes]:
    """The frames of an EVENT."""
    frames = [b"", _header(Command.EVENT, role), b"\x08", _string("service", service),
              _string("topic", topic), encode_status(status, text)]
    frames += _bodies(body)
    return frames


def reheaded(frames: Sequence[bytes], role: Role) -> list[bytes]:
    """Decoded ``frames`` again with header ``role`` (a broker relaying a worker's EVENT)."""
    return [b"", _header(_COMMAND_BY_BYTE[frames[2]], role), *frames[2:]]


def _encode_request(msg: Union[Post, Get, Delete]) -> list[bytes]:
    return request_frames(_COMMAND_OF[type(msg)], msg.role, msg.service, msg.target, msg.uuid,
                          msg.body)


def _encode_response(msg: Response) -> list[bytes]:
    return response_frames(msg.role, msg.service, msg.uuid, msg.status, msg.body, msg.text)


def _encode_event(msg: EventCommand) -> list[bytes]:
    return event_frames(msg.role, msg.service, msg.topic, msg.status, msg.body, msg.text)


def _encode_open(msg: Open) -> list[bytes]:
    return [b"", _header(Command.OPEN, msg.role), b"\x00", bytes(msg.body)]


def _encode_service(msg: Union[Ready, Keepalive, Disconnect]) -> list[bytes]:
    command = _COMMAND_OF[type(msg)]
    frames = [b"", _header(command, msg.role), _COMMAND_FRAME[command],
              _string("service", msg.service)]
    if command is Command.DISCONNECT:
        frames.append(bytes(msg.body))     # type: ignore[union-attr]
    return frames


_ENCODERS: dict[type, Callable[[Any], list[bytes]]] = {
    Post: _encode_request, Get: _encode_request, Delete: _encode_request,
    Response: _encode_response, EventCommand: _encode_event, Open: _encode_open,
    Ready: _encode_service, Keepalive: _encode_service, Disconnect: _encode_service,
}


def encode(msg: Message) -> list[bytes]:
    """The frames of ``msg`` (frame 0, the empty delimiter, included)."""
    encoder = _ENCODERS.get(type(msg))
    if encoder is None:
        raise TypeError(f"not an NFP message: {msg!r}")
    return encoder(msg)


def _text(kind: str, frame: bytes) -> str:
    """A string field: non-empty printable UTF-8, else ``RemoteProtocolError``."""
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"{kind} is not UTF-8") from None
    if not text:
        raise RemoteProtocolError(f"{kind} is empty")
    if not text.isprintable():
        raise RemoteProtocolError(f"{kind} {text[:40]!r} is not printable")
    return text


def _texts(kinds: tuple[str, str, str], a: bytes, b: bytes, c: bytes) -> tuple[str, str, str]:
    """Three string fields at once (the common case costs three decodes and one check)."""
    try:
        x, y, z = a.decode("utf-8"), b.decode("utf-8"), c.decode("utf-8")
    except UnicodeDecodeError:
        x = y = z = ""
    if x and y and z and x.isprintable() and y.isprintable() and z.isprintable():
        return x, y, z
    return _text(kinds[0], a), _text(kinds[1], b), _text(kinds[2], c)


_STATUS_OF_FRAME = {b"%d" % s: (s, "") for s in Status}
_REQUEST_KINDS = ("service", "target", "job UUID")

# Messages are frozen slotted dataclasses; their generated ``__init__`` sets each field
# through ``object.__setattr__``. Decoding, whose fields are already checked, sets the
# slots directly instead (same object, a third of the cost).
_new = object.__new__


def _maker(cls: type, names: tuple[str, ...]) -> Callable[..., Any]:
    s0, s1, s2, s3, s4, *rest = (getattr(cls, name).__set__ for name in names)
    s5 = rest[0] if rest else None

    def make(v0: Any, v1: Any, v2: Any, v3: Any, v4: Any, v5: Any = "") -> Any:
        msg: Any = _new(cls)
        s0(msg, v0)
        s1(msg, v1)
        s2(msg, v2)
        s3(msg, v3)
        s4(msg, v4)
        if s5 is not None:
            s5(msg, v5)
        return msg
    return make


_REQUEST_FIELDS = ("role", "service", "target", "uuid", "body")
_MAKE = {Post: _maker(Post, _REQUEST_FIELDS), Get: _maker(Get, _REQUEST_FIELDS),
         Delete: _maker(Delete, _REQUEST_FIELDS),
         Response: _maker(Response, ("role", "service", "uuid", "status", "body", "text")),
         EventCommand: _maker(EventCommand, ("role", "service", "topic", "status", "body", "text"))}


def _parse_request(frames: list[bytes], count: int, role: Role, cls: type) -> Message:
    if count < 7:
        raise RemoteProtocolError(f"{cls.__name__.upper()} has 7 or more frames, not {count}")
    if len(frames[4]) > MAX_TARGET:
        raise TargetTooLong(f"target of {len(frames[4])} octets: over {MAX_TARGET} (MAX_TARGET)")
    service, target, uuid = _texts(_REQUEST_KINDS, frames[3], frames[4], frames[5])
    if target not in _TARGETS:
        try:
            parse_target(target)
        except ValueError as exc:
            raise RemoteProtocolError(str(exc)) from None
        if (len(frames[4]) <= _MAX_CACHED_TARGET and len(_TARGETS) < _MAX_TARGETS
                and "," not in target and target == target.strip()):
            _TARGETS[target] = frames[4]
    body = (frames[6],) if count == 7 else tuple(frames[6:])
    return _MAKE[cls](role, service, target, uuid, body)   # type: ignore[no-any-return]


def _parse_reply(frames: list[bytes], count: int, role: Role, cls: type) -> Message:
    if count < 7:
        raise RemoteProtocolError(f"{cls.__name__.upper()} has 7 or more frames, not {count}")
    status = _STATUS_OF_FRAME.get(frames[5])
    if status is None:
        status = decode_status(frames[5])
    try:
        service, key = frames[3].decode("utf-8"), frames[4].decode("utf-8")
    except UnicodeDecodeError:
        service = key = ""
    if not (service and key and service.isprintable() and key.isprintable()):
        service = _text("service", frames[3])
        key = _text("job UUID" if cls is Response else "topic", frames[4])
    body = (frames[6],) if count == 7 else tuple(frames[6:])
    return _MAKE[cls](role, service, key, status[0], body, status[1])  # type: ignore[no-any-return]


def _parse_fixed(frames: list[bytes], count: int, role: Role, cls: type) -> Message:
    fixed = 5 if cls is Disconnect else 4
    if count != fixed:
        raise RemoteProtocolError(f"{cls.__name__.upper()} has {fixed} frames, not {count}")
    if cls is Open:
        return Open(role, frames[3])
    service = _text("service", frames[3])
    if cls is Ready:
        return Ready(service)
    if cls is Keepalive:
        return Keepalive(role, service)
    return Disconnect(role, service, frames[4])


_CLASS_OF = {command: cls for cls, command in _COMMAND_OF.items()}
_PARSE_BY = {Command.POST: _parse_request, Command.GET: _parse_request,
             Command.DELETE: _parse_request, Command.RESPONSE: _parse_reply,
             Command.EVENT: _parse_reply}
#: (header, command octet) -> (parser, role, message class), for the pairs the spec allows
_PARSERS: dict[tuple[bytes, bytes], tuple[Callable[..., Message], Role, type]] = {
    (role.value, _COMMAND_FRAME[command]):
        (_PARSE_BY.get(command, _parse_fixed), role, _CLASS_OF[command])
    for command, roles in ROLES.items() for role in roles}


def _no_parser(frames: list[bytes]) -> RemoteProtocolError:
    """Why (header, command) names no command the spec allows."""
    role = _ROLE_BY_BYTES.get(frames[1])
    if role is None:
        return RemoteProtocolError(f"header {frames[1][:12]!r} is not NFPC01, NFPW01 or NFPB01")
    command = _COMMAND_BY_BYTE.get(frames[2])
    if command is None:
        return RemoteProtocolError(f"command frame {frames[2][:8]!r} is not one known octet")
    return RemoteProtocolError(f"{command.name} does not come with header {role.value.decode()}")


def decode(frames: Sequence[bytes]) -> Message:
    """Parse one NFP command (without any ROUTER identity frame)."""
    if type(frames) is not list:
        frames = as_frames(frames, "an NFP message")
    else:
        for frame in frames:
            if type(frame) is not bytes:
                frames = as_frames(frames, "an NFP message")
                break
    count = len(frames)
    if count < 4:
        raise RemoteProtocolError(f"{count} frames; every NFP command has at least 4")
    if frames[0]:
        raise RemoteProtocolError("frame 0 is not empty")
    entry = _PARSERS.get((frames[1], frames[2]))
    if entry is None:
        raise _no_parser(frames)
    parse, role, cls = entry
    return parse(frames, count, role, cls)
