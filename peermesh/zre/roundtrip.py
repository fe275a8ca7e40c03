"""Round-trip times to one peer, from each PING to its PING-OK (sans-io: times passed in).

``RoundTrip.add(seconds)`` takes one sample; ``smoothed`` is the estimate as
TCP keeps it (RFC 6298: the first sample, then 7/8 old + 1/8 new), ``counts``
a histogram over ``BUCKETS`` (upper bounds in seconds, the last bucket is
everything above), which the metrics endpoint exports per peer. A peer holds
one of these once it has answered a PING; the memory is fixed per peer.
"""

from __future__ import annotations

from bisect import bisect_left

__all__ = ["RoundTrip", "BUCKETS"]

#: histogram bucket upper bounds (seconds); samples above the last fall into +Inf
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class RoundTrip:
    """Round-trip samples of one peer: the smoothed estimate, the last, a histogram."""

    __slots__ = ("smoothed", "last", "count", "total", "counts")

    def __init__(self) -> None:
        self.smoothed = 0.0
        self.last = 0.0
        self.count = 0
        self.total = 0.0                         # sum of every sample (seconds)
        self.counts = [0] * (len(BUCKETS) + 1)   # per bucket, not cumulative; last: +Inf

    def add(self, seconds: float) -> None:
        """Take one sample (negative ones, from a clock that stepped back, are ignored)."""
        if seconds < 0:
            return
        self.smoothed = seconds if not self.count else self.smoothed + (seconds - self.smoothed) / 8
        self.last = seconds
        self.count += 1
        self.total += seconds
        self.counts[bisect_left(BUCKETS, seconds)] += 1
