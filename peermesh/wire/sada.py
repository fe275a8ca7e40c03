"""Safir-Darbaan codec (PIRAN/Safir-Darbaan v1, ``SADA1``): INTR, RINTR, REQ, REP, PING, PONG.

How it works
------------
Both ends of a Safir-Darbaan conversation are ZeroMQ ROUTER sockets: a
channel binds one whose identity is its public endpoint, servers connect to
channels with transient ROUTERs. The spec draws every command as the frames
an application hands to, or gets from, its ROUTER::

    frame 0: identity of the peer's ROUTER socket    <- routing id, not part of this codec
    frame 1: empty frame                             <- delimiter, on the wire
    frame 2: "SADA1"                                 <- protocol name and version
    frame 3: "INTR" | "RINTR" | "REQ" | "REP" | "PING" | "PONG"
    frame 4...: the command's fields, one per frame

On ROUTER to ROUTER this means: the sender passes ``[peer-identity, b"",
b"SADA1", command, ...]`` to its ROUTER, which uses frame 0 to pick the
connection and removes it; ``[b"", b"SADA1", command, ...]`` crosses the
wire; the receiving ROUTER prepends the identity of the connection it came
from. Frame 0 is therefore the *peer* (the destination when sending, the
origin when receiving) and is the transport's business. This codec encodes
and decodes frames 1 onwards: ``encode`` returns them starting with the empty
delimiter, and ``decode`` expects them so.

Decisions where the draft is loose:

* The signature frame is the five ASCII octets ``SADA1``, as every frame
  drawing shows. The prose ("SADA" followed by one byte, e.g. 0x01) reads as
  ``SADA%x01``; ``decode`` accepts that spelling too, ``encode`` never writes it.
* Text frames (service name and version, action category and name) are UTF-8
  of at most 255 octets. Service names, versions and action names must not be
  empty; an action category may be (it means "no category").
* A request id is opaque octets (1 to 255); peermesh channels write ASCII.
* The REP status is the HTTP status code as three ASCII digits (``200``),
  like the other text frames; 100-599 are accepted.
* A command with more or fewer frames than its drawing, an unknown command
  name, or anything before the signature other than the empty delimiter is
  invalid: ``decode`` raises ``RemoteProtocolError`` (and nothing else) for it.

An encoder refuses a value the wire cannot carry with ``EncodeError`` (a
``LocalProtocolError`` that is also a ``ValueError``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Sequence, Union

from ..errors import RemoteProtocolError
from .frames import EncodeError, as_frames

__all__ = [
    "PROTOCOL", "DELIMITER", "MAX_TEXT", "MAX_REQUEST_ID", "Command", "Status", "ServiceId",
    "Intr", "Rintr", "Req", "Rep", "Ping", "Pong", "Message", "encode", "decode",
    "encode_req", "encode_rep", "status_frame", "command_of", "parse_req", "parse_rep",
]

#: frame 2 of every command: protocol name and version
PROTOCOL = b"SADA1"
#: the prose's spelling of the same signature ("SADA" then the octet %x01); accepted on input
PROTOCOL_ALT = b"SADA\x01"
#: frame 1: the empty delimiter between the routing id and the command
DELIMITER = b""
#: longest service name, version, category or action name, in UTF-8 octets
MAX_TEXT = 255
#: longest request id, in octets
MAX_REQUEST_ID = 255


class Command(str, Enum):
    """Frame 3: the command name."""

    INTR = "INTR"      #: server -> channel: the server's service catalog
    RINTR = "RINTR"    #: channel -> server: "introduce yourself again" (after a restart)
    REQ = "REQ"        #: channel -> server: a request
    REP = "REP"        #: server -> channel: the reply to one request
    PING = "PING"      #: channel -> server: are you there?
    PONG = "PONG"      #: server -> channel: yes

    @property
    def frame(self) -> bytes:
        """The command as it appears in frame 3."""
        return _COMMAND_FRAMES[self]


class Status(IntEnum):
    """REP status codes (HTTP's) that peermesh gives a meaning; any 100-599 may travel."""

    OK = 200                      #: the handler's result is the payload
    BAD_REQUEST = 400             #: the request payload could not be decoded (not msgpack)
    UNKNOWN_SERVICE = 404         #: the server offers no service of that name
    UNKNOWN_ACTION = 405          #: the service version has no such category/action
    UNKNOWN_VERSION = 406         #: the service exists, but no version is compatible
    INTERNAL_ERROR = 500          #: the handler raised; the payload is the message (UTF-8)
    UNAVAILABLE = 503             #: the server did not run the request (stopping, too busy)


_COMMAND_FRAMES = {c: c.value.encode("ascii") for c in Command}
_STATUS_FRAMES = {code: str(code).encode("ascii") for code in range(100, 600)}
_STATUS_VALUES = {frame: code for code, frame in _STATUS_FRAMES.items()}


def status_frame(status: int) -> bytes:
    """Frame 5 of a REP: the status as three ASCII digits; ``EncodeError`` outside 100-599."""
    try:
        return _STATUS_FRAMES[status]
    except (KeyError, TypeError):
        raise EncodeError(f"status must be an HTTP status code 100-599, not {status!r}") from None


# --- messages ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceId:
    """One pair of "service frames": a service name and its version."""

    name: str
    version: str


@dataclass(frozen=True, slots=True)
class Intr:
    """Server -> channel: the service catalog.

    ===INTR Command Message===
    - frame 0: identity of the server router socket
    - frame 1: empty frame
    - frame 2: "SADA1" #indicate the protocol name and version
    - frame 3: "INTR" #indicate the command type
    - frame 4: "example-service" #name of the service
    - frame 5: "1.2" #version of the example-service
    - frame 6: "another-service"
    - frame 7: "1" ...
    """

    services: tuple[ServiceId, ...] = ()


@dataclass(frozen=True, slots=True)
class Rintr:
    """Channel -> server: please INTR again.

    ===RINTR Command Message===
    - frame 0: identity of the channel router socket
    - frame 1: empty frame
    - frame 2:"SADA1" #indicate the protocol name and version
    - frame 3: "RINTR" #indicate the command type
    """


@dataclass(frozen=True, slots=True)
class Req:
    """Channel -> server: one request.

    ===REQ Command Message===
    - frame 0 : identity of the server router socket
    - frame 1: empty frame
    - frame 2: "SADA1" #indicate the protocol name and version
    - frame 3: "REQ" #indicate the command type
    - frame 4: "12345678" #request id
    - frame 5: "customer-management" #name of the service
    - frame 6: "1" #version of the service
    - frame 7: "customer" #category of the action
    - frame 8: "registerNewCustomer" #action name
    - frame 9: [byte array] #request payload
    """

    request_id: bytes
    service: str
    version: str
    category: str
    action: str
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class Rep:
    """Server -> channel: the reply to one request.

    ===REP Command Message===
    - frame 0 : identity of the server router socket
    - frame 1: empty frame
    - frame 2: "SADA1" #indicate the protocol name and version
    - frame 3: "REP" #indicate the command type
    - frame 4: "12345678" #request id which indicate this response correlated to which request
    - frame 5: 200 #status code
    - frame 6: [byte array] #reply payload
    """

    request_id: bytes
    status: int
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class Ping:
    """Channel -> server, on silence.

    ===PING Command Message===
    - frame 0 : identity of the server router socket
    - frame 1: empty frame
    - frame 2: "SADA1" #indicate the protocol name and version
    - frame 3: "PING" #indicate the command type
    """


@dataclass(frozen=True, slots=True)
class Pong:
    """Server -> channel: the answer to PING.

    ===PONG Command Message===
    - frame 0 : identity of the server router socket
    - frame 1: empty frame
    - frame 2: "SADA1" #indicate the protocol name and version
    - frame 3: "PONG" #indicate the command type
    """


Message = Union[Intr, Rintr, Req, Rep, Ping, Pong]

_INTR, _RINTR, _REQ, _REP, _PING, _PONG = (_COMMAND_FRAMES[c] for c in Command)
_HEAD = {c: [DELIMITER, PROTOCOL, _COMMAND_FRAMES[c]] for c in Command}


# --- encoding ---------------------------------------------------------------


def _text(kind: str, value: str, empty_ok: bool = False) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"{kind} must be a str, not {type(value).__name__}")
    data = value.encode("utf-8")
    if len(data) > MAX_TEXT:
        raise EncodeError(f"{kind} {value[:40]!r} is {len(data)} UTF-8 octets; the limit is "
                          f"{MAX_TEXT}")
    if not data and not empty_ok:
        raise EncodeError(f"{kind} must not be empty")
    return data


