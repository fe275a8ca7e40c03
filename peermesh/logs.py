"""Logging for the commands: text or JSON lines on stderr, at a rate a terminal can take.

``setup(verbosity, fmt)`` logs WARNING (0), INFO (1: peers entering and
leaving, limits hit, elections) or DEBUG (2: every decision, dropped input
included). ``fmt`` "json" writes one JSON object a line: ``time`` (ISO 8601,
UTC), ``level``, ``logger``, ``message``, the ``node`` and ``node_uuid`` of
the process's node (``set_node``), and ``peer`` / ``peer_name`` when the
record is about one peer (``extra={"peer": uuid_hex, "peer_name": name}``).

Remote senders decide how often some lines would be written, so a
``RateLimit`` filter lets through at most ``BURST`` records of one message
template per ``WINDOW`` seconds below WARNING; the next one let through says
how many were held back.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import IO, Any, Optional

__all__ = ["setup", "set_node", "json_note", "JsonFormatter", "RateLimit", "FORMATS", "BURST", "WINDOW"]

#: ``--log-format`` choices
FORMATS = ("text", "json")
#: records of one template let through per window (below WARNING)
BURST = 20
#: seconds of one rate window
WINDOW = 10.0
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_node: dict[str, str] = {}


def set_node(name: str, uuid_hex: str) -> None:
    """Name the node of this process in every JSON line from now on."""
    _node.update(node=name, node_uuid=uuid_hex)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        entry.update(_node)
        for key in ("node", "node_uuid", "peer", "peer_name"):
            value = record.__dict__.get(key)
            if value is not None:
                entry[key] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class RateLimit(logging.Filter):
    """At most ``burst`` records per message template each ``window`` seconds below
    WARNING; the next one let through tells how many were held back."""

    def __init__(self, burst: int = BURST, window: float = WINDOW,
                 clock: Any = time.monotonic) -> None:
        super().__init__()
        self.burst, self.window, self.clock = burst, window, clock
        self._seen: dict[tuple[str, Any], list[float]] = {}  # template -> [start, count, held]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        key = (record.name, record.msg)
        now = self.clock()
        seen = self._seen.get(key)
        if seen is None or now - seen[0] >= self.window:
            held = int(seen[2]) if seen is not None else 0
            if len(self._seen) > 4096:  # templates are few; forget them all if not
                self._seen.clear()
            self._seen[key] = [now, 1, 0]
            if held:
                record.msg = f"{record.msg} ({held} more like this held back)"
            return True
        seen[1] += 1
        if seen[1] <= self.burst:
            return True
        seen[2] += 1
        return False


def json_note(message: str, stream: Optional[IO[str]] = None) -> None:
    """A command's note to the user as one JSON line (level ``NOTE``) on ``stream``."""
    record = logging.LogRecord("peermesh", logging.INFO, "", 0, message, None, None)
    record.levelname = "NOTE"
    out = stream if stream is not None else sys.stderr
    out.write(JsonFormatter().format(record) + "\n")
    out.flush()


def setup(verbosity: int, fmt: str = "text", stream: Optional[IO[str]] = None) -> None:
    """Log to ``stream`` (stderr) at WARNING, INFO (1) or DEBUG (2+), as text or JSON;
    once per process (later calls change nothing, as ``logging.basicConfig``)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    handler.addFilter(RateLimit())
    root.addHandler(handler)
    root.setLevel(logging.WARNING if verbosity <= 0 else
                  logging.INFO if verbosity == 1 else logging.DEBUG)
