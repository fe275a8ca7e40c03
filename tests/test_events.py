"""``peermesh.events.tell``: every listener hears an event, whatever the others do."""

from __future__ import annotations

import logging
from typing import Callable

import pytest

from peermesh.events import tell


def test_a_failing_listener_is_logged_and_the_others_still_hear(
        caplog: pytest.LogCaptureFixture) -> None:
    heard: list[tuple[str, int]] = []
    listeners: list[Callable[[int], None]] = []

    def fails(event: int) -> None:
        raise RuntimeError("listener bug")

    def leaves(event: int) -> None:       # removes itself while being told
        heard.append(("leaves", event))
        listeners.remove(leaves)

    listeners += [fails, leaves, lambda event: heard.append(("last", event))]
    with caplog.at_level(logging.ERROR, logger="peermesh.events"):
        tell(listeners, 7, "test listener")
    assert heard == [("leaves", 7), ("last", 7)]
    (record,) = caplog.records
    assert record.getMessage().startswith("test listener <function") and "failed" in \
        record.getMessage()
    assert record.exc_info is not None and "listener bug" in str(record.exc_info[1])
    tell(listeners, 8, "test listener")
    assert heard[-1] == ("last", 8) and ("leaves", 8) not in heard