def _request_id(value: bytes) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"request id must be bytes, not {type(value).__name__}")
    value = bytes(value)
    if not 0 < len(value) <= MAX_REQUEST_ID:
        raise EncodeError(f"request id must be 1-{MAX_REQUEST_ID} octets, not {len(value)}")
    return value


def _payload(value: bytes) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"payload must be bytes, not {type(value).__name__}")


def encode_req(request_id: bytes, service: str, version: str, category: str, action: str,
               payload: bytes) -> list[bytes]:
    """Frames 1-9 of a REQ (see ``Req``)."""
    return [DELIMITER, PROTOCOL, _REQ, _request_id(request_id), _text("service name", service),
            _text("service version", version), _text("action category", category, True),
            _text("action name", action), _payload(payload)]


def encode_rep(request_id: bytes, status: int, payload: bytes) -> list[bytes]:
    """Frames 1-6 of a REP (see ``Rep``)."""
    return [DELIMITER, PROTOCOL, _REP, _request_id(request_id), status_frame(status),
            _payload(payload)]


def encode(message: Message) -> list[bytes]:
    """The frames of ``message`` after the routing id: delimiter, signature, command, fields."""
    if isinstance(message, Req):
        return encode_req(message.request_id, message.service, message.version,
                          message.category, message.action, message.payload)
    if isinstance(message, Rep):
        return encode_rep(message.request_id, message.status, message.payload)
    if isinstance(message, Intr):
        frames = [DELIMITER, PROTOCOL, _INTR]
        for service in message.services:
            if not isinstance(service, ServiceId):
                raise TypeError(f"INTR services must be ServiceId, not {type(service).__name__}")
            frames.append(_text("service name", service.name))
            frames.append(_text("service version", service.version))
        return frames
    for kind, command in ((Ping, Command.PING), (Pong, Command.PONG), (Rintr, Command.RINTR)):
        if isinstance(message, kind):
            return list(_HEAD[command])
    raise TypeError(f"not a Safir-Darbaan message: {message!r}")


