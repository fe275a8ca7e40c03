"""Broker election: the pure decision over the mesh view (incl. partition and heal)."""

from __future__ import annotations

import json
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peermesh.overlay.election import (BROKER_HEADER, NFP_BROKER_HEADER, Candidate, Election,
                                       candidate_header, elect, parse_candidate)

U = [UUID(int=i) for i in range(10)]


def cand(i: int, priority: int = 0, mode: str = "auto") -> Candidate:
    return Candidate(U[i], priority, mode, f"n{i}")


def headers(c: Candidate) -> dict[str, str]:
    return {BROKER_HEADER: candidate_header(c.mode, c.priority)}


def enter(view: Election, c: Candidate):  # type: ignore[no-untyped-def]
    return view.peer_entered(c.uuid, headers(c), c.name)


def test_highest_priority_then_uuid() -> None:
    assert elect([]) is None
    assert elect([cand(1), cand(2)]) == cand(2)                       # same priority: UUID
    assert elect([cand(1, 5), cand(2), cand(3, 4)]) == cand(1, 5)     # priority first
    assert elect([cand(1, 100), cand(2, -5, "always")]) == cand(2, -5, "always")  # always wins
    assert elect([cand(3, 1, "always"), cand(2, 9, "always")]) == cand(2, 9, "always")


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(-3, 3), st.sampled_from(["auto",
                                                                                  "always"])),
                min_size=1, max_size=8, unique_by=lambda t: t[0]), st.randoms())
@settings(max_examples=200, deadline=None)
def test_every_view_order_elects_the_same(specs: list[tuple[int, int, str]], rnd: object) -> None:
    candidates = [cand(i, p, m) for i, p, m in specs]
    shuffled = list(candidates)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert elect(candidates) == elect(shuffled)


def test_header_round_trip_and_malformed_headers_ignored() -> None:
    c = cand(4, 7, "always")
    assert parse_candidate(U[4], headers(c), "n4") == c
    assert json.loads(headers(c)[BROKER_HEADER]) == {"mode": "always", "priority": 7}
    for bad in ("", "{", "[]", "7", json.dumps({"mode": "boss", "priority": 1}),
                json.dumps({"mode": "never", "priority": 1}), json.dumps({"mode": "auto"}),
                json.dumps({"mode": "auto", "priority": "1"}),
                json.dumps({"mode": "auto", "priority": True})):
        assert parse_candidate(U[4], {BROKER_HEADER: bad}) is None
    assert parse_candidate(U[4], {}) is None
    for mode, priority in (("never", 1), ("boss", 1), ("auto", "1"), ("auto", True)):
        with pytest.raises(ValueError):
            candidate_header(mode, priority)   # type: ignore[arg-type]


def test_an_older_peer_is_read_from_the_nfp_header_it_advertised() -> None:
    """Before the neutral header, candidacy was NFP's X-PM-NFP-BROKER (with the endpoint):
    a mixed mesh of old and new versions still elects one broker."""
    old = json.dumps({"mode": "auto", "priority": 3, "endpoint": "tcp://127.0.0.1:5001"})
    assert parse_candidate(U[4], {NFP_BROKER_HEADER: old}, "n4") == cand(4, 3)
    both = {NFP_BROKER_HEADER: old, **headers(cand(4, 8, "always"))}
    assert parse_candidate(U[4], both, "n4") == cand(4, 8, "always")   # the neutral one counts
    new_view, old_view = Election(cand(1, 5)), Election(None, U[7])
    change = new_view.peer_entered(U[4], {NFP_BROKER_HEADER: old}, "n4")
    assert change is None and new_view.broker == cand(1, 5)            # 5 beats the old 3
    assert old_view.peer_entered(U[4], {NFP_BROKER_HEADER: old}, "n4") is not None


def test_tracker_reelects_on_exit() -> None:
    me = cand(1, 0)
    view = Election(me)
    assert view.is_broker
    change = enter(view, cand(5, 3))
    assert change is not None and change.stepped_down and change.new == cand(5, 3)
    assert not view.is_broker
    assert view.peer_entered(U[6], {"X-other": "1"}) is None       # not a candidate
    assert enter(view, cand(2, 0)) is None      # worse than the broker
    change = view.peer_left(U[5])                                    # broker died / left
    assert change is not None and change.new == cand(2, 0) and not change.took_over
    change = view.peer_left(U[2])
    assert change is not None and change.took_over and view.is_broker
    assert view.peer_left(U[9]) is None


def test_non_candidate_follows_the_view() -> None:
    view = Election(None, U[0])
    assert view.broker is None and not view.is_broker
    change = enter(view, cand(3))
    assert change is not None and change.old is None and change.new == cand(3)
    assert not change.took_over and not change.stepped_down
    assert view.peer_left(U[3]).new is None  # type: ignore[union-attr]


def test_partition_heal_exactly_one_steps_down() -> None:
    """Two halves of a mesh each elected a broker; when they meet, exactly one steps down."""
    a, b = cand(1, 5), cand(2, 5)             # same priority: UUID decides (b wins)
    w = Election(None, U[7])                  # a worker that was on a's side
    side_a, side_b = Election(a), Election(b)
    enter(w, a)
    assert side_a.is_broker and side_b.is_broker and w.broker == a   # split brain, per side
    # heal: everyone sees everyone
    change_a = enter(side_a, b)
    change_b = enter(side_b, a)
    change_w = enter(w, b)
    assert change_a is not None and change_a.stepped_down and change_a.new == b
    assert change_b is None and side_b.is_broker                     # the winner stays
    assert change_w is not None and change_w.new == b                # the worker moves over
    assert [side_a.is_broker, side_b.is_broker].count(True) == 1


@given(st.lists(st.tuples(st.integers(-2, 2), st.sampled_from(["auto", "always"])),
                min_size=2, max_size=6), st.data())
@settings(max_examples=150, deadline=None)
def test_any_partition_heals_to_one_broker(specs: list[tuple[int, str]],
                                           data: st.DataObject) -> None:
    candidates = [cand(i, p, m) for i, (p, m) in enumerate(specs)]
    split = data.draw(st.integers(1, len(candidates) - 1))
    halves = [candidates[:split], candidates[split:]]
    views = {}
    for half in halves:
        for c in half:
            view = Election(c)
            for other in half:
                if other != c:
                    enter(view, other)
            views[c.uuid] = view
    assert sum(v.is_broker for v in views.values()) == 2            # one per side
    for c in candidates:                                            # heal
        for other in candidates:
            if other != c:
                enter(views[c.uuid], other)
    assert sum(v.is_broker for v in views.values()) == 1
    assert {v.broker for v in views.values()} == {elect(candidates)}
