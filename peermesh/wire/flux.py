"""Flux message codec (RFC 3, ../shared/specs/flux-rfc3.txt): messages as lists of frames.

How it works
------------
A Flux message is one multipart ZeroMQ message; the PROTO frame, always
last, says which other frames are present::

    message  = [routing] [topic] [payload] PROTO
    routing  = *identity delimiter        ; if flag ROUTE (identity: 1*OCTET, delimiter: empty)
    topic    = 1*OCTET                    ; if flag TOPIC, sent without a NUL
    payload  = *OCTET                     ; if flag PAYLOAD

    PROTO    = magic version type flags userid rolemask aux1 aux2     ; 20 octets
    magic    = %x8E
    version  = %x01
    type     = %x01 request / %x02 response / %x04 event / %x08 control
    userid   = 4OCTET / %xFF.FF.FF.FF (unknown)
    rolemask = 4OCTET                    ; owner 1, user 2, local 4, admin 8
    aux1     = request: nodeid (ANY %xFF.FF.FF.FF), response: errnum,
               event: sequence, control: control type
    aux2     = request and response: matchtag (none 0), event: 0, control: status

All numbers are big-endian. This is the 20-byte PROTO of flux-core's current
code; RFC 3's text shows an older 12-byte form without userid and rolemask,
which this codec does not speak. The control type (8) replaced the
keepalive of the RFC's text.

Route frames are kept in wire order: the first is the most recent hop (the
identity a ZeroMQ ROUTER prepends on receipt and strips on send). A message
has no route stack (``routes`` None, flag ROUTE clear) or one, possibly
empty (``()``; libflux sets ROUTE with an empty stack on requests). Events
may carry routes too (a live broker sends them so).

``encode`` builds frames from a message dataclass (``LocalProtocolError`` for a
field the wire cannot carry); ``decode`` parses frames and raises
``RemoteProtocolError`` (never anything else) on malformed input:
a PROTO of another length, magic or version, an unknown type, flags that
announce frames that are not there (or frames no flag announces), an empty
topic, NORESPONSE with STREAMING, a nodeid of NODEID_UPSTREAM (never on the
wire), or a frame that is not bytes.

String and JSON payloads carry a trailing NUL (``string_payload``,
``json_payload`` and their readers); an error response may carry a
NUL-terminated message (``error_message``).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Any, Optional, Sequence, Union

from ..errors import LocalProtocolError, RemoteProtocolError
from . import jsonsafe

__all__ = [
    "MAGIC", "VERSION", "PROTO_SIZE", "NODEID_ANY", "NODEID_UPSTREAM", "USERID_UNKNOWN",
    "MATCHTAG_NONE", "MAX_RANK", "MsgType", "MsgFlag", "Role", "ControlType", "Errno",
    "Request", "Response", "EventMessage", "Control", "Message", "encode", "decode",
    "encode_proto", "decode_proto", "Proto", "string_payload", "read_string",
    "json_payload", "read_json", "error_message", "service_of", "make_request", "make_response",
    "pack_proto", "unpack_proto", "peek_proto", "peek_credentials", "MAGIC_VERSION",
    "FLAG_TOPIC", "FLAG_PAYLOAD", "FLAG_NORESPONSE", "FLAG_ROUTE", "FLAG_UPSTREAM",
    "FLAG_PRIVATE", "FLAG_STREAMING", "FRAME_BITS",
]

MAGIC = 0x8E
VERSION = 0x01
PROTO_SIZE = 20
#: request nodeid: any rank
NODEID_ANY = 0xFFFFFFFF
#: any rank upstream of the sender: an API convenience, never on the wire
NODEID_UPSTREAM = 0xFFFFFFFE
#: the highest rank (2**32 - 3)
MAX_RANK = 0xFFFFFFFD
USERID_UNKNOWN = 0xFFFFFFFF
MATCHTAG_NONE = 0

_PROTO = struct.Struct(">BBBBIIII")
#: a PROTO frame from ``(magic, version, type, flags, userid, rolemask, aux1, aux2)``
#: (the hot paths' builder: ``struct.Struct.pack``, ``struct.error`` out of range)
pack_proto = _PROTO.pack
#: the eight fields of a 20-octet PROTO frame (``struct.error`` for another size)
unpack_proto = _PROTO.unpack
#: what routing reads of a 20-octet PROTO frame: ``(magic << 8 | version, type, flags,
#: aux1, aux2)``; compare the first with ``MAGIC_VERSION``
peek_proto = struct.Struct(">HBB8xII").unpack
#: ``(userid, rolemask)`` of a PROTO frame
peek_credentials = struct.Struct(">4xII").unpack_from
MAGIC_VERSION = MAGIC << 8 | VERSION


class MsgType(IntEnum):
    """PROTO octet 2."""

    REQUEST = 0x01
    RESPONSE = 0x02
    EVENT = 0x04
    CONTROL = 0x08


class MsgFlag(IntFlag):
    """PROTO octet 3."""

    TOPIC = 0x01
    PAYLOAD = 0x02
    NORESPONSE = 0x04
    ROUTE = 0x08
    UPSTREAM = 0x10
    PRIVATE = 0x20
    STREAMING = 0x40
    USER1 = 0x80


#: flags that say which frames are present (the encoder sets them from the fields)
FRAME_FLAGS = MsgFlag.TOPIC | MsgFlag.PAYLOAD | MsgFlag.ROUTE
# MsgFlag bits as plain ints for the hot paths: IntFlag's operators are Python-level calls
FLAG_TOPIC, FLAG_PAYLOAD, FLAG_NORESPONSE, FLAG_ROUTE = 0x01, 0x02, 0x04, 0x08
FLAG_UPSTREAM, FLAG_PRIVATE, FLAG_STREAMING = 0x10, 0x20, 0x40
#: ``FRAME_FLAGS`` as a plain int
FRAME_BITS = 0x0B
_TOPIC, _PAYLOAD, _ROUTE = FLAG_TOPIC, FLAG_PAYLOAD, FLAG_ROUTE
_NORESPONSE_STREAMING = FLAG_NORESPONSE | FLAG_STREAMING
_FRAMES = FRAME_BITS


class Role(IntFlag):
    """The rolemask."""

    NONE = 0
    OWNER = 1
    USER = 2
    LOCAL = 4
    ADMIN = 8


class ControlType(IntEnum):
    """A control message's aux1 (flux-core's overlay control types)."""

    HEARTBEAT = 0
    STATUS = 1
    DISCONNECT = 2


class Errno(IntEnum):
    """The error numbers Flux responses carry here (Linux values)."""

    ENOENT = 2
    EIO = 5
    EAGAIN = 11
    EEXIST = 17
    EINVAL = 22
    ENOSPC = 28
    ENOSYS = 38  # RFC 3 says 39; Linux, libflux and RFC 6 say 38
    ENODATA = 61  # ends a stream normally
    EPROTO = 71
    ETIMEDOUT = 110
    EHOSTUNREACH = 113
    ECANCELED = 125


@dataclass(frozen=True, slots=True)
class Proto:
    """The PROTO frame's fields."""

    type: int
    flags: int
    userid: int = USERID_UNKNOWN
    rolemask: int = 0
    aux1: int = 0
    aux2: int = 0


