"""The Spark log server's ROUTER under the connection policy: a bounded flood of idle
connections is shed and a reader still answered."""

from __future__ import annotations

from typing import Any, Callable

from flooding import flood, lowered_cap, wait_shed
from peermesh.spark.client import LogClient


def test_a_flood_of_idle_connections_is_shed_and_a_reader_answered(
        make_service: Callable[..., Any]) -> None:
    with lowered_cap():
        service = make_service(["g"], channel=False)
        client = LogClient(service.endpoint, timeout=5, token=service.token)
        assert client.info()["next"] == 0  # (the server's policy is read once it serves)
    with flood(int(service.endpoint.rpartition(":")[2])):
        wait_shed(service.limits)
        assert client.info()["next"] == 0
