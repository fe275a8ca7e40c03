"""What a command shows: result lines on stdout, notes on stderr, JSON, tables, event
lines, exit codes.

Everything a peer or a file supplies goes through ``clean`` before it reaches
a terminal, so that nobody on the mesh can drive it with control characters.
"""

from __future__ import annotations

import sys

from ..errors import PeermeshError

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    import argparse
    from typing import Any, Callable, Optional, Sequence

    from ..events import Event

__all__ = ["PROG", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "NotFound",
           "clean", "emit", "note", "to_json", "table", "stdout_utf8", "format_event",
           "renderer"]

PROG = "peermesh"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class NotFound(PeermeshError, LookupError):
    """The peer or group a command named never appeared, or names several peers:
    exit code 2 (``EXIT_USAGE``)."""


def clean(text: Any) -> str:
    """``text`` with control characters escaped, so a peer cannot drive the terminal."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def emit(line: str) -> None:
    """One line of the command's result on stdout, flushed (a pipe sees it at once)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


#: where notes go instead of stderr's text lines (``--log-format json`` sets it)
note_sink: Optional[Callable[[str], None]] = None


def note(message: str) -> None:
    """One line for the user on stderr: ``peermesh: message`` (a JSON object with
    ``--log-format json``)."""
    if note_sink is not None:
        note_sink(message)
        return
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def stdout_utf8() -> bool:
    return (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"


def _jsonable(obj: Any) -> Any:
    """What ``json`` cannot write itself: bytes as text (or ``{"hex": ...}``), sets as lists."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        data = bytes(obj)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return {"hex": data.hex()}
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def to_json(obj: Any, indent: Optional[int] = None) -> str:
    """``obj`` as JSON; non-ASCII text as is when stdout is UTF-8, else ``\\u`` escapes."""
    import json

    return json.dumps(obj, ensure_ascii=not stdout_utf8(), indent=indent, default=_jsonable)


def table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first is the heading) as aligned columns; the last column is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(row, widths)), row[-1]]).rstrip()
                     for row in rows)


def _content(event: Event) -> str:
    parts = []
    for frame in event.frames:
        try:
            parts.append(clean(frame.decode("utf-8")))
        except UnicodeDecodeError:
            parts.append("0x" + frame.hex())
    if len(parts) == 1:
        return parts[0]
    return f"({len(parts)} frames) " + " | ".join(parts)


def format_event(event: Event) -> str:
    """One human-readable line: time, event, peer name and short UUID, then details."""
    from datetime import datetime

    from ..events import EventType

    fields = [datetime.now().strftime("%H:%M:%S.%f")[:-3], f"{event.type.value:<7}"]
    if event.peer is not None:
        fields.append(f"{clean(event.name)} ({event.peer.hex[:8]})")
    if event.group is not None:
        fields.append(f"[{clean(event.group)}]")
    kind = event.type
    if kind in (EventType.SHOUT, EventType.WHISPER):
        fields.append(_content(event))
    if kind is EventType.ENTER:
        if event.address:
            fields.append(event.address)
        if event.headers:
            fields.append(" ".join(f"{clean(k)}={clean(v)}" for k, v in event.headers.items()))
    if event.reason:
        fields.append(f"({clean(event.reason)})")
    return " ".join(fields).rstrip()


def renderer(args: argparse.Namespace) -> Callable[[Event], str]:
    """How a command prints events: JSON lines with ``--json``, else ``format_event``."""
    from ..events import Event

    if args.json:
        return Event.to_json if stdout_utf8() else lambda e: to_json(e.to_dict())
    return format_event
