"""Values the commands and the API take, refused with a clear message: seconds, counts, text.

The option types raise ``argparse.ArgumentTypeError``; argparse is imported only
then, so a command that never parses a bad option never loads it.
"""

from __future__ import annotations

__all__ = ["is_seconds", "seconds", "count", "positive_count", "utf8", "text", "cidr"]


def is_seconds(value: object) -> bool:
    """True for a positive, finite number (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and 0 < value < float("inf")


def seconds(text: str) -> float:
    """Option type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise _refused(f"{text!r} is not a number of seconds") from None
    if not is_seconds(value):
        raise _refused(f"{text!r} must be a positive number of seconds")
    return value


def count(text: str) -> int:
    """Option type: a whole number, 0 or more."""
    value = _whole(text)
    if value < 0:
        raise _refused(f"{text!r} must not be negative")
    return value


def positive_count(text: str) -> int:
    """Option type: a whole number, 1 or more."""
    value = _whole(text)
    if value < 1:
        raise _refused(f"{text!r} must be 1 or more")
    return value


def utf8(value: str) -> str:
    """Option type: text that is UTF-8 (a command line is bytes: a Latin-1 name is refused
    here, naming the argument, rather than when it is first sent)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        import os

        raise _refused(f"{os.fsencode(value)!r} is not UTF-8 text") from None
    return value


def text(value: str) -> str:
    """Option type: a name, group or target: UTF-8 and not empty."""
    if not value.strip():
        raise _refused("must not be empty")
    return utf8(value)


def cidr(value: str) -> str:
    """Option type: a network in CIDR form (``10.0.0.0/24``; a bare address is one host)."""
    import ipaddress

    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise _refused(f"{value!r} is not a network (CIDR, e.g. 10.0.0.0/24)") from None
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _refused(f"{text!r} is not a whole number") from None


def _refused(message: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(message)
