"""The one check every decoder makes of what it is handed: a list of byte strings.

Decoders take the frames a socket read (a list of ``bytes``) and must refuse
anything else with ``RemoteProtocolError``, never ``TypeError``: ``as_frames`` is
their slow path, taken only when the input is not already a list of
``bytes``; ``as_bytes`` does the same for a single datagram or frame. An
encoder checking its own argument passes ``remote=False`` and gets
``LocalProtocolError`` instead; an encoder refusing a value the wire cannot
carry raises ``EncodeError``, a ``LocalProtocolError`` that is also a ``ValueError``.
"""

from __future__ import annotations

from typing import Any

from ..errors import LocalProtocolError, ProtocolError, RemoteProtocolError

__all__ = ["as_frames", "as_bytes", "EncodeError"]


class EncodeError(LocalProtocolError, ValueError):
    """An encoder refused a value the wire cannot carry: a bad argument in this program,
    never anything from a peer (a ``ValueError`` too, as Python's own checks are)."""


def _error(remote: bool) -> type[ProtocolError]:
    return RemoteProtocolError if remote else LocalProtocolError


def as_bytes(data: Any, what: str = "a frame", remote: bool = True) -> bytes:
    """``data`` as ``bytes`` (from bytes, bytearray or memoryview); else
    ``RemoteProtocolError`` (``LocalProtocolError`` if not ``remote``)."""
    if type(data) is bytes:
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise _error(remote)(f"{what} must be bytes, not {type(data).__name__}")


def as_frames(frames: Any, what: str = "a message", remote: bool = True) -> list[bytes]:
    """``frames`` as a list of ``bytes``; ``RemoteProtocolError`` (``LocalProtocolError``
    if not ``remote``) for one byte string, a text, something that is not a sequence, or
    an item that is not bytes-like."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        raise _error(remote)(f"{what} is a list of frames (bytes), not one {type(frames).__name__}")
    try:
        items = list(frames)
    except TypeError:
        raise _error(remote)(f"{what} is a list of frames (bytes), "
                             f"not {type(frames).__name__}") from None
    return [frame if type(frame) is bytes else as_bytes(frame, remote=remote) for frame in items]
