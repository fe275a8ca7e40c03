"""Every option of the ``peermesh`` format: its name, what it takes, where it applies.

Spark hands a data source its options lower-cased and as strings. Each is
checked here by one parser, the moment the source is made (``load()``,
``save()``, ``start()``), so a typo or a bad value is an error that names it,
never a silent default or a failure deep inside a Python worker. Options that
exist but do not apply where they are given (a write option on a read,
``endingOffsets`` on a stream) are errors too.
"""

from __future__ import annotations

import difflib
import enum
import json
import math
import re
from typing import Any, Callable, Mapping, Optional

from .codec import DECODE_MODES

__all__ = ["Use", "OPTIONS", "check", "check_use", "boolean", "positive_int"]


class Use(enum.Flag):
    """Where an option applies."""

    BATCH_READ = enum.auto()
    STREAM_READ = enum.auto()
    WRITE = enum.auto()
    READ = BATCH_READ | STREAM_READ
    ANY = READ | WRITE


def boolean(key: str, raw: str) -> bool:
    """true/false, 1/0, yes/no, on/off (any case)."""
    text = raw.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"option {key} must be a boolean (true or false), not {raw!r}")


def _integer(key: str, raw: str, least: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {key} must be an integer, not {raw!r}") from None
    if value < least:
        wanted = "at least 1" if least == 1 else f"{least} or more"
        raise ValueError(f"option {key} must be {wanted}, not {value}")
    return value


def positive_int(key: str, raw: str) -> int:
    """A whole number, 1 or more."""
    return _integer(key, raw, 1)


def _count(key: str, raw: str) -> int:
    return _integer(key, raw, 0)


def _seconds(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"option {key} must be a number of seconds, not {raw!r}") from None
    if not (0 < value < math.inf):
        raise ValueError(f"option {key} must be a positive number of seconds, not {raw!r}")
    return value


def _port(key: str, raw: str) -> int:
    value = _count(key, raw)
    if not 1 <= value <= 65535:
        raise ValueError(f"option {key} must be a UDP port (1-65535), not {raw!r}")
    return value


def offset_spec(key: str, raw: str) -> str:
    """earliest, latest, an offset (0 or more), or Kafka's -2 (earliest) / -1 (latest)."""
    text = raw.strip().lower()
    if text in ("earliest", "latest"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"option {key} must be earliest, latest or an offset, "
                         f"not {raw!r}") from None
    if value == -2:
        return "earliest"
    if value == -1:
        return "latest"
    if value < 0:
        raise ValueError(f"option {key} must be earliest (-2), latest (-1) or an offset of "
                         f"0 or more, not {raw!r}")
    return str(value)


def starting_spec(key: str, raw: str) -> Any:
    """An offset spec (``offset_spec``), or a JSON object of one per group (Kafka's form)."""
    if not raw.lstrip().startswith("{"):
        return offset_spec(key, raw)
    return {group: offset_spec(f"{key}[{group!r}]", str(value))
            for group, value in _json_object(key, raw).items()}


def _json_object(key: str, raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        raise ValueError(f"option {key} is not valid JSON: {raw!r}") from None
    if not isinstance(value, dict) or not value:
        raise ValueError(f"option {key} must be a JSON object of groups, not {raw!r}")
    for group, item in value.items():
        if not group or isinstance(item, (bool, dict, list)) or item is None:
            raise ValueError(f"option {key} must map each group to one value, not "
                             f"{group!r}: {item!r}")
    return value


def milliseconds(key: str, raw: str) -> float:
    """A time as milliseconds since the epoch (Kafka's form); returned as epoch seconds."""
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"option {key} must be milliseconds since the epoch, "
                         f"not {raw!r}") from None
    if value < 0:
        raise ValueError(f"option {key} must be 0 or more, not {raw!r}")
    return value / 1000.0


def times_by_group(key: str, raw: str) -> dict[str, float]:
    """A JSON object of group -> milliseconds since the epoch; epoch seconds per group."""
    return {group: milliseconds(f"{key}[{group!r}]", str(value))
            for group, value in _json_object(key, raw).items()}


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
#: Spark's duration suffixes (``JavaUtils.timeStringAs``), in seconds; a bare number is
#: milliseconds, as Kafka's source reads ``maxTriggerDelay``
_UNIT = {"us": 1e-6, "ms": 0.001, "": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0,
         "h": 3600.0, "d": 86400.0}


def duration(key: str, raw: str) -> float:
    """A duration as Spark and Kafka's source read them (``100ms``, ``30s``, ``15m``,
    ``1h``; a bare number is milliseconds); in seconds."""
    match = _DURATION.match(raw)
    unit = match.group(2).lower() if match is not None else None
    if match is None or unit not in _UNIT or float(match.group(1)) <= 0:
        raise ValueError(f"option {key} must be a positive duration such as 30s, 15m or 1h "
                         f"(a bare number is milliseconds, as in Kafka's source), not {raw!r}")
    return float(match.group(1)) * _UNIT[unit]


def timestamp_strategy(key: str, raw: str) -> str:
    """``error`` or ``latest`` (Kafka's ``startingOffsetsByTimestampStrategy``)."""
    text = raw.strip().lower()
    if text not in ("error", "latest"):
        raise ValueError(f"option {key} must be error or latest, not {raw!r}")
    return text


def _name(key: str, raw: str) -> str:
    if not raw.isprintable() or len(raw) > 200 or "," in raw:
        raise ValueError(f"option {key} must be printable, without commas, at most 200 "
                         f"characters, not {raw[:40]!r}")
    return raw


def _decode(key: str, raw: str) -> str:
    mode = raw.strip().lower()
    if mode not in DECODE_MODES:
        raise ValueError(f"option {key} must be one of {', '.join(DECODE_MODES)}, not {raw!r}")
    return mode


def _text(key: str, raw: str) -> str:
    return raw


Parser = Callable[[str, str], Any]

#: name as users write it -> (where it applies, parser of its value)
OPTIONS: dict[str, tuple[Use, Parser]] = {
    # where the log service and the mesh are (``start_service`` sets these for every read/write)
    "endpoint": (Use.ANY, _text),
    "token": (Use.ANY, _text),
    "serverKey": (Use.ANY, _text),
    "interface": (Use.ANY, _text),
    "port": (Use.ANY, _port),
    "interval": (Use.ANY, _seconds),
    "evasive": (Use.ANY, _seconds),
    "silent": (Use.ANY, _seconds),
    "expired": (Use.ANY, _seconds),
    "discovery": (Use.ANY, _text),
    "seeds": (Use.ANY, _text),
    # the driver's MTL gateway (``start_service(..., gateway=...)``): writes go through it
    "gateway": (Use.ANY, _text),
    "gatewayUser": (Use.ANY, _text),
    "gatewayPassword": (Use.ANY, _text),
    # reads
    "group": (Use.ANY, _text),
    "groups": (Use.READ, _text),
    "partitions": (Use.READ, positive_int),
    "startingOffsets": (Use.READ, starting_spec),
    "startingTimestamp": (Use.READ, milliseconds),
    "startingOffsetsByTimestamp": (Use.READ, times_by_group),
    "startingOffsetsByTimestampStrategy": (Use.READ, timestamp_strategy),
    "endingOffsets": (Use.BATCH_READ, offset_spec),
    "maxOffsetsPerTrigger": (Use.STREAM_READ, positive_int),
    "minOffsetsPerTrigger": (Use.STREAM_READ, positive_int),
    "maxTriggerDelay": (Use.STREAM_READ, duration),
    "consumerName": (Use.STREAM_READ, _name),
    "includeHeaders": (Use.READ, boolean),
    "failOnDataLoss": (Use.READ, boolean),
    "decode": (Use.READ, _decode),
    "autoJoin": (Use.STREAM_READ, boolean),
    # writes
    "service": (Use.WRITE, _text),
    "action": (Use.WRITE, _text),
    "version": (Use.WRITE, _text),
    "category": (Use.WRITE, _text),
    "column": (Use.WRITE, _text),
    "peers": (Use.WRITE, positive_int),
    "discoveryTimeout": (Use.WRITE, _seconds),
    "requireDelivery": (Use.WRITE, boolean),
    "timeout": (Use.WRITE, _seconds),
    "maxInFlight": (Use.WRITE, positive_int),
    "retries": (Use.WRITE, _count),
    "keyFile": (Use.WRITE, _text),
    "allowedKeys": (Use.WRITE, _text),
    # Spark's own, handed to every streaming sink and path-based source
    "checkpointLocation": (Use.ANY, _text),
    "path": (Use.ANY, _text),
}
_BY_KEY = {name.lower(): name for name in OPTIONS}
_WHERE = {Use.BATCH_READ: "a batch read (spark.read)", Use.STREAM_READ: "a stream "
          "(spark.readStream)", Use.WRITE: "a write (df.write / writeStream)"}


def name_of(key: str) -> str:
    """The documented spelling of a lower-cased option key."""
    return _BY_KEY.get(key, key)


def check(options: Mapping[str, str]) -> None:
    """Every key known and every value well-formed; ``ValueError`` naming the first bad one."""
    for key, raw in options.items():
        name = _BY_KEY.get(key.lower())
        if name is None:
            close = difflib.get_close_matches(key.lower(), list(_BY_KEY), n=1, cutoff=0.75)
            hint = f"; did you mean {_BY_KEY[close[0]]}?" if close else ""
            raise ValueError(f"unknown option {key!r} for the peermesh format{hint} "
                             f"(known: {', '.join(sorted(OPTIONS, key=str.lower))})")
        if raw is not None and raw != "":
            OPTIONS[name][1](name, str(raw))


def check_use(given: Mapping[str, str], use: Use) -> None:
    """Options the user gave that do not apply to ``use`` are a ``ValueError``."""
    for key in given:
        name = name_of(key.lower())
        applies = OPTIONS.get(name, (Use.ANY, _text))[0]
        if not applies & use:
            raise ValueError(f"option {name} does not apply to {_WHERE[use]}")


def parsed(options: Mapping[str, str], name: str, default: Any = None) -> Any:
    """The parsed value of option ``name`` (lower-cased in ``options``), or ``default``."""
    raw: Optional[str] = options.get(name.lower())
    if raw is None or raw == "":
        return default
    return OPTIONS[name][1](name, str(raw))