def encode_proto(proto: Proto) -> bytes:
    """The 20-byte PROTO frame; ``LocalProtocolError`` for a field out of range."""
    try:
        return _PROTO.pack(MAGIC, VERSION, proto.type, proto.flags, proto.userid,
                           proto.rolemask, proto.aux1, proto.aux2)
    except struct.error as exc:
        raise LocalProtocolError(f"PROTO field out of range: {exc}") from None


def decode_proto(frame: bytes) -> Proto:
    """The fields of a PROTO frame; ``RemoteProtocolError`` unless 20 bytes, magic 0x8E,
    version 1."""
    if type(frame) is not bytes:
        frame = _as_bytes(frame)
    if len(frame) != PROTO_SIZE:
        raise RemoteProtocolError(f"PROTO frame of {len(frame)} octets, not {PROTO_SIZE}")
    magic, version, kind, flags, userid, rolemask, aux1, aux2 = _PROTO.unpack(frame)
    if magic != MAGIC:
        raise RemoteProtocolError(f"PROTO magic {magic:#04x}, not 0x8e")
    if version != VERSION:
        raise RemoteProtocolError(f"PROTO version {version}, not 1")
    return Proto(kind, flags, userid, rolemask, aux1, aux2)


Routes = Optional[tuple[bytes, ...]]


@dataclass(frozen=True, slots=True)
class Request:
    """A request to ``nodeid`` (``NODEID_ANY``: any rank) for ``topic`` (``service.method``)."""

    topic: str
    payload: Optional[bytes] = None
    nodeid: int = NODEID_ANY
    matchtag: int = MATCHTAG_NONE
    flags: int = 0  #: ``MsgFlag`` bits besides TOPIC, PAYLOAD and ROUTE
    routes: Routes = None
    userid: int = USERID_UNKNOWN
    rolemask: int = 0


@dataclass(frozen=True, slots=True)
class Response:
    """A response; ``errnum`` 0 is success, ENODATA ends a stream."""

    topic: str
    payload: Optional[bytes] = None
    errnum: int = 0
    matchtag: int = MATCHTAG_NONE
    flags: int = 0
    routes: Routes = None
    userid: int = USERID_UNKNOWN
    rolemask: int = 0


