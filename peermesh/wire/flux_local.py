"""flux-core's local connector framing: Flux messages over a Unix stream socket.

How it works
------------
A client of a flux-core broker on the same host (``local://PATH``, what
``FLUX_URI`` names) connects a Unix stream socket to PATH. The broker
authenticates the peer from the socket's credentials and writes one octet:
0 when it accepts the client, else an errno value (the connection then
closes). After that each direction carries whole Flux messages (the frames
of ``peermesh.wire.flux``), each as::

    message = magic size body
    magic   = %xFFEE0012 in the host's byte order   ; 4 octets (12 00 EE FF on
                                                    ; little-endian hosts)
    size    = 4OCTET                                 ; of body, big-endian
    body    = 1*frame                                ; the message's frames in
                                                    ; order, PROTO last
    frame   = %x00-FE len-octets / %xFF 4OCTET octets ; short form for fewer than
                                                    ; 255 octets, else 0xFF and a
                                                    ; big-endian length

So a request is ``[routes... delimiter] [topic] [payload] PROTO`` with each
frame length-prefixed: libflux sends requests with flag ROUTE and an empty
route stack (the body starts with ``00``, the delimiter).

``encode`` makes the octets of one message; ``Reader`` takes octets as they
arrive (``feed``) and gives back whole messages as lists of frames, at most
``limit`` octets of body each: ``RemoteProtocolError`` (only) for a wrong magic, a
body over the limit, a frame that overruns its body, or an empty body. The
frames are then ``peermesh.wire.flux.decode``'s to check.
"""

from __future__ import annotations

import struct
import sys
from typing import Sequence

from ..errors import LocalProtocolError, RemoteProtocolError
from .frames import as_bytes, as_frames

__all__ = ["MAGIC", "AUTH_OK", "HEADER_SIZE", "encode", "encode_body", "decode_body", "Reader"]

#: the header's first word (written in the host's byte order, as flux-core does)
MAGIC = 0xFFEE0012
#: what the broker writes first when it accepts the client
AUTH_OK = b"\0"
HEADER_SIZE = 8
_NATIVE = "<" if sys.byteorder == "little" else ">"
_MAGIC_OCTETS = struct.pack(_NATIVE + "I", MAGIC)
_SIZE = struct.Struct(">I")
_LONG = 0xFF


def encode_body(frames: Sequence[bytes]) -> bytes:
    """The frames of one message, each with its length (1 octet, or 0xFF + 4 octets)."""
    parts: list[bytes] = []
    for frame in as_frames(frames, remote=False):
        size = len(frame)
        if size < _LONG:
            parts.append(bytes((size,)))
        else:
            parts.append(b"\xff" + _SIZE.pack(size))
        parts.append(frame)
    return b"".join(parts)


def encode(frames: Sequence[bytes]) -> bytes:
    """One message as the local connector carries it: header and body; ``LocalProtocolError``
    if ``frames`` is not a list of byte frames or the body is over 4 GiB."""
    body = encode_body(frames)
    if len(body) > 0xFFFFFFFF:
        raise LocalProtocolError("a message of more than 4 GiB")
    return _MAGIC_OCTETS + _SIZE.pack(len(body)) + body


def decode_body(body: bytes) -> list[bytes]:
    """The frames of a body; ``RemoteProtocolError`` when a frame overruns it or it is empty."""
    body = as_bytes(body, "a body")
    frames: list[bytes] = []
    pos, end = 0, len(body)
    if not end:
        raise RemoteProtocolError("an empty message body")
    while pos < end:
        size = body[pos]
        pos += 1
        if size == _LONG:
            if end - pos < 4:
                raise RemoteProtocolError("a long frame length cut short")
            (size,) = _SIZE.unpack_from(body, pos)
            pos += 4
        if end - pos < size:
            raise RemoteProtocolError(f"a frame of {size} octets overruns the message body")
        frames.append(body[pos:pos + size])
        pos += size
    return frames


class Reader:
    """Whole messages from a byte stream (see the module's docstring)."""

    __slots__ = ("limit", "_buffer")

    def __init__(self, limit: int) -> None:
        #: octets of body a message may have (the bound on what a peer can make us hold)
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[list[bytes]]:
        """The messages ``data`` completes (none if it completes none)."""
        buffer = self._buffer
        buffer += data
        messages: list[list[bytes]] = []
        pos = 0
        while len(buffer) - pos >= HEADER_SIZE:
            if buffer[pos:pos + 4] != _MAGIC_OCTETS:
                raise RemoteProtocolError(f"local connector magic "
                                          f"{bytes(buffer[pos:pos + 4]).hex()}, "
                                          f"not {_MAGIC_OCTETS.hex()}")
            (size,) = _SIZE.unpack_from(buffer, pos + 4)
            if size > self.limit:
                raise RemoteProtocolError(f"a message of {size} octets, over the limit of "
                                          f"{self.limit}")
            if len(buffer) - pos - HEADER_SIZE < size:
                break
            start = pos + HEADER_SIZE
            messages.append(decode_body(bytes(buffer[start:start + size])))
            pos = start + size
        if pos:
            del buffer[:pos]
        return messages

    @property
    def pending(self) -> int:
        """Octets held of a message not yet whole."""
        return len(self._buffer)
