"""Requests reach a rank that attached out of its formula place, below a node that did too."""

from __future__ import annotations

from peermesh.flux.core import State
from peermesh.wire.flux import read_json

from .harness import Tree


def test_a_rank_attached_to_an_ancestor_is_reached_past_its_formula_parent() -> None:
    tree = Tree(k=2, hello_timeout=1.0)
    tree.grow(3)                          # ranks 0, 1, 2
    nine = tree.add(rank=9)               # its parent 4 is not there: attaches to rank 1
    four = tree.add(rank=4)               # rank 4 then attaches to rank 1 too
    assert (nine.parent_rank, four.parent_rank) == (1, 1)
    tree.hung.add(nine.endpoint)          # rank 9 cannot answer a hello for a while
    nineteen = tree.add(rank=19)          # formula parent 9, grandparent 4
    tree.advance(3.0)
    assert nineteen.state is State.ONLINE and nineteen.parent_rank == 4
    tree.hung.discard(nine.endpoint)
    tree.advance(1.0)
    root = tree.by_rank(0)
    handle = root.open_handle()
    for rank in (19, 9, 4):   # rank 1 has both 9 and 4 as children: 19 is below 4 only
        tree.rpc(root, handle, "peermesh.info", None, rank)
        (answer,) = tree.taken(root, handle)
        assert answer.errnum == 0, (rank, answer.payload)
        assert read_json(answer.payload)["rank"] == rank
