"""How payloads become columns and rows become payloads (no pyspark, no sockets).

* ``payload_text``: the ``text`` column: msgpack decoded and shown as JSON,
  else the payload as UTF-8, else null.
* ``stored_texts``: the ``text`` of a batch of payloads as the log stores it
  at ingest (made once per message, not once per read).
* ``payload_value``: the payload as a Python value, for user schemas and
  replies: msgpack, else JSON text, else the UTF-8 string, else None.
* ``pack_value``: a row (or any value) as msgpack, with dates, times and
  decimals made portable.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import uuid
from array import array
from functools import partial
from itertools import accumulate
from operator import sub
from typing import Any, Sequence

import msgpack

from ..wire import jsonsafe

__all__ = ["payload_text", "payload_texts", "stored_texts", "payload_value", "pack_value",
           "to_jsonable", "DECODE_MODES", "TEXT_NULL", "TEXT_STORED", "TEXT_LATER",
           "STORED_TEXT_MAX"]

#: values of the ``decode`` option
DECODE_MODES = ("auto", "msgpack", "json", "utf8", "none")

_unpackb = msgpack.unpackb


def _unpack(payload: bytes) -> Any:
    """The msgpack value of the whole payload; raises when it is not exactly one value."""
    return _unpackb(payload, raw=False, strict_map_key=False)


def _looks_like_msgpack(payload: bytes) -> bool:
    """A one-octet printable ASCII payload is text ("1"), not a msgpack fixint."""
    return bool(payload) and not (len(payload) == 1 and 0x20 <= payload[0] <= 0x7E)


def to_jsonable(value: Any) -> Any:
    """``value`` with what JSON cannot carry made into strings (bytes as base64)."""
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, msgpack.ExtType):
        return {"ext": value.code, "data": base64.b64encode(value.data).decode("ascii")}
    if isinstance(value, float) and value != value:
        return None
    return value


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_encode_lenient = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

try:  # an optional accelerator, several times faster; same JSON text
    import orjson

    _orjson: Any = orjson
    _ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS

    def _json(value: Any) -> str:
        try:
            return orjson.dumps(value, option=_ORJSON_OPTIONS).decode("utf-8")
        except (TypeError, ValueError):
            return _encode_lenient(to_jsonable(value))
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

    def _json(value: Any) -> str:
        try:
            return _encode(value)
        except (TypeError, ValueError):
            return _encode_lenient(to_jsonable(value))


def payload_text(payload: bytes, mode: str = "auto") -> Any:
    """The ``text`` column for ``payload`` (None when it cannot be shown as text)."""
    if mode == "none":
        return None
    if mode in ("auto", "msgpack") and (mode == "msgpack" or _looks_like_msgpack(payload)):
        try:
            return _json(_unpack(payload))
        except Exception:
            if mode == "msgpack":
                return None
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _unpack_all(payloads: Sequence[bytes]) -> list[Any]:
    """Each payload's msgpack value; raises if one is not exactly one value with string
    (or binary) map keys. The plain call: passing ``unpackb`` keyword arguments costs
    three times the decoding of a small map."""
    return list(map(_unpackb, payloads))   # (msgpack's defaults: raw=False, strict keys)


def payload_texts(payloads: Sequence[bytes], mode: str = "auto") -> list[Any]:
    """``payload_text`` of each payload, as UTF-8 ``bytes`` (or None) for an Arrow string
    column: the same text, with no Python ``str`` made and encoded again per row."""
    if mode not in ("auto", "msgpack") or _orjson is None:
        return [None if t is None else t.encode("utf-8")
                for t in (payload_text(p, mode) for p in payloads)]
    unpackb, dumps, options = _unpackb, _orjson.dumps, _orjson.OPT_NON_STR_KEYS
    strict = mode == "msgpack"
    if payloads and min(map(len, payloads)) > 1:
        try:  # every payload msgpack that JSON carries as it is: no Python loop at all
            values = _unpack_all(payloads)
        except Exception:
            pass  # one is not: payload by payload below
        else:
            # string keys only (the usual case) take orjson's quicker plain call, the same
            # text; other keys its option; what JSON cannot carry as it is goes payload by
            # payload below
            for encode in (dumps, partial(dumps, option=options)):
                try:
                    return list(map(encode, values))
                except Exception:
                    continue
    out: list[Any] = []
    add = out.append
    for payload in payloads:
        if strict or len(payload) > 1 or (payload and not 0x20 <= payload[0] <= 0x7E):
            try:
                add(dumps(unpackb(payload, raw=False, strict_map_key=False), option=options))
                continue
            except Exception:
                pass  # not msgpack, or what JSON cannot carry as it is: the careful path
        text = payload_text(payload, mode)
        add(None if text is None else text.encode("utf-8"))
    return out


#: per-message states of a stored text: none (null), stored, or made when read
TEXT_NULL, TEXT_STORED, TEXT_LATER = 0, 1, 2
#: the longest text the log stores per message; a longer one is made when read
STORED_TEXT_MAX = 64 * 1024


def stored_texts(payloads: Sequence[bytes]) -> tuple[bytes, array, bytes]:
    """The ``auto`` texts of ``payloads`` as the log stores them: one UTF-8 buffer, the
    n + 1 ends of each payload's text in it (an empty text where there is none) and a
    state per payload (``TEXT_NULL``, ``TEXT_STORED`` or ``TEXT_LATER``): texts of
    large payloads are left to the reader, so no message grows much when stored."""
    limit = STORED_TEXT_MAX
    if (_orjson is not None and payloads and min(map(len, payloads)) > 1
            and max(map(len, payloads)) <= limit):
        try:  # the usual case: every payload msgpack that JSON carries as it is
            data, ends = _json_column(_unpack_all(payloads))
        except Exception:
            pass  # one is not: payload by payload below
        else:
            if len(data) <= limit or max(map(sub, ends[1:], ends)) <= limit:
                return data, ends, bytes([TEXT_STORED]) * len(payloads)
    texts = payload_texts([p if len(p) <= limit else b"" for p in payloads])
    states = bytearray(len(texts))
    for i, (payload, text) in enumerate(zip(payloads, texts)):
        if text is None:
            texts[i] = b""
        elif len(payload) > limit or len(text) > limit:
            texts[i] = b""
            states[i] = TEXT_LATER
        else:
            states[i] = TEXT_STORED
    return b"".join(texts), array("i", accumulate(map(len, texts), initial=0)), bytes(states)


def _json_column(values: Sequence[Any]) -> tuple[bytes, array]:
    """``values`` as JSON texts, one after the other in one buffer, and their n + 1 ends.

    Each text goes into the buffer as soon as it is made: orjson hands back each one in a
    buffer of a kilobyte, and keeping thousands of those alive at once costs more than
    making them."""
    data = bytearray()
    extend = data.extend
    ends = array("i", [0])
    end = ends.append
    dumps = _orjson.dumps
    for value in values:
        extend(dumps(value))
        end(len(data))
    return bytes(data), ends


def payload_value(payload: bytes, mode: str = "auto") -> Any:
    """The payload as a Python value (msgpack, JSON text or UTF-8 text), or None."""
    if mode == "none":
        return None
    if mode in ("auto", "msgpack") and (mode == "msgpack" or _looks_like_msgpack(payload)):
        try:
            return _unpack(payload)
        except Exception:
            if mode == "msgpack":
                return None
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if mode in ("auto", "json"):
        try:
            return jsonsafe.loads(text, len(text))   # the payload's size is bounded already
        except ValueError:
            if mode == "json":
                return None
    return text


def _default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, uuid.UUID):
        return value.hex
    if isinstance(value, (set, frozenset)):
        return list(value)
    if hasattr(value, "asDict"):  # a pyspark Row nested somewhere
        return value.asDict(recursive=True)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot pack a {type(value).__name__} as msgpack")


def pack_value(value: Any) -> bytes:
    """``value`` as msgpack (datetimes as ISO strings, decimals as strings)."""
    return msgpack.packb(value, use_bin_type=True, default=_default, datetime=False)