# --- decoding ---------------------------------------------------------------


def _decode_text(kind: str, data: bytes, empty_ok: bool = False) -> str:
    if len(data) > MAX_TEXT:
        raise RemoteProtocolError(f"{kind} of {len(data)} octets exceeds {MAX_TEXT}")
    if not data and not empty_ok:
        raise RemoteProtocolError(f"empty {kind}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"{kind} is not valid UTF-8") from None


def _decode_request_id(data: bytes) -> bytes:
    if not 0 < len(data) <= MAX_REQUEST_ID:
        raise RemoteProtocolError(f"request id of {len(data)} octets (must be 1-{MAX_REQUEST_ID})")
    return data


def _decode_status(data: bytes) -> int:
    if len(data) != 3 or not data.isdigit():
        raise RemoteProtocolError(f"status frame {data[:8]!r} is not three ASCII digits")
    status = int(data)
    if not 100 <= status <= 599:
        raise RemoteProtocolError(f"status {status} is outside 100-599")
    return status


def _count(command: str, frames: Sequence[bytes], fields: int) -> None:
    if len(frames) != 3 + fields:
        raise RemoteProtocolError(f"{command} has {len(frames) - 3} field frames, "
                                  f"expected {fields}")


def decode(frames: Sequence[bytes]) -> Message:
    """Parse one command from its frames after the routing id (delimiter first).

    Raises ``RemoteProtocolError`` with a reason for anything that is not a valid
    SADA1 command, and no other exception.
    """
    if type(frames) is not list or not all(type(f) is bytes for f in frames):
        frames = as_frames(frames, "a SADA1 command")
    command = command_of(frames)
    if command == _REQ:
        return Req(*parse_req(frames))
    if command == _REP:
        return Rep(*parse_rep(frames))
    if command == _INTR:
        if len(frames) % 2 == 0:
            raise RemoteProtocolError("INTR has an odd number of service frames")
        return Intr(tuple(ServiceId(_decode_text("service name", frames[i]),
                                    _decode_text("service version", frames[i + 1]))
                          for i in range(3, len(frames), 2)))
    if command == _PING:
        _count("PING", frames, 0)
        return Ping()
    if command == _PONG:
        _count("PONG", frames, 0)
        return Pong()
    if command == _RINTR:
        _count("RINTR", frames, 0)
        return Rintr()
    raise RemoteProtocolError(f"unknown command {command[:16]!r}")


# The two commands every request crosses get parsers that return plain tuples:
# the fields of ``Req`` and ``Rep`` in order, with exactly ``decode``'s checks.


def command_of(frames: list[bytes]) -> bytes:
    """Frame 3 (the command name) once frames 1 and 2 are checked; ``RemoteProtocolError``
    if not."""
    if len(frames) < 3:
        raise RemoteProtocolError(f"{len(frames)} frames: too short for a SADA1 command")
    if frames[0]:
        raise RemoteProtocolError("frame 1 is not the empty delimiter")
    signature = frames[1]
    if signature != PROTOCOL and signature != PROTOCOL_ALT:
        if signature[:4] == b"SADA":
            raise RemoteProtocolError(f"unsupported protocol version {signature[4:]!r}")
        raise RemoteProtocolError(f"not a SADA1 command (signature {signature[:8]!r})")
    return frames[2]


def parse_req(frames: list[bytes]) -> tuple[bytes, str, str, str, str, bytes]:
    """The fields of a REQ whose frames 1-3 are known good (``command_of``) as a tuple."""
    if len(frames) != 9:
        _count("REQ", frames, 6)
    rid, service, version, category, action = frames[3], frames[4], frames[5], frames[6], \
        frames[7]
    if (0 < len(rid) <= MAX_REQUEST_ID and 0 < len(service) <= MAX_TEXT
            and 0 < len(version) <= MAX_TEXT and len(category) <= MAX_TEXT
            and 0 < len(action) <= MAX_TEXT):
        try:
            return (rid, service.decode("utf-8"), version.decode("utf-8"),
                    category.decode("utf-8"), action.decode("utf-8"), frames[8])
        except UnicodeDecodeError:
            pass
    # something is wrong: let the careful path say what
    return (_decode_request_id(rid), _decode_text("service name", service),
            _decode_text("service version", version),
            _decode_text("action category", category, True), _decode_text("action name", action),
            frames[8])


def parse_rep(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """The fields of a REP whose frames 1-3 are known good (``command_of``) as a tuple."""
    if len(frames) != 6:
        _count("REP", frames, 3)
    status = _STATUS_VALUES.get(frames[4])
    if status is None:
        status = _decode_status(frames[4])
    return _decode_request_id(frames[3]), status, frames[5]
