"""The JSON bodies of the built-in services: checked readers and base64 payloads.

Every reader of a peer's body raises ``RemoteProtocolError`` for a field that is
missing, of the wrong type or out of range; the caller answers EPROTO (or drops the message).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Optional, Sequence

from ..errors import RemoteProtocolError
from ..wire.flux import MAX_RANK, json_payload, read_json

__all__ = ["b64", "unb64", "int_field", "str_field", "publish_body", "ping_body", "ping_answer",
           "route_string"]


def b64(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: Any) -> Optional[bytes]:
    if text is None:
        return None
    if not isinstance(text, str):
        raise RemoteProtocolError("payload is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RemoteProtocolError("payload is not base64") from None


def int_field(obj: dict, key: str, low: int = -1, high: int = MAX_RANK) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise RemoteProtocolError(f"{key!r} is not a whole number in {low}..{high}")
    return value


def str_field(obj: dict, key: str, limit: int = 1024) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise RemoteProtocolError(f"{key!r} is not a string of at most {limit} characters")
    return value


def publish_body(topic: str, payload: Optional[bytes], flags: int = 0) -> dict:
    """An ``event.publish`` body as libflux sends it: ``{"topic", "flags"}`` and
    ``"payload"`` (base64) only when there is one."""
    body: dict = {"topic": topic, "flags": flags}
    if payload is not None:
        body["payload"] = b64(payload)
    return body


def ping_body(seq: int, pad: str = "") -> bytes:
    """A ``broker.ping`` request body as ``flux ping`` sends it (less its
    timestamps, which the server echoes without reading)."""
    return json_payload({"seq": seq, "pad": pad})


def route_string(routes: Sequence[bytes], me: str) -> str:
    """flux-core's route string of a request: its hops oldest first, each cut to 8
    characters (a 16-byte identity as hex), then this node's ``me``, joined by ``!``."""
    hops = [(r.hex() if len(r) == 16 else r.decode("ascii", "replace"))[:8]
            for r in reversed(routes)]
    return "!".join([*hops, me[:8]])


def ping_answer(payload: Optional[bytes], routes: Sequence[bytes], me: str, rank: int,
                userid: int, rolemask: int) -> bytes:
    """flux-core's answer to a ``broker.ping`` body, byte for byte: the request's JSON
    object with ``route``, ``userid``, ``rolemask`` and ``rank`` added;
    ``RemoteProtocolError`` if the body is not a JSON object (flux-core answers EPROTO then)."""
    body = read_json(payload)
    body.update(route=route_string(routes, me), userid=userid, rolemask=rolemask, rank=rank)
    # as jansson's json_dumps(o, 0) writes it: ", " and ": ", UTF-8 as it is
    return json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\0"