@dataclass(frozen=True, slots=True)
class EventMessage:
    """An event, numbered by rank 0 (``seq`` from 1)."""

    topic: str
    payload: Optional[bytes] = None
    seq: int = 0
    flags: int = 0
    routes: Routes = None
    userid: int = USERID_UNKNOWN
    rolemask: int = 0


@dataclass(frozen=True, slots=True)
class Control:
    """An overlay control message (heartbeat, status, disconnect): PROTO only, as a rule."""

    ctype: int = ControlType.HEARTBEAT
    status: int = 0
    flags: int = 0
    routes: Routes = None
    topic: Optional[str] = None
    payload: Optional[bytes] = None
    userid: int = USERID_UNKNOWN
    rolemask: int = 0


Message = Union[Request, Response, EventMessage, Control]


def _maker(cls: type) -> Any:
    """A constructor of ``cls`` taking every field in order, with no defaults or checks:
    it fills the slots directly (a frozen dataclass's ``__init__`` goes through
    ``object.__setattr__`` once per field, several times dearer). For decoders and
    routers that have every field at hand."""
    fields = list(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls}
    scope.update({f"set_{f}": cls.__dict__[f].__set__ for f in fields})
    body = "".join(f"    set_{f}(m, {f})\n" for f in fields)
    exec(f"def make({', '.join(fields)}):\n    m = new(cls)\n{body}    return m\n", scope)
    make = scope["make"]
    make.__doc__ = f"A {cls.__name__} from all its fields, in order (unchecked)."
    return make


#: ``make_request(topic, payload, nodeid, matchtag, flags, routes, userid, rolemask)``
make_request = _maker(Request)
#: ``make_response(topic, payload, errnum, matchtag, flags, routes, userid, rolemask)``
make_response = _maker(Response)


def encode(message: Message) -> list[bytes]:
    """The frames of ``message``; ``LocalProtocolError`` for fields the wire cannot carry."""
    kind = type(message)
    if kind is Request:
        if message.nodeid == NODEID_UPSTREAM:  # type: ignore[union-attr]
            raise LocalProtocolError("nodeid NODEID_UPSTREAM never appears on the wire")
        code, aux1, aux2 = 1, message.nodeid, message.matchtag  # type: ignore[union-attr]
    elif kind is Response:
        code, aux1, aux2 = 2, message.errnum, message.matchtag  # type: ignore[union-attr]
    elif kind is EventMessage:
        code, aux1, aux2 = 4, message.seq, 0  # type: ignore[union-attr]
    elif kind is Control:
        code, aux1, aux2 = 8, message.ctype, message.status  # type: ignore[union-attr]
    else:
        raise LocalProtocolError(f"{kind.__name__} is not a Flux message")
    flags = message.flags
    if type(flags) is not int:
        flags = int(flags)
    flags &= ~_FRAMES
    if flags & _NORESPONSE_STREAMING == _NORESPONSE_STREAMING:
        raise LocalProtocolError("NORESPONSE with STREAMING is invalid")
    routes = message.routes
    if routes is not None:
        flags |= _ROUTE
        for route in routes:
            if type(route) is not bytes or not route:
                raise LocalProtocolError("a route identity is a non-empty bytes frame")
        frames = [*routes, b""]
    else:
        frames = []
    topic = message.topic
    if topic is not None:
        if not topic:
            raise LocalProtocolError("topic is empty")
        flags |= _TOPIC
        frames.append(topic.encode())
    payload = message.payload
    if payload is not None:
        if type(payload) is not bytes:
            raise LocalProtocolError("payload is not bytes")
        flags |= _PAYLOAD
        frames.append(payload)
    try:
        frames.append(_PROTO.pack(MAGIC, VERSION, code, flags, message.userid, message.rolemask,
                                  aux1, aux2))
    except struct.error as exc:
        raise LocalProtocolError(f"PROTO field out of range: {exc}") from None
    return frames


