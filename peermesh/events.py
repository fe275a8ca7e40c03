"""Events a node reports to the application."""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TypeVar
from uuid import UUID


__all__ = ["EventType", "Event", "tell"]

log = logging.getLogger(__name__)

E = TypeVar("E")


class EventType(str, Enum):
    """What happened. The values are Zyre's event names."""

    ENTER = "ENTER"        #: a peer said HELLO: name, headers and address are known
    EXIT = "EXIT"          #: a peer left, expired or was disconnected; ``reason`` says why
    JOIN = "JOIN"          #: a peer joined ``group``
    LEAVE = "LEAVE"        #: a peer left ``group``
    WHISPER = "WHISPER"    #: a peer sent ``frames`` to this node
    SHOUT = "SHOUT"        #: a peer sent ``frames`` to ``group``
    EVASIVE = "EVASIVE"    #: a peer has been silent for the evasive timeout and was PINGed
    SILENT = "SILENT"      #: a peer has been silent for the silent timeout
    LEADER = "LEADER"      #: ``group`` elected ``peer`` (this node's own UUID if it won)
    STOP = "STOP"          #: this node stopped; the last event it reports
    #: a peer asks this node to confirm (PING) what it sent before; only for a node that
    #: ``hold_confirms()``: the application answers with ``confirm(event.peer)`` once it
    #: has handled (stored) every event before this one (not a Zyre event)
    CONFIRM = "CONFIRM"

    def __str__(self) -> str:
        return self.value


class Event:
    """One event. Fields a type does not use are None (or empty)."""

    __slots__ = ("type", "peer", "name", "group", "frames", "headers", "address", "reason")

    def __init__(self, type: EventType, peer: Optional[UUID] = None, name: Optional[str] = None,
                 group: Optional[str] = None, frames: tuple[bytes, ...] = (),
                 headers: Optional[Mapping[str, str]] = None, address: Optional[str] = None,
                 reason: Optional[str] = None) -> None:
        self.type = type
        self.peer = peer
        self.name = name
        self.group = group
        self.frames = frames
        self.headers = headers
        self.address = address
        self.reason = reason

    @property
    def message(self) -> bytes:
        """The content as one byte string (the frames joined; see ``frames``)."""
        frames = self.frames
        return frames[0] if len(frames) == 1 else b"".join(frames)

    def unpack(self) -> Any:
        """The content decoded from msgpack (what ``shout_packed``/``whisper_packed`` sent)."""
        import msgpack  # (only where packed content is used: a plain node does without)

        return msgpack.unpackb(self.message, raw=False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict.

        ``frames`` holds one ``{"text": ...}`` (valid UTF-8) or ``{"hex": ...}``
        object per frame; ``message`` is the joined text, or None when some
        frame is not UTF-8.
        """
        frames = [_frame_text(f) for f in self.frames]
        return {
            "event": self.type.value,
            "peer": self.peer.hex if self.peer else None,
            "name": self.name,
            "group": self.group,
            "headers": dict(self.headers) if self.headers is not None else None,
            "address": self.address,
            "frames": frames,
            "message": "".join(f["text"] for f in frames)
            if frames and all("text" in f for f in frames) else None,
            "reason": self.reason,
        }

    def to_json(self) -> str:
        """``to_dict`` as one line of JSON."""
        import json

        return json.dumps(self.to_dict(), ensure_ascii=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Event):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__[1:]
                           if getattr(self, f) not in (None, ()))
        return f"Event({self.type.value}, {fields})"


def until_stop(recv: Callable[[Optional[float]], Optional[Event]],
               timeout: Optional[float]) -> Iterator[Event]:
    """Events from ``recv(timeout)`` up to and including STOP, or until one times out."""
    while True:
        event = recv(timeout)
        if event is None:
            return
        yield event
        if event.type is EventType.STOP:
            return


def tell(listeners: Iterable[Callable[[E], None]], event: E, what: str) -> None:
    """Call each of ``listeners`` (a snapshot: one may remove itself) with ``event``; one
    that raises is logged with its traceback (``what``: whose listener) and the rest still
    run."""
    for callback in tuple(listeners):
        try:
            callback(event)
        except Exception:
            log.exception("%s %r failed", what, callback)


def _frame_text(frame: bytes) -> dict[str, str]:
    try:
        return {"text": frame.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": frame.hex()}
