"""Option types shared by the commands: seconds and counts, refused with a clear message."""

from __future__ import annotations

import argparse

__all__ = ["seconds", "count", "positive_count"]


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):     # (also refuses NaN)
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def positive_count(text: str) -> int:
    """A whole number, 1 or more."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
