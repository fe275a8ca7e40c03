"""A join unanswered is asked again after a wait that doubles per try (up to
``hello_timeout + heartbeat``): a rank 0 slow to answer many joins at once is not asked
again and again (the retry storm that kept 512 ranks from converging with a short timeout)."""

from __future__ import annotations

from peermesh.flux.core import Dial, State

from .harness import Tree


def test_an_unanswered_join_waits_twice_as_long_each_try() -> None:
    tree = Tree(k=2, hello_timeout=1.0, heartbeat=3.0)
    root = tree.add(root=True)
    tree.hung.add(root.endpoint)          # rank 0 takes the joins in, answers none
    tree.capture = []
    node = tree.add()
    dialed = []
    while tree.now < 20.0:
        dialed += [tree.now for source, output in tree.capture
                   if source == node.endpoint and isinstance(output, Dial)]
        tree.capture.clear()
        tree.advance(0.25, step=0.25)
    gaps = [b - a for a, b in zip(dialed, dialed[1:])]
    # (the first timeout is seen at the core's next tick) then 2 s, then 1 + 3 s at most
    assert gaps[1:4] == [2.0, 4.0, 4.0], dialed
    tree.hung.discard(root.endpoint)
    tree.advance(5.0, step=0.25)
    assert node.state is State.ONLINE and node.rank == 1
