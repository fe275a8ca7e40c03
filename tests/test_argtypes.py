"""The option types the commands share."""

from __future__ import annotations

import argparse

import pytest

from peermesh.argtypes import count, positive_count, seconds


def test_seconds_are_positive_and_finite() -> None:
    assert seconds("0.25") == 0.25 and seconds("3") == 3.0
    for bad, message in (("0", "must be a positive"), ("-1", "must be a positive"),
                         ("inf", "must be a positive"), ("nan", "must be a positive"),
                         ("soon", "is not a number of seconds")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            seconds(bad)


def test_counts_are_whole_numbers_within_their_range() -> None:
    assert count("0") == 0 and positive_count("1") == 1 and count("12") == 12
    for fn, bad, message in ((count, "-1", "must not be negative"),
                             (positive_count, "0", "must be 1 or more"),
                             (count, "1.5", "is not a whole number"),
                             (positive_count, "many", "is not a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            fn(bad)
