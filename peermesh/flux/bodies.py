"""The JSON bodies of the built-in services: checked readers and base64 payloads.

Every reader raises ``ProtocolError`` for a field that is missing, of the
wrong type or out of range; the caller answers EPROTO (or drops the message).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Optional

from ..errors import ProtocolError
from ..wire.flux import MAX_RANK

__all__ = ["b64", "unb64", "int_field", "str_field"]


def b64(data: Optional[bytes]) -> Optional[str]:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: Any) -> Optional[bytes]:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ProtocolError("payload is not base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("payload is not base64") from None


def int_field(obj: dict, key: str, low: int = -1, high: int = MAX_RANK) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(f"{key!r} is not a whole number in {low}..{high}")
    return value


def str_field(obj: dict, key: str, limit: int = 1024) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(f"{key!r} is not a string of at most {limit} characters")
    return value
