"""Bounded waits shared by the tests: on a node's events, and on what child processes print."""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

import pytest

from peermesh.events import Event


def seen_text(events: list[Event]) -> str:
    """The last events read, for a failure message."""
    shown = events[-30:]
    more = f"... {len(events) - len(shown)} earlier, then " if len(events) > len(shown) else ""
    return more + (", ".join(map(repr, shown)) or "nothing")


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float,
             what: str = "") -> Event:
    """Read ``node``'s events until one matches ``predicate``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seen: list[Event] = []
    while True:
        remaining = deadline - time.monotonic()
        event = node.recv(remaining) if remaining > 0 else None
        if event is None:
            what = what or getattr(predicate, "__name__", repr(predicate))
            pytest.fail(f"{node.name}: nothing matched {what} within {timeout}s; "
                        f"saw {seen_text(seen)}")
        seen.append(event)
        if predicate(event):
            return event


def wait_all(node: Any, predicates: list[Callable[[Event], bool]], timeout: float,
             unexpected: Optional[Callable[[Event], bool]] = None) -> list[Event]:
    """Read events until each predicate matched one, in any order; return the matches.

    An event for which ``unexpected`` is true fails the test at once.
    """
    wanted = list(predicates)
    found: list[Event] = []
    deadline = time.monotonic() + timeout
    seen: list[Event] = []
    while wanted:
        remaining = deadline - time.monotonic()
        event = node.recv(remaining) if remaining > 0 else None
        if event is None:
            names = [getattr(p, "__name__", repr(p)) for p in wanted]
            pytest.fail(f"{node.name}: still waiting for {names} after {timeout}s; "
                        f"saw {seen_text(seen)}")
        seen.append(event)
        assert unexpected is None or not unexpected(event), f"unexpected {event!r}"
        for predicate in wanted:
            if predicate(event):
                wanted.remove(predicate)
                found.append(event)
                break
    return found


def drain(node: Any) -> list[Event]:
    """The events ``node`` holds right now, without waiting."""
    events = []
    while (event := node.recv(0)) is not None:
        events.append(event)
    return events


def poll_until(predicate: Callable[[], Any], timeout: float, what: str = "",
               sleep: Callable[[float], None] = time.sleep, step: float = 0.02) -> Any:
    """Poll ``predicate`` until it is truthy and return it; fail after ``timeout`` seconds.

    Pass ``gevent.sleep`` as ``sleep`` where the caller shares a hub with the nodes.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        sleep(step)


def read_json_lines(stream: Any, lines: list[Any]) -> None:
    """Append every JSON line a child process prints on ``stream`` to ``lines`` until it
    closes (run it in a greenlet: the read waits on the hub); other lines are skipped."""
    import json

    import gevent.os

    fd = stream.fileno()
    gevent.os.make_nonblocking(fd)
    buffer = b""
    while True:
        chunk = gevent.os.nb_read(fd, 65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            try:
                lines.append(json.loads(line))
            except ValueError:
                pass  # a stray print, not one of the child's reports
