"""Counters: totals kept on every hit, one log line per period at most."""

from __future__ import annotations

import logging

import pytest

from peermesh.counters import Counters


def test_one_line_per_period_with_what_moved(caplog: pytest.LogCaptureFixture) -> None:
    counters = Counters(logging.getLogger("test.counters"), "node x hit its limits",
                        ("a_refused", "b_shed"), period=10.0)
    assert counters.snapshot() == {"a_refused": 0, "b_shed": 0}
    with caplog.at_level(logging.WARNING, "test.counters"):
        counters.report(0.0)  # nothing moved: no line
        for _ in range(1000):
            counters.add("a_refused")
        counters.report(1.0)
        counters.add("b_shed", 3)
        counters.report(5.0)  # within the period: no line
        counters.report(11.0)
        counters.report(30.0)  # nothing moved since
    assert [r.getMessage() for r in caplog.records] == [
        "node x hit its limits: a_refused +1000", "node x hit its limits: b_shed +3"]
    assert counters.get("a_refused") == 1000 and counters.snapshot()["b_shed"] == 3


def test_over_reports_at_once_then_once_a_period_with_the_last_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    counters = Counters(logging.getLogger("test.counters"), "worker w hit its limits",
                        period=10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "test.counters"):
        counters.over("max_clients", "forgot client 1")
        for n in range(2, 50):
            now[0] += 0.1
            counters.over("max_clients", f"forgot client {n}")
        now[0] = 111.0
        counters.over("max_stored", "POST of 5 MB refused")
    assert [r.getMessage() for r in caplog.records] == [
        "worker w hit its limits: max_clients +1 (last: forgot client 1)",
        "worker w hit its limits: max_clients +48 (last: forgot client 49), "
        "max_stored +1 (last: POST of 5 MB refused)"]
    assert counters.snapshot() == {"max_clients": 49, "max_stored": 1}
