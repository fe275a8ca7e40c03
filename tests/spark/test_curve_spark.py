"""The Spark log server of a driver node with CURVE keys: encrypted, and the token still asked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from peermesh.spark.client import LogClient
from peermesh.spark.protocol import LogServiceError
from peermesh.spark.source import SourceOptions

from .conftest import meet, shout_all

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402


def test_log_server_speaks_curve_with_the_nodes_key(make_service: Callable[..., Any],
                                                    make_peer: Callable[..., Any],
                                                    tmp_path: Path) -> None:
    ring = KeyRing(tmp_path)
    allowed = ring.allow("allowed", "driver", "alice")
    service = make_service(["tele"], key_file=ring.secret("driver"),
                           allowed_keys=allowed)
    assert service.server_key == ring.public("driver").decode()
    options = service.options()
    assert options["serverKey"] == service.server_key
    assert SourceOptions.parse({k.lower(): v for k, v in {**options, "group": "tele"}.items()},
                               batch=True).server_key == service.server_key
    alice = make_peer("alice", key_file=ring.secret("alice"), allowed_keys=allowed)
    meet(alice, "tele")
    shout_all(alice, "tele", [{"i": i} for i in range(10)])
    assert service.wait_for_offset(10, 10)

    keyed = LogClient(service.endpoint, timeout=5, token=service.token,
                      server_key=service.server_key)
    assert keyed.info()["next"] == 10
    with pytest.raises(LogServiceError, match="token"):
        LogClient(service.endpoint, timeout=5, server_key=service.server_key).info()
    plain = LogClient(service.endpoint, timeout=0.5, token=service.token)
    with pytest.raises(LogServiceError, match="no answer"):  # no CURVE: no handshake at all
        plain.info()
