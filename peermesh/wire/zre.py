"""ZRE v2 codec (spec 36/ZRE): the UDP beacon, the seven mailbox commands and Zyre's three.

How it works
------------
A mailbox message is a list of ZeroMQ frames. Frame 0 holds the command::

    signature %xAA %xA1 | id (1 octet) | version %x02 | sequence (2 octets) | fields

and WHISPER and SHOUT carry their content as the frames after it
(``msg = *frame``). Field types, all numbers unsigned in network order::

    string     = number-1 *VCHAR          ; length in UTF-8 octets, at most 255
    longstr    = number-4 *VCHAR
    strings    = number-4 *longstr        ; a list of strings
    dictionary = number-4 *(string longstr)

``encode`` turns a message dataclass into frames and ``decode`` does the
reverse. Every malformed input makes ``decode`` raise ``RemoteProtocolError`` and
nothing else. Command ids this codec does not know decode to ``Unknown`` so
the caller can still honour the sequence number. An encoder refuses a value
the wire cannot carry with ``EncodeError`` (a ``LocalProtocolError`` that is
also a ``ValueError``).

Zyre adds three commands beyond the spec (its leader election and, for its
gossip discovery, a goodbye)::

    elect      = signature %d8 version sequence group challenger
    leader     = signature %d9 version sequence group leader
    goodbye    = signature %d10 version sequence
    challenger = string                   ; a node's UUID, 32 upper-case hex digits
    leader     = string                   ; the same, of the elected node

peermesh adds one command of its own, PEX (id %x50), sent only to peers that
advertise ``X-PM-PEX`` in their HELLO headers (plain Zyre and pyre peers never
see it)::

    pex        = signature %x50 version sequence peers
    peers      = strings                  ; each "UUID-hex SP endpoint"
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Callable, Mapping, Optional, Sequence, Union
from uuid import UUID

from ..errors import RemoteProtocolError
from .frames import EncodeError, as_bytes, as_frames

__all__ = [
    "BEACON_SIZE", "BEACON_SIZE_V3", "SIGNATURE", "VERSION", "Command", "Beacon", "Hello", "Whisper",
    "Shout", "Join", "Leave", "Ping", "PingOk", "Elect", "Leader", "Goodbye", "Unknown",
    "Message",
    "encode_beacon", "decode_beacon", "encode", "decode", "whisper_header",
    "shout_header", "shouts", "next_sequence", "PeerExchange", "PEX", "PUBLIC_KEY_HEADER",
    "uuid_of", "decode_beacon_cached", "peek_header", "pack_header", "WHISPER_PREFIX",
    "SHOUT_PREFIX",
]

# Beacon: 'Z' 'R' 'E' %x01 | UUID (16 octets) | port (2 octets)
# Zyre's CURVE beacon: 'Z' 'R' 'E' %x03 | UUID | port | public key (32 octets)
BEACON_PREFIX = b"ZRE\x01"
BEACON_PREFIX_V3 = b"ZRE\x03"
BEACON_SIZE = 22
BEACON_SIZE_V3 = 54
_BEACON = struct.Struct(">4s16sH")
_BEACON_V3 = struct.Struct(">4s16sH32s")

SIGNATURE = 0xAAA1
VERSION = 2
_HEADER = struct.Struct(">HBBH")  # signature, id, version, sequence
_HEADER_SIZE = _HEADER.size
#: frame 0's header as ``(signature, id, version, sequence)``, fields may follow it
#: (the hot paths' reader: ``struct.Struct.unpack_from``, no Python call of its own)
peek_header = _HEADER.unpack_from
#: frame 0's header from ``(signature, id, version, sequence)`` (the hot paths' builder)
pack_header = _HEADER.pack
#: the first four octets (signature, id, version) of a WHISPER's and a SHOUT's frame 0
WHISPER_PREFIX = b"\xaa\xa1\x02\x02"
SHOUT_PREFIX = b"\xaa\xa1\x03\x02"
#: ``whisper_header(sequence)``: frame 0 of a WHISPER (the content frames follow it); the
#: fixed prefix bound to a ``struct`` packer, so building it costs no Python call (it is
#: built once per message sent)
whisper_header: Callable[[int], bytes] = functools.partial(struct.Struct(">4sH").pack,
                                                           WHISPER_PREFIX)
_N1 = struct.Struct(">B")
_N4 = struct.Struct(">I")
MAX_STRING = 0xFF
MAX_LONGSTR = 0xFFFFFFFF


#: command id of peermesh's peer-exchange extension
PEX = 0x50
#: HELLO header of a node with a CURVE keypair (Zyre's): its public key in Z85
PUBLIC_KEY_HEADER = "X-PUBLICKEY"


class Command(IntEnum):
    """ZRE command identifiers."""

    HELLO = 1
    WHISPER = 2
    SHOUT = 3
    JOIN = 4
    LEAVE = 5
    PING = 6
    PING_OK = 7
    ELECT = 8     #: Zyre's leader election: a wave for a challenger
    LEADER = 9    #: Zyre's leader election: the result
    GOODBYE = 10  #: Zyre: the sender is leaving (sent with its gossip discovery)


def next_sequence(sequence: int) -> int:
    """The sequence number after ``sequence``: cyclic over 0..65535."""
    return (sequence + 1) & 0xFFFF


# --- beacon ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Beacon:
    """A discovery beacon. Port 0 means the sender is leaving the network.

    ``key``: the sender's CURVE public key (32 octets) in a version-3 beacon
    (Zyre's, from a node with a keypair); None in a version-1 beacon.
    """

    uuid: bytes
    port: int
    key: Optional[bytes] = None


def encode_beacon(beacon: Beacon) -> bytes:
    """The 22-octet beacon for ``beacon``, or the 54-octet version 3 with its key."""
    if len(beacon.uuid) != 16:
        raise EncodeError("beacon UUID must be 16 bytes")
    if not 0 <= beacon.port <= 0xFFFF:
        raise EncodeError("beacon port must fit in 16 bits")
    if beacon.key is None:
        return _BEACON.pack(BEACON_PREFIX, beacon.uuid, beacon.port)
    if len(beacon.key) != 32:
        raise EncodeError("beacon key must be 32 bytes")
    return _BEACON_V3.pack(BEACON_PREFIX_V3, beacon.uuid, beacon.port, beacon.key)


def decode_beacon(data: bytes, version: int = 1) -> Beacon:
    """Parse a beacon of ``version``: 1 (22 octets, a plain node's) or 3 (54 octets, with
    the key: a node with a keypair hears only these, as in Zyre); anything else raises
    ``RemoteProtocolError``."""
    if type(data) is not bytes:
        data = as_bytes(data, "a beacon")
    if version == 3:
        if len(data) != BEACON_SIZE_V3:
            raise RemoteProtocolError(f"beacon of {len(data)} octets, expected {BEACON_SIZE_V3} "
                                      "(version 3, with a key)")
        prefix, uuid, port, key = _BEACON_V3.unpack(data)
        if prefix != BEACON_PREFIX_V3:
            raise RemoteProtocolError("beacon header is not 'ZRE' %x03")
        return Beacon(uuid, port, key)
    if version != 1:
        raise ValueError("beacon version must be 1 or 3")
    if len(data) != BEACON_SIZE:
        raise RemoteProtocolError(f"beacon of {len(data)} octets, expected {BEACON_SIZE}")
    prefix, uuid, port = _BEACON.unpack(data)
    if prefix != BEACON_PREFIX:
        raise RemoteProtocolError("beacon header is not 'ZRE' %x01")
    return Beacon(uuid, port)


@functools.lru_cache(maxsize=1024)
def decode_beacon_cached(data: bytes, version: int = 1) -> Beacon:
    """``decode_beacon`` of a ``bytes`` datagram, remembered for the whole process (a
    node hears each peer's same beacon every interval, and where many nodes share a
    process each of them hears every other's; beacons are immutable)."""
    return decode_beacon(data, version)


@functools.lru_cache(maxsize=4096)
def uuid_of(raw: bytes) -> UUID:
    """``UUID(bytes=raw)`` for the 16 octets of a beacon or a routing identity,
    remembered for the whole process (UUIDs are immutable)."""
    return UUID(bytes=raw)


# --- commands -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Hello:
    """hello = signature %d1 version sequence endpoint groups status name headers"""

    sequence: int
    endpoint: str
    groups: tuple[str, ...] = ()
    status: int = 0
    name: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Whisper:
    """whisper = signature %d2 version sequence content"""

    sequence: int
    content: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Shout:
    """shout = signature %d3 version sequence group content"""

    sequence: int
    group: str
    content: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Join:
    """join = signature %d4 version sequence group status"""

    sequence: int
    group: str
    status: int


@dataclass(frozen=True, slots=True)
class Leave:
    """leave = signature %d5 version sequence group status"""

    sequence: int
    group: str
    status: int


@dataclass(frozen=True, slots=True)
class Ping:
    """ping = signature %d6 version sequence"""

    sequence: int


@dataclass(frozen=True, slots=True)
class PingOk:
    """ping_ok = signature %d7 version sequence"""

    sequence: int


@dataclass(frozen=True, slots=True)
class Elect:
    """elect = signature %d8 version sequence group challenger (Zyre's)"""

    sequence: int
    group: str
    challenger: str


@dataclass(frozen=True, slots=True)
class Leader:
    """leader = signature %d9 version sequence group leader (Zyre's)"""

    sequence: int
    group: str
    leader: str


@dataclass(frozen=True, slots=True)
class Goodbye:
    """goodbye = signature %d10 version sequence (Zyre's)"""

    sequence: int


@dataclass(frozen=True, slots=True)
class PeerExchange:
    """pex = signature %x50 version sequence peers (a peermesh extension)"""

    sequence: int
    peers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unknown:
    """A well-formed header with a command id this codec does not know."""

    sequence: int
    command: int


Message = Union[Hello, Whisper, Shout, Join, Leave, Ping, PingOk, Elect, Leader, Goodbye,
                PeerExchange, Unknown]


# --- encoding -------------------------------------------------------------

def _string(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > MAX_STRING:
        raise EncodeError(f"string of {len(data)} UTF-8 octets exceeds {MAX_STRING}: "
                          f"{value[:40]!r}")
    return _N1.pack(len(data)) + data


def _longstr(value: str) -> bytes:
    data = value.encode("utf-8")
    if len(data) > MAX_LONGSTR:
        raise EncodeError("longstr exceeds 2**32-1 octets")
    return _N4.pack(len(data)) + data


def _header(command: int, sequence: int) -> bytes:
    return _HEADER.pack(SIGNATURE, command, VERSION, sequence)


def shout_header(sequence: int, group: bytes) -> bytes:
    """Frame 0 of a SHOUT to ``group`` (already a length-prefixed ``string``)."""
    return _HEADER.pack(SIGNATURE, 3, VERSION, sequence) + group


def shouts(first: int, group: bytes, bodies: Sequence[bytes]
           ) -> list[tuple[bytes, bytes]]:
    """The frames of one SHOUT to ``group`` per body, numbered from ``first`` on
    (wrapping past 0xFFFF to 0): a batch for one peer."""
    pack = _HEADER.pack
    return [(pack(SIGNATURE, 3, VERSION, (first + i) & 0xFFFF) + group, body)
            for i, body in enumerate(bodies)]


def encode_string(value: str) -> bytes:
    """A ZRE ``string`` field (1-octet length); ``EncodeError`` if over 255 octets."""
    return _string(value)


def encode(message: Message) -> list[bytes]:
    """The frames of ``message``: the command frame, then any content frames."""
    if isinstance(message, Whisper):
        return [whisper_header(message.sequence), *message.content]
    if isinstance(message, Shout):
        return [shout_header(message.sequence, _string(message.group)), *message.content]
    if isinstance(message, Hello):
        body = b"".join((
            _string(message.endpoint),
            _N4.pack(len(message.groups)),
            *(_longstr(g) for g in message.groups),
            _N1.pack(message.status & 0xFF),
            _string(message.name),
            _N4.pack(len(message.headers)),
            *(_string(k) + _longstr(v) for k, v in message.headers.items()),
        ))
        return [_header(Command.HELLO, message.sequence) + body]
    if isinstance(message, (Join, Leave)):
        command = Command.JOIN if isinstance(message, Join) else Command.LEAVE
        return [_header(command, message.sequence) + _string(message.group)
                + _N1.pack(message.status & 0xFF)]
    if isinstance(message, Ping):
        return [_header(Command.PING, message.sequence)]
    if isinstance(message, PingOk):
        return [_header(Command.PING_OK, message.sequence)]
    if isinstance(message, Elect):
        return [_header(Command.ELECT, message.sequence) + _string(message.group)
                + _string(message.challenger)]
    if isinstance(message, Leader):
        return [_header(Command.LEADER, message.sequence) + _string(message.group)
                + _string(message.leader)]
    if isinstance(message, Goodbye):
        return [_header(Command.GOODBYE, message.sequence)]
    if isinstance(message, PeerExchange):
        return [_header(PEX, message.sequence) + _N4.pack(len(message.peers))
                + b"".join(_longstr(p) for p in message.peers)]
    if isinstance(message, Unknown):
        if message.command == PEX:
            raise EncodeError("command id %x50 is PEX: use PeerExchange")
        return [_header(message.command, message.sequence)]
    raise TypeError(f"not a ZRE message: {message!r}")


# --- decoding -------------------------------------------------------------

class _Reader:
    """Reads ZRE fields from one frame, raising RemoteProtocolError past its end."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise RemoteProtocolError("frame truncated")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def number1(self) -> int:
        return self.take(1)[0]

    def number4(self) -> int:
        return _N4.unpack(self.take(4))[0]

    def text(self, size: int) -> str:
        try:
            return self.take(size).decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError("string is not valid UTF-8") from None

    def string(self) -> str:
        return self.text(self.number1())

    def longstr(self) -> str:
        return self.text(self.number4())

    def strings(self) -> tuple[str, ...]:
        return tuple(self.longstr() for _ in range(self.number4()))

    def dictionary(self) -> dict[str, str]:
        count = self.number4()
        result = {}
        for _ in range(count):
            key = self.string()
            result[key] = self.longstr()
        return result

    def end(self) -> None:
        if self.pos != len(self.data):
            raise RemoteProtocolError(f"{len(self.data) - self.pos} unexpected octets after "
                                      "the fields")


def decode(frames: Sequence[bytes]) -> Message:
    """Parse the frames of one mailbox message (without the ROUTER identity)."""
    if type(frames) is not list:
        frames = as_frames(frames, "a ZRE message")
    if not frames:
        raise RemoteProtocolError("empty message")
    data = frames[0]
    if type(data) is not bytes:
        data = as_bytes(data, "a ZRE command frame")
    if len(data) < _HEADER_SIZE:
        raise RemoteProtocolError(f"command frame of {len(data)} octets is shorter than a header")
    signature, command, version, sequence = _HEADER.unpack_from(data)
    if signature != SIGNATURE:
        raise RemoteProtocolError("bad signature")
    if version != VERSION:
        raise RemoteProtocolError(f"unsupported version {version}")
    content = tuple(frames[1:])
    for frame in content:
        if type(frame) is not bytes:
            content = tuple(as_frames(content, "a ZRE message"))
            break
    if command == 2:
        if len(data) != _HEADER_SIZE:
            raise RemoteProtocolError("unexpected octets in WHISPER")
        return Whisper(sequence, content)
    reader = _Reader(data, _HEADER_SIZE)
    if command == 3:
        group = reader.string()
        reader.end()
        return Shout(sequence, group, content)
    if content and (command <= 10 or command == PEX):
        raise RemoteProtocolError(f"unexpected content frames in command {command}")
    if command == 1:
        message: Message = Hello(sequence, reader.string(), reader.strings(), reader.number1(),
                                 reader.string(), reader.dictionary())
    elif command in (4, 5):
        group, status = reader.string(), reader.number1()
        message = (Join if command == 4 else Leave)(sequence, group, status)
    elif command == 6:
        message = Ping(sequence)
    elif command == 7:
        message = PingOk(sequence)
    elif command in (8, 9):
        group, who = reader.string(), reader.string()
        message = (Elect if command == 8 else Leader)(sequence, group, who)
    elif command == 10:
        message = Goodbye(sequence)
    elif command == PEX:
        message = PeerExchange(sequence, reader.strings())
    else:
        return Unknown(sequence, command)
    reader.end()
    return message
