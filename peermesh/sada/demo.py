"""The demo ``echo`` service that ``peermesh serve`` offers.

``echo`` 1.0, category "" (none):

* ``echo``: returns the payload unchanged (as bytes: it is never decoded);
* ``info``: ``{"server": label, "pid": ..., "host": ...}``: which server answered;
* ``sleep``: waits ``payload`` seconds (a number, or ``{"seconds": s, "value": v}``)
  in its own greenlet, then returns the payload (or ``value``);
* ``fail``: raises, so the reply is a 500 carrying the message.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

import gevent

from .handlers import Service

__all__ = ["echo_service"]


def echo_service(label: Optional[str] = None, version: str = "1.0") -> Service:
    """A fresh ``echo`` service; ``label`` names this server in ``info`` replies."""
    service = Service("echo", version)
    host = socket.gethostname()
    label = label or f"{host}:{os.getpid()}"

    @service.action("echo", raw=True, inline=True)
    def echo(payload: bytes) -> bytes:
        """The payload, unchanged (raw: neither unpacked nor packed again)."""
        return payload

    @service.action("info", inline=True)
    def info(payload: Any) -> Any:
        """Which server answered."""
        return {"server": label, "pid": os.getpid(), "host": host}

    @service.action("sleep")
    def sleep(payload: Any) -> Any:
        """Wait, then answer (a handler that blocks, in its own greenlet)."""
        if isinstance(payload, dict):
            gevent.sleep(float(payload.get("seconds", 0)))
            return payload.get("value")
        gevent.sleep(float(payload or 0))
        return payload

    @service.action("fail", inline=True)
    def fail(payload: Any) -> Any:
        """Raise: the reply is a 500."""
        raise RuntimeError(str(payload) if payload is not None else "failure on request")

    return service
