"""What a command shows: result lines on stdout, notes on stderr, JSON, tables, exit codes.

Everything a peer or a file supplies goes through ``clean`` before it reaches
a terminal, so that nobody on the mesh can drive it with control characters.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, Sequence

__all__ = ["PROG", "EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "clean",
           "emit", "note", "to_json", "table", "stdout_utf8"]

PROG = "peermesh"
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


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
