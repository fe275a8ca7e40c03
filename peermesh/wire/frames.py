"""The one check every decoder makes of what it is handed: a list of byte strings.

Decoders take the frames a socket read (a list of ``bytes``) and must refuse
anything else with ``ProtocolError``, never ``TypeError``: ``as_frames`` is
their slow path, taken only when the input is not already a list of
``bytes``; ``as_bytes`` does the same for a single datagram or frame.
"""

from __future__ import annotations

from typing import Any

from ..errors import ProtocolError

__all__ = ["as_frames", "as_bytes"]


def as_bytes(data: Any, what: str = "a frame") -> bytes:
    """``data`` as ``bytes`` (from bytes, bytearray or memoryview); else ``ProtocolError``."""
    if type(data) is bytes:
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise ProtocolError(f"{what} must be bytes, not {type(data).__name__}")


def as_frames(frames: Any, what: str = "a message") -> list[bytes]:
    """``frames`` as a list of ``bytes``; ``ProtocolError`` for one byte string, a text,
    something that is not a sequence, or an item that is not bytes-like."""
    if isinstance(frames, (bytes, bytearray, memoryview, str)):
        raise ProtocolError(f"{what} is a list of frames (bytes), not one "
                            f"{type(frames).__name__}")
    try:
        items = list(frames)
    except TypeError:
        raise ProtocolError(f"{what} is a list of frames (bytes), not "
                            f"{type(frames).__name__}") from None
    return [as_bytes(frame) for frame in items]
