"""``AsyncNode.stats``: the node's table sizes and limit counters, as Node and ThreadedNode give."""

from __future__ import annotations

from peermesh.zre.session import COUNTERS
from test_aio import meet, run_async  # noqa: F401


def test_an_async_node_reports_its_stats(run_async):
    async def body(make):
        alice, bob = await make("alice"), await make("bob")
        await meet(alice, bob)
        stats = await alice.stats()
        assert stats["peers"] == 1 and stats["pending"] == 0
        assert set(COUNTERS) <= set(stats)

    run_async(body)
