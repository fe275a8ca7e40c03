"""Bounded waits on a node's events, shared by the node tests."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from peermesh.events import Event


def seen_text(events: list[Event]) -> str:
    """The last events read, for a failure message."""
    shown = events[-30:]
    more = f"... {len(events) - len(shown)} earlier, then " if len(events) > len(shown) else ""
    return more + (", ".join(map(repr, shown)) or "nothing")


def wait_for(node: Any, predicate: Callable[[Event], bool], timeout: float) -> Event:
    """Read ``node``'s events until one matches ``predicate``; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    seen: list[Event] = []
    while True:
        remaining = deadline - time.monotonic()
        event = node.recv(remaining) if remaining > 0 else None
        if event is None:
            what = getattr(predicate, "__name__", repr(predicate))
            pytest.fail(f"{node.name}: nothing matched {what} within {timeout}s; "
                        f"saw {seen_text(seen)}")
        seen.append(event)
        if predicate(event):
            return event


def drain(node: Any) -> list[Event]:
    """The events ``node`` holds right now, without waiting."""
    events = []
    while (event := node.recv(0)) is not None:
        events.append(event)
    return events
