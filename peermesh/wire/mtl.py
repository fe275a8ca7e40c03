"""11/MTL codec (Message Transport Layer, ../shared/specs/mtl-11.txt).

How it works
------------
MTL has two flows. The control flow is request-reply over a ROUTER; each
request and reply is two frames (the ROUTER identity frame is not part of
them)::

    request = command-name (UTF-8, case-insensitive) | body (one JSON object)
    reply   = status (three ASCII digits, 200-599)   | body (one JSON object)

The data flow is asynchronous over a ROUTER/DEALER pair; every data command
is two frames, a binary header and a body::

    header  = type (1 octet) *field
    Lease    %x01 sequence lease            body unused
    Response %x02 sequence                  body = three-digit code
    Summon   %x03 sequence resource         body unused
    Dismiss  %x04 sequence resource         body unused
    Content  %x05 sequence resource table   body = the content, opaque
    Confirm  %x06 sequence multiple         body unused
    Reject   %x07 sequence multiple recycle body unused
    Ping     %x08                           body unused
    Pong     %x09                           body unused

    integer  = 8 octets, unsigned, network order   (sequence)
    shortint = 2 octets, unsigned, network order
    string   = 1 length octet, then 0-255 octets   (lease, resource)
    boolean  = 1 octet, 0 (false) or 1 (true)       (multiple, recycle)
    table    = shortint length, then that many octets holding one msgpack
               map with string keys; length 0 is the empty table

Decisions where the spec is silent or loose (docs/mtl.md lists them all):

* The spec leaves the "field table" undefined; peermesh defines it as above.
  Values are any msgpack value (nested maps and arrays, binary, the timestamp
  extension); other extension types are ill-formed.
* A short string holds UTF-8 text of printable characters (no control
  characters), at most 255 octets.
* An "unused" body is ignored when decoding and sent empty.
* Request bodies are at most ``MAX_REQUEST`` octets; a lease request names
  at most ``MAX_RESOURCES`` resources, each a valid short string.
* A 201 after a finished SASL exchange carries the mechanism's final server
  data (RFC 4422 "additional data with success") as ``"additional"``, and
  may list the gateway endpoints a client can fail over to (``"gateways"``).
* The 202 example in the spec is not JSON (a comma is missing); peermesh
  sends ``{"status": "Data Lease", "port": 5555, "lease": "..."}``.
* An absent ``"confirm"`` means ``"none"``; an absent ``"resources"`` is
  the empty list.
* Error replies carry ``"status"`` (the reason phrase) and ``"reason"``.

The spec tells the server to drop ill-formed requests silently and to answer
well-formed but invalid ones with an error. The codec keeps the two apart:
``decode_request`` and ``decode_data`` raise ``RemoteProtocolError`` (and nothing
else) for ill-formed frames, while ``decode_request`` returns an
``InvalidRequest`` for a well-formed request it cannot accept (an unknown
command, a missing or mistyped field), so the caller can answer it. The
encoders refuse a value the wire cannot carry with ``EncodeError`` (a
``LocalProtocolError`` that is also a ``ValueError``).

Kept whole: one codec for both MTL flows, whose control and data commands share
the status codes, strings and checks (a decoder and its encoder change together).
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, Callable, Mapping, Sequence, Union

import msgpack

from ..errors import RemoteProtocolError
from . import jsonsafe
from .frames import EncodeError, as_bytes

__all__ = [
    "PROTOCOL_NAME", "PROTOCOL_VERSION", "MAX_REQUEST", "MAX_RESOURCES", "MAX_STRING",
    "MAX_TABLE", "MAX_INTEGER", "ControlCommand", "Status", "Direction", "DataType",
    "Open", "Authorize", "SelectProfile", "LeaseRequest", "InvalidRequest", "Request",
    "Ok", "Ready", "DataLease", "Unauthorized", "Challenged", "Failure", "Reply",
    "Lease", "Response", "Summon", "Dismiss", "Content", "Confirm", "Reject", "Ping", "Pong",
    "DataCommand", "encode_request", "decode_request", "encode_reply", "decode_reply",
    "encode_data", "decode_data", "content_frames", "encode_string", "encode_table",
    "decode_table", "valid_string", "pack_command_head", "COMMAND_HEAD_SIZE", "CONTENT_TYPE",
    "PING_FRAMES", "PONG_FRAMES", "response_frames", "EMPTY_TABLE",
]

PROTOCOL_NAME = "MTL"
PROTOCOL_VERSION = 1

MAX_REQUEST = 64 * 1024   #: octets of one control request's JSON body peermesh accepts
MAX_RESOURCES = 1024      #: resources one Connection.Reader/Writer may name
MAX_STRING = 0xFF         #: octets of a short string
MAX_TABLE = 0xFFFF        #: octets of an encoded field table
MAX_INTEGER = 0xFFFF_FFFF_FFFF_FFFF

_Q = struct.Struct(">Q")
_H = struct.Struct(">H")
_TYPE_Q = struct.Struct(">BQ")
_PING_HEADER = b"\x08"
_PONG_HEADER = b"\x09"
#: a data command's type and sequence, its first 9 octets (the hot paths' builder:
#: ``struct.Struct.pack``, no range check)
pack_command_head = _TYPE_Q.pack
#: octets of a type and a sequence: a Content header's resource starts here
COMMAND_HEAD_SIZE = _TYPE_Q.size
#: a Content header's first octet
CONTENT_TYPE = b"\x05"
#: the empty field table
EMPTY_TABLE = b"\x00\x00"
#: Ping's and Pong's frames (shared: never change them)
PING_FRAMES = [_PING_HEADER, b""]
PONG_FRAMES = [_PONG_HEADER, b""]


# --- constants ------------------------------------------------------------

class ControlCommand(str, Enum):
    """Control-flow command names, as the spec spells them (matched case-insensitively)."""

    OPEN = "Connection.Open"
    AUTHORIZE = "Connection.Authorize"
    PROFILE = "Connection.Profile"
    READER = "Connection.Reader"
    WRITER = "Connection.Writer"


_COMMAND_BY_NAME = {c.value.lower(): c for c in ControlCommand}


class Status(IntEnum):
    """Status codes of control replies and data-flow Responses."""

    OK = 200
    READY = 201
    DATA_LEASE = 202
    BAD_REQUEST = 400
    UNAUTHORIZED = 401
    CHALLENGED = 402
    FORBIDDEN = 403
    TOO_MANY_REQUESTS = 429
    INTERNAL_ERROR = 500
    NOT_IMPLEMENTED = 501
    SERVICE_UNAVAILABLE = 503


#: the "status" text of each reply (the spec's, and HTTP's where the spec has none)
STATUS_TEXT = {
    200: "OK", 201: "Ready", 202: "Data Lease", 400: "Bad Request", 401: "Unauthorized",
    402: "Challenged", 403: "Forbidden", 429: "Too Many Requests", 500: "Internal Error",
    501: "Not implemented", 503: "Service Unavailable",
}


class Direction(IntEnum):
    """Which way a data lease moves content."""

    READ = 1    #: Connection.Reader: gateway to client
    WRITE = 2   #: Connection.Writer: client to gateway


class DataType(IntEnum):
    """Data command types: the first octet of the header frame."""

    LEASE = 0x01
    RESPONSE = 0x02
    SUMMON = 0x03
    DISMISS = 0x04
    CONTENT = 0x05
    CONFIRM = 0x06
    REJECT = 0x07
    PING = 0x08
    PONG = 0x09


# --- control requests ------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Open:
    """Connection.Open: ``{"protocol": {"name", "version"}, "virtual-host"}``."""

    virtual_host: str
    protocol_name: str = PROTOCOL_NAME
    protocol_version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Authorize:
    """Connection.Authorize: ``{"mechanism", "response": base64}``."""

    mechanism: str
    response: bytes = b""


@dataclass(frozen=True, slots=True)
class SelectProfile:
    """Connection.Profile: ``{"profile"}`` (profile names are case-insensitive)."""

    profile: str


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """Connection.Reader or Connection.Writer: ``{"resources": [...], "confirm"}``.

    ``confirm`` is kept as sent (lower-cased): the profile decides which models
    it implements and answers 501 to the others.
    """

    direction: Direction
    resources: tuple[str, ...] = ()
    confirm: str = "none"


@dataclass(frozen=True, slots=True)
class InvalidRequest:
    """A well-formed request (two frames, a JSON body) that is not valid: answer 400."""

    command: str
    reason: str


Request = Union[Open, Authorize, SelectProfile, LeaseRequest, InvalidRequest]


def _json(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def encode_request(request: Request) -> list[bytes]:
    """The two frames of a control request."""
    if isinstance(request, Open):
        command, body = ControlCommand.OPEN, {
            "protocol": {"name": request.protocol_name, "version": request.protocol_version},
            "virtual-host": request.virtual_host}
    elif isinstance(request, Authorize):
        command, body = ControlCommand.AUTHORIZE, {
            "mechanism": request.mechanism,
            "response": base64.b64encode(request.response).decode("ascii")}
    elif isinstance(request, SelectProfile):
        command, body = ControlCommand.PROFILE, {"profile": request.profile}
    elif isinstance(request, LeaseRequest):
        command = ControlCommand.READER if request.direction == Direction.READ \
            else ControlCommand.WRITER
        body = {"resources": list(request.resources), "confirm": request.confirm}
    else:
        raise TypeError(f"not an MTL request: {request!r}")
    return [command.value.encode("ascii"), _json(body)]


def _two_frames(frames: Sequence[bytes], what: str) -> tuple[bytes, bytes]:
    """Frames 0 and 1 as bytes; ``RemoteProtocolError`` unless there are exactly two byte frames."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        raise RemoteProtocolError(f"an MTL {what} is a list of frames, not one byte string")
    try:
        items = list(frames)
    except TypeError:
        raise RemoteProtocolError(f"an MTL {what} is a list of frames") from None
    if len(items) != 2:
        raise RemoteProtocolError(f"{len(items)} frames; an MTL {what} has exactly 2")
    out = []
    for frame in items:
        if type(frame) is bytes:
            out.append(frame)
        elif isinstance(frame, (bytearray, memoryview)):
            out.append(bytes(frame))
        else:
            raise RemoteProtocolError(f"frame of type {type(frame).__name__}, not bytes")
    return out[0], out[1]