def decode(frames: Sequence[bytes]) -> Message:
    """Parse one Flux message; ``RemoteProtocolError`` (only) if it is malformed."""
    if type(frames) is not list:
        frames = _as_frames(frames)
    else:
        for frame in frames:
            if type(frame) is not bytes:
                frames = _as_frames(frames)
                break
    if not frames:
        raise RemoteProtocolError("no frames: a Flux message ends with a PROTO frame")
    last = frames[-1]
    if len(last) != PROTO_SIZE:
        raise RemoteProtocolError(f"PROTO frame of {len(last)} octets, not {PROTO_SIZE}")
    magic, version, kind, flags, userid, rolemask, aux1, aux2 = _PROTO.unpack(last)
    if magic != MAGIC:
        raise RemoteProtocolError(f"PROTO magic {magic:#04x}, not 0x8e")
    if version != VERSION:
        raise RemoteProtocolError(f"PROTO version {version}, not 1")
    pos, end = 0, len(frames) - 1
    routes: Routes = None
    if flags & _ROUTE:
        try:
            delimiter = frames.index(b"", 0, end)
        except ValueError:
            raise RemoteProtocolError("flag ROUTE without a route delimiter frame") from None
        routes = tuple(frames[:delimiter])
        pos = delimiter + 1
    topic: Optional[str] = None
    if flags & _TOPIC:
        if pos >= end:
            raise RemoteProtocolError("flag TOPIC without a topic frame")
        raw = frames[pos]
        if not raw:
            raise RemoteProtocolError("topic frame is empty")
        try:
            topic = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError("topic is not UTF-8") from None
        pos += 1
    payload: Optional[bytes] = None
    if flags & _PAYLOAD:
        if pos >= end:
            raise RemoteProtocolError("flag PAYLOAD without a payload frame")
        payload = frames[pos]
        pos += 1
    if pos != end:
        raise RemoteProtocolError(f"{end - pos} frames that no flag announces")
    if flags & _NORESPONSE_STREAMING == _NORESPONSE_STREAMING:
        raise RemoteProtocolError("NORESPONSE with STREAMING is invalid")
    other = flags & ~_FRAMES
    if kind == 1:
        if topic is None:
            raise RemoteProtocolError("a request has no topic")
        if aux1 == NODEID_UPSTREAM:
            raise RemoteProtocolError("nodeid NODEID_UPSTREAM never appears on the wire")
        return make_request(topic, payload, aux1, aux2, other, routes, userid, rolemask)
    if kind == 2:
        if topic is None:
            raise RemoteProtocolError("a response has no topic")
        return make_response(topic, payload, aux1, aux2, other, routes, userid, rolemask)
    if kind == 4:
        if topic is None:
            raise RemoteProtocolError("an event has no topic")
        return EventMessage(topic, payload, aux1, other, routes, userid, rolemask)
    if kind == 8:
        return Control(aux1, aux2, other, routes, topic, payload, userid, rolemask)
    raise RemoteProtocolError(f"message type {kind:#04x} is not request, response, event or "
                              "control")


def _as_bytes(frame: Any) -> bytes:
    if type(frame) is bytes:
        return frame
    if isinstance(frame, (bytearray, memoryview)):
        return bytes(frame)
    raise RemoteProtocolError(f"frame of type {type(frame).__name__}, not bytes")


def _as_frames(frames: Any) -> list[bytes]:
    """``frames`` as a list of bytes; ``RemoteProtocolError`` if it is not a list of frames."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        raise RemoteProtocolError("a Flux message is a list of frames, not one byte string")
    try:
        items = list(frames)
    except TypeError:
        raise RemoteProtocolError("a Flux message is a list of frames") from None
    return [_as_bytes(frame) for frame in items]


# --- payload conventions ------------------------------------------------------


def string_payload(text: str) -> bytes:
    """A string payload: UTF-8 with the terminating NUL."""
    return text.encode("utf-8") + b"\0"


def read_string(payload: Optional[bytes]) -> str:
    """The string in a payload; ``RemoteProtocolError`` without its terminating NUL."""
    if type(payload) is not bytes and payload is not None:
        payload = _as_bytes(payload)
    if not payload or payload[-1:] != b"\0":
        raise RemoteProtocolError("a string payload ends with a NUL")
    try:
        return payload[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("string payload is not UTF-8") from None


def json_payload(obj: Any) -> bytes:
    """A JSON payload (an object, RFC 3) with the terminating NUL; else ``LocalProtocolError``."""
    if not isinstance(obj, dict):
        raise LocalProtocolError(f"a JSON payload is an object, not {type(obj).__name__}")
    return json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\0"


#: characters of a JSON payload ``read_json`` decodes (a node's messages are bounded too)
MAX_JSON = 16 * 1024 * 1024


def read_json(payload: Optional[bytes]) -> dict[str, Any]:
    """The JSON object in a payload; ``RemoteProtocolError`` if it is none, lacks its NUL, is
    over ``MAX_JSON`` or nests deeper than ``jsonsafe.MAX_DEPTH``."""
    text = read_string(payload)
    try:
        obj = jsonsafe.loads(text, MAX_JSON)
    except ValueError as exc:
        raise RemoteProtocolError(f"payload is not JSON: {str(exc)[:80]}") from None
    if not isinstance(obj, dict):
        raise RemoteProtocolError(f"JSON payload is {type(obj).__name__}, not an object")
    return obj


def error_message(payload: Optional[bytes]) -> str:
    """The message of an error response ('' if none); lenient about the NUL."""
    if not payload:
        return ""
    return payload.rstrip(b"\0").decode("utf-8", "replace")


def service_of(topic: str) -> str:
    """The service a topic names: its first word (``kvs`` of ``kvs.get``)."""
    return topic.partition(".")[0]