def _json_object(data: bytes, limit: int) -> Any:
    """The JSON value in ``data``; ``RemoteProtocolError`` if it is not JSON or too long."""
    if len(data) > limit:
        raise RemoteProtocolError(f"body of {len(data)} octets exceeds {limit}")
    try:
        return jsonsafe.loads(data, limit)
    except ValueError:
        raise RemoteProtocolError("body is not JSON") from None


class _Invalid(Exception):
    """A field of a well-formed request that is not valid (internal)."""


def _field(body: Mapping[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = body.get(key, default)
    if value is None or type(value) is not kind:
        raise _Invalid(f'"{key}" must be a {kind.__name__}' if key in body
                       else f'"{key}" is missing')
    return value


def valid_string(text: str) -> bool:
    """Whether ``text`` fits a short string: printable, at most 255 UTF-8 octets."""
    return text.isprintable() and len(text.encode("utf-8")) <= MAX_STRING


def _parse_open(body: Mapping[str, Any]) -> Open:
    protocol = _field(body, "protocol", dict)
    name = _field(protocol, "name", str)
    version = protocol.get("version")
    if type(version) is not int:
        raise _Invalid('"protocol" "version" must be an integer')
    return Open(_field(body, "virtual-host", str), name, version)


def _parse_authorize(body: Mapping[str, Any]) -> Authorize:
    mechanism = _field(body, "mechanism", str)
    text = _field(body, "response", str, "")
    try:
        response = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _Invalid('"response" is not base64') from None
    return Authorize(mechanism, response)


def _parse_profile(body: Mapping[str, Any]) -> SelectProfile:
    return SelectProfile(_field(body, "profile", str))


def _parse_lease(direction: Direction, body: Mapping[str, Any]) -> LeaseRequest:
    resources = _field(body, "resources", list, [])
    if len(resources) > MAX_RESOURCES:
        raise _Invalid(f"more than {MAX_RESOURCES} resources")
    for name in resources:
        if type(name) is not str or not name or not valid_string(name):
            raise _Invalid("each resource must be printable text of 1-255 octets")
    if len(set(resources)) != len(resources):
        raise _Invalid("a resource is named twice")
    confirm = _field(body, "confirm", str, "none").lower()
    return LeaseRequest(direction, tuple(resources), confirm)


_PARSE_REQUEST: dict[ControlCommand, Callable[[dict[str, Any]], Request]] = {
    ControlCommand.OPEN: _parse_open,
    ControlCommand.AUTHORIZE: _parse_authorize,
    ControlCommand.PROFILE: _parse_profile,
    ControlCommand.READER: lambda body: _parse_lease(Direction.READ, body),
    ControlCommand.WRITER: lambda body: _parse_lease(Direction.WRITE, body),
}


def decode_request(frames: Sequence[bytes]) -> Request:
    """Parse a control request (without the ROUTER identity).

    Raises ``RemoteProtocolError`` if the request is ill-formed (not two frames, a
    command name that is not printable UTF-8, a body that is not JSON or over
    ``MAX_REQUEST`` octets); returns ``InvalidRequest`` if it is well-formed
    but cannot be accepted.
    """
    name_frame, body_frame = _two_frames(frames, "request")
    try:
        name = name_frame.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("command name is not UTF-8") from None
    if not name or len(name_frame) > MAX_STRING or not name.isprintable():
        raise RemoteProtocolError("command name is not a printable short string")
    body = _json_object(body_frame, MAX_REQUEST)
    command = _COMMAND_BY_NAME.get(name.lower())
    if command is None:
        return InvalidRequest(name, f"unknown command {name!r}")
    if type(body) is not dict:
        return InvalidRequest(command.value, "body is not a JSON object")
    try:
        return _PARSE_REQUEST[command](body)
    except _Invalid as invalid:
        return InvalidRequest(command.value, str(invalid))


# --- control replies -------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ok:
    """200 OK (to Connection.Profile)."""


@dataclass(frozen=True, slots=True)
class Ready:
    """201 Ready: the profiles on offer; SASL's final server data; gateways to fail over to."""

    profiles: tuple[str, ...]
    additional: bytes | None = None
    gateways: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DataLease:
    """202 Data Lease: the data flow's port and the lease to present there."""

    port: int
    lease: str


@dataclass(frozen=True, slots=True)
class Unauthorized:
    """401 Unauthorized: the SASL mechanisms the server accepts (``reason``: why again)."""

    mechanisms: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Challenged:
    """402 Challenged: the next SASL challenge."""

    mechanism: str
    challenge: bytes


@dataclass(frozen=True, slots=True)
class Failure:
    """Any other reply: 400, 403, 429, 500, 501, 503 (``reason`` may be empty)."""

    status: int
    reason: str = ""


Reply = Union[Ok, Ready, DataLease, Unauthorized, Challenged, Failure]


def _status_text(code: int) -> str:
    return STATUS_TEXT.get(code, "Error")


def encode_reply(reply: Reply) -> list[bytes]:
    """The two frames of a control reply."""
    body: dict[str, Any]
    if isinstance(reply, Ok):
        code, body = 200, {}
    elif isinstance(reply, Ready):
        code, body = 201, {"profiles": list(reply.profiles)}
        if reply.additional is not None:
            body["additional"] = base64.b64encode(reply.additional).decode("ascii")
        if reply.gateways:
            body["gateways"] = list(reply.gateways)
    elif isinstance(reply, DataLease):
        code, body = 202, {"port": reply.port, "lease": reply.lease}
    elif isinstance(reply, Unauthorized):
        code, body = 401, {"mechanisms": list(reply.mechanisms)}
        if reply.reason:
            body["reason"] = reply.reason
    elif isinstance(reply, Challenged):
        code, body = 402, {"mechanism": reply.mechanism,
                           "challenge": base64.b64encode(reply.challenge).decode("ascii")}
    elif isinstance(reply, Failure):
        if not 200 <= reply.status <= 599:
            raise EncodeError(f"status {reply.status} is not three digits 2xx-5xx")
        code, body = reply.status, {"reason": reply.reason} if reply.reason else {}
    else:
        raise TypeError(f"not an MTL reply: {reply!r}")
    return [b"%d" % code, _json({"status": _status_text(code), **body})]


def _strings(body: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = body.get(key, [])
    if type(value) is not list or any(type(item) is not str for item in value):
        raise RemoteProtocolError(f'"{key}" is not a list of strings')
    return tuple(value)


def _base64(body: Mapping[str, Any], key: str) -> bytes:
    try:
        return base64.b64decode(body[key], validate=True)
    except (KeyError, TypeError, binascii.Error, ValueError):
        raise RemoteProtocolError(f'"{key}" is not base64') from None


def decode_reply(frames: Sequence[bytes]) -> Reply:
    """Parse a control reply; ``RemoteProtocolError`` if it is malformed."""
    status_frame, body_frame = _two_frames(frames, "reply")
    if len(status_frame) != 3 or not status_frame.isdigit() or not b"2" <= status_frame[:1] <= b"5":
        raise RemoteProtocolError(f"status {status_frame[:8]!r} is not three digits 2xx-5xx")
    code = int(status_frame)
    body = _json_object(body_frame, MAX_REQUEST)
    if type(body) is not dict:
        raise RemoteProtocolError("reply body is not a JSON object")
    if code == 200:
        return Ok()
    if code == 201:
        additional = _base64(body, "additional") if "additional" in body else None
        return Ready(_strings(body, "profiles"), additional, _strings(body, "gateways"))
    if code == 202:
        port, lease = body.get("port"), body.get("lease")
        if type(port) is not int or not 0 < port <= 0xFFFF or type(lease) is not str:
            raise RemoteProtocolError("202 without a port and a lease")
        return DataLease(port, lease)
    reason = body.get("reason", "")
    reason = reason if type(reason) is str else str(reason)
    if code == 401:
        return Unauthorized(_strings(body, "mechanisms"), reason)
    if code == 402:
        mechanism = body.get("mechanism")
        if type(mechanism) is not str:
            raise RemoteProtocolError('402 without a "mechanism"')
        return Challenged(mechanism, _base64(body, "challenge"))
    return Failure(code, reason)


# --- field table ------------------------------------------------------------

def _no_extension(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code}")


def encode_table(table: Mapping[str, Any]) -> bytes:
    """A field table: shortint length + a msgpack map (``00 00`` when empty)."""
    if not table:
        return b"\x00\x00"
    if any(type(key) is not str for key in table):
        raise EncodeError("field table keys must be strings")
    try:
        data = msgpack.packb(dict(table), use_bin_type=True)
    except (TypeError, OverflowError, ValueError) as error:
        raise EncodeError(f"field table value cannot be msgpack: {error}") from None
    if len(data) > MAX_TABLE:
        raise EncodeError(f"field table of {len(data)} octets exceeds {MAX_TABLE}")
    return _H.pack(len(data)) + data


def decode_table(data: bytes) -> dict[str, Any]:
    """The map in a table's octets (without its length); ``RemoteProtocolError`` if malformed."""
    if type(data) is not bytes:
        data = as_bytes(data, "a field table")
    if not data:
        return {}
    try:
        table = msgpack.unpackb(data, raw=False, ext_hook=_no_extension, strict_map_key=True)
    except Exception as error:  # msgpack raises several unrelated types
        raise RemoteProtocolError(f"field table is not msgpack: {type(error).__name__}") from None
    if type(table) is not dict or any(type(key) is not str for key in table):
        raise RemoteProtocolError("field table is not a map with string keys")
    if jsonsafe.depth(table) > jsonsafe.MAX_DEPTH:   # (every table can be sent on again)
        raise RemoteProtocolError(f"field table nests deeper than {jsonsafe.MAX_DEPTH}")
    return table


# --- data commands ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Lease:
    """Lease (0x01): present the lease from a 202 on the data flow."""

    sequence: int
    lease: str


@dataclass(frozen=True, slots=True)
class Response:
    """Response (0x02): the code answering the command with the same sequence."""

    sequence: int
    code: int


@dataclass(frozen=True, slots=True)
class Summon:
    """Summon (0x03): start receiving content from a resource."""

    sequence: int
    resource: str


@dataclass(frozen=True, slots=True)
class Dismiss:
    """Dismiss (0x04): stop receiving content from a resource."""

    sequence: int
    resource: str


@dataclass(frozen=True, slots=True)
class Content:
    """Content (0x05): one piece of content to or from a resource."""

    sequence: int
    resource: str = ""
    body: bytes = b""
    properties: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Confirm:
    """Confirm (0x06): safe receipt of one content, or all up to ``sequence``."""

    sequence: int
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """Reject (0x07): refuse one content or all up to ``sequence``; ``recycle`` re-sends."""

    sequence: int
    multiple: bool = False
    recycle: bool = False


@dataclass(frozen=True, slots=True)
class Ping:
    """Ping (0x08): a heartbeat; answer with Pong."""


@dataclass(frozen=True, slots=True)
class Pong:
    """Pong (0x09): the answer to a Ping."""


DataCommand = Union[Lease, Response, Summon, Dismiss, Content, Confirm, Reject, Ping, Pong]


def encode_string(text: str) -> bytes:
    """A short string: 1 length octet and the UTF-8 text; ``EncodeError`` unless it is
    printable and at most 255 octets."""
    data = text.encode("utf-8")
    if len(data) > MAX_STRING or not text.isprintable():
        raise EncodeError(f"not a short string (printable, at most 255 octets): {text[:40]!r}")
    return bytes((len(data),)) + data


def _integer(kind: int, value: int) -> bytes:
    if not 0 <= value <= MAX_INTEGER:
        raise EncodeError(f"sequence {value} does not fit 64 unsigned bits")
    return _TYPE_Q.pack(kind, value)


def content_frames(sequence: int, resource: bytes, body: bytes, table: bytes = b"\x00\x00"
                   ) -> list[bytes]:
    """A Content command's frames from pre-encoded parts (the hot path).

    ``resource`` is an already length-prefixed short string and ``table`` an
    encoded field table (``encode_table``).
    """
    return [_TYPE_Q.pack(5, sequence) + resource + table, body]


def response_frames(sequence: int, code: int) -> list[bytes]:
    """A Response command's frames (the hot path: ``code`` is not checked)."""
    return [_TYPE_Q.pack(2, sequence), b"%d" % code]


def encode_data(command: DataCommand) -> list[bytes]:
    """The two frames of a data command."""
    if isinstance(command, Content):
        return [_integer(5, command.sequence) + encode_string(command.resource)
                + encode_table(command.properties), command.body]
    if isinstance(command, (Lease, Summon, Dismiss)):
        text = command.lease if isinstance(command, Lease) else command.resource
        kind = 1 if isinstance(command, Lease) else 3 if isinstance(command, Summon) else 4
        return [_integer(kind, command.sequence) + encode_string(text), b""]
    if isinstance(command, Response):
        if not 200 <= command.code <= 599:
            raise EncodeError(f"response code {command.code} is not three digits 2xx-5xx")
        return [_integer(2, command.sequence), b"%d" % command.code]
    if isinstance(command, Confirm):
        return [_integer(6, command.sequence) + bytes((command.multiple,)), b""]
    if isinstance(command, Reject):
        return [_integer(7, command.sequence) + bytes((command.multiple, command.recycle)), b""]
    if isinstance(command, Ping):
        return [_PING_HEADER, b""]
    if isinstance(command, Pong):
        return [_PONG_HEADER, b""]
    raise TypeError(f"not an MTL data command: {command!r}")


def _short_string(header: bytes, pos: int) -> tuple[str, int]:
    """The short string at ``pos`` and the position after it."""
    if pos >= len(header):
        raise RemoteProtocolError("header truncated before a short string")
    end = pos + 1 + header[pos]
    if end > len(header):
        raise RemoteProtocolError("short string runs past the header")
    try:
        text = header[pos + 1:end].decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("short string is not UTF-8") from None
    if not text.isprintable():
        raise RemoteProtocolError("short string has unprintable characters")
    return text, end


def _boolean(octet: int) -> bool:
    if octet > 1:
        raise RemoteProtocolError(f"boolean octet {octet}, expected 0 or 1")
    return octet == 1


def _sized(header: bytes, size: int, name: str) -> None:
    if len(header) != size:
        raise RemoteProtocolError(f"{name} header of {len(header)} octets, expected {size}")


def _sequence(header: bytes) -> int:
    if len(header) < 9:
        raise RemoteProtocolError("header truncated before the sequence")
    return _Q.unpack_from(header, 1)[0]


def decode_data(frames: Sequence[bytes]) -> DataCommand:
    """Parse a data command (without the ROUTER identity); ``RemoteProtocolError`` if ill-formed."""
    if type(frames) is list and len(frames) == 2 and type(frames[0]) is bytes \
            and type(frames[1]) is bytes:
        header, body = frames
    else:
        header, body = _two_frames(frames, "data command")
    if not header:
        raise RemoteProtocolError("empty header frame")
    kind = header[0]
    if kind == 5:
        sequence = _sequence(header)
        resource, pos = _short_string(header, 9)
        if pos + 2 > len(header):
            raise RemoteProtocolError("header truncated before the field table")
        size = _H.unpack_from(header, pos)[0]
        if pos + 2 + size != len(header):
            raise RemoteProtocolError("field table length does not match the header")
        table = decode_table(header[pos + 2:]) if size else {}
        return Content(sequence, resource, body, table)
    if kind in (1, 3, 4):
        sequence = _sequence(header)
        text, pos = _short_string(header, 9)
        if pos != len(header):
            raise RemoteProtocolError("unexpected octets after the header's fields")
        cls = Lease if kind == 1 else Summon if kind == 3 else Dismiss
        return cls(sequence, text)
    if kind == 6:
        _sized(header, 10, "Confirm")
        return Confirm(_sequence(header), _boolean(header[9]))
    if kind == 7:
        _sized(header, 11, "Reject")
        return Reject(_sequence(header), _boolean(header[9]), _boolean(header[10]))
    if kind == 2:
        _sized(header, 9, "Response")
        if len(body) != 3 or not body.isdigit() or not b"2" <= body[:1] <= b"5":
            raise RemoteProtocolError("Response body is not a three-digit code")
        return Response(_sequence(header), int(body))
    if kind == 8:
        _sized(header, 1, "Ping")
        return Ping()
    if kind == 9:
        _sized(header, 1, "Pong")
        return Pong()
    raise RemoteProtocolError(f"unknown data command type {kind:#04x}")
