"""Zyre's leader election as tables: one node's waves (``election.Election``), then whole
groups of them exchanging ELECT and LEADER in every order, then sessions in memory."""

from __future__ import annotations

import random
import uuid as uuid_module
from typing import Callable, Optional, Sequence
from uuid import UUID

import pytest

from peermesh.config import NodeConfig
from peermesh.events import EventType
from peermesh.wire import zre
from peermesh.zre.election import (Elected, Election, SendElect, SendLeader, parse_id,
                                   zyre_id)
from peermesh.zre.session import Session

from sessionharness import Harness

A, B, C, D = "A" * 32, "B" * 32, "C" * 32, "D" * 32  # IDs in the order they win

# (me, neighbours, [(input, sender, id) ...], actions expected after each input)
# input: "start", "elect" or "leader"
TABLE = [
    ("a lone challenger wins at once",
     A, [], [("start", None, None)], [[Elected(A)]]),
    ("a challenger sends its wave to every neighbour",
     B, ["a", "c"], [("start", None, None)], [[SendElect(("a", "c"), B)]]),
    ("a leaf joins a wave and echoes it to its father at once",
     C, ["b"], [("elect", "b", B)], [[SendElect(("b",), B)]]),
    ("an inner node passes the wave on, and echoes once every neighbour has answered",
     C, ["b", "d"], [("elect", "b", B), ("elect", "d", B)],
     [[SendElect(("d",), B)], [SendElect(("b",), B)]]),
    ("a lower challenger replaces the wave; counts restart",
     C, ["a", "b", "d"], [("elect", "b", B), ("elect", "a", A), ("elect", "b", A),
                          ("elect", "d", A)],
     [[SendElect(("a", "d"), B)], [SendElect(("b", "d"), A)], [],
      [SendElect(("a",), A)]]),
    ("a higher challenger dies here",
     B, ["c"], [("start", None, None), ("elect", "c", C)], [[SendElect(("c",), B)], []]),
    ("the challenger wins when every neighbour echoed, and says so to all",
     A, ["b", "c"], [("start", None, None), ("elect", "b", A), ("elect", "c", A)],
     [[SendElect(("b", "c"), A)], [], [SendLeader(("b", "c"), A)]]),
    ("a LEADER is passed on once; the last one ends the election",
     C, ["a", "b"], [("elect", "a", A), ("elect", "b", A), ("leader", "a", A),
                     ("leader", "b", A)],
     [[SendElect(("b",), A)], [SendElect(("a",), A)], [SendLeader(("a", "b"), A)],
      [Elected(A)]]),
    ("the winner does not pass LEADER on; it is elected when all have answered",
     A, ["b", "c"], [("start", None, None), ("elect", "b", A), ("elect", "c", A),
                     ("leader", "b", A), ("leader", "c", A)],
     [[SendElect(("b", "c"), A)], [], [SendLeader(("b", "c"), A)], [], [Elected(A)]]),
    ("a LEADER without a wave is ignored",
     B, ["a"], [("leader", "a", A)], [[]]),
    ("a new start drops the wave under way",
     B, ["c"], [("elect", "c", C), ("start", None, None)],
     [[SendElect(("c",), C)], [SendElect(("c",), B)]]),
]


@pytest.mark.parametrize("me, neighbours, inputs, expected", [c[1:] for c in TABLE],
                         ids=[c[0] for c in TABLE])
def test_election_table(me: str, neighbours: list[str], inputs: list, expected: list) -> None:
    election: Election[str] = Election(me)
    for (kind, sender, text), want in zip(inputs, expected, strict=True):
        if kind == "start":
            got = election.start("g", neighbours)
        elif kind == "elect":
            got = election.on_elect("g", sender, text, neighbours)
        else:
            got = election.on_leader("g", sender, text, neighbours)
        assert got == want, (kind, sender, text)


def test_ids_are_zyre_upper_case_hex() -> None:
    uuid = UUID("0123456789abcdef0123456789abcdef")
    assert zyre_id(uuid) == "0123456789ABCDEF0123456789ABCDEF"
    assert parse_id(zyre_id(uuid)) == uuid
    assert parse_id(uuid.hex) == uuid
    for bad in ("", "A" * 31, "A" * 33, "G" * 32, "0123456789abcdef-123456789abcdef"):
        assert parse_id(bad) is None


def run_group(ids: Sequence[str], contest: Sequence[str], seed: int) -> dict[str, list[str]]:
    """A full mesh of nodes ``ids``; each of ``contest`` starts; messages are delivered in
    a random order (per sender-receiver pair in order, as on a ZeroMQ link). Returns each
    node's Elected leaders."""
    rng = random.Random(seed)
    nodes = {i: Election[str](i) for i in ids}
    queues: dict[tuple[str, str], list] = {}
    elected: dict[str, list[str]] = {i: [] for i in ids}

    def act(node: str, actions: list) -> None:
        for action in actions:
            if isinstance(action, Elected):
                elected[node].append(action.leader)
                continue
            for to in action.to:
                queues.setdefault((node, to), []).append(action)

    for node in contest:
        act(node, nodes[node].start("g", [i for i in ids if i != node]))
    while any(queues.values()):
        pair = rng.choice([p for p, q in queues.items() if q])
        action = queues[pair].pop(0)
        sender, node = pair
        others = [i for i in ids if i != node]
        if isinstance(action, SendElect):
            act(node, nodes[node].on_elect("g", sender, action.challenger, others))
        else:
            act(node, nodes[node].on_leader("g", sender, action.leader, others))
    return elected


@pytest.mark.parametrize("size", [2, 3, 5, 12])
@pytest.mark.parametrize("seed", range(6))
def test_every_member_learns_the_lowest_challenger(size: int, seed: int) -> None:
    rng = random.Random(seed * 100 + size)
    ids = [uuid_module.UUID(int=rng.getrandbits(128)).hex.upper() for _ in range(size)]
    contest = rng.sample(ids, rng.randint(1, size))
    elected = run_group(ids, contest, seed)
    assert all(leaders == [min(contest)] for leaders in elected.values()), elected


# --- sessions in memory: the election through the peer table ----------------

CONFIG = NodeConfig(interval=1.0, evasive=5.0, silent=10.0, expired=30.0)


class Wire:
    """The link from one session to another: frames wait in ``Mesh.queue``."""

    limit = 1 << 30
    stalled_since: Optional[float] = None

    def __init__(self, mesh: "Mesh", source: "Session", target: UUID) -> None:
        self.mesh, self.source, self.target = mesh, source, target
        self.closed = False

    def offer(self, frames: Sequence[bytes]) -> None:
        if not self.closed:
            self.mesh.queue.append((self.source, self.target, list(frames)))

    def offer_each(self, messages: Sequence[Sequence[bytes]]) -> int:
        for frames in messages:
            self.offer(frames)
        return len(messages)

    def queued(self) -> int:
        return 0

    def has_room(self) -> bool:
        return True

    def close(self, linger: float = 0) -> None:
        self.closed = True


class Mesh:
    """Sessions that reach each other through in-memory wires, all at time 0; each is
    driven by a ``Harness`` (``.session`` is the session)."""

    def __init__(self, seed: int = 0) -> None:
        self.sessions: dict[UUID, Harness] = {}
        self.queue: list[tuple[Session, UUID, list[bytes]]] = []
        self.rng = random.Random(seed)
        self.now = 0.0

    def add(self, name: str, groups: Sequence[str] = (), contest: Sequence[str] = ()) -> Harness:
        uuid = uuid_module.UUID(int=self.rng.getrandbits(128), version=4)  # (reproducible)
        h = Harness(CONFIG, uuid=uuid, name=name,
                    endpoint=f"tcp://10.0.0.{len(self.sessions) + 1}:5000",
                    link=lambda peer, endpoint: Wire(self, h.session, peer))
        for group in contest:
            h.contest(group)
        for group in groups:
            h.add_group(group)
        for other in self.sessions.values():
            assert other.session.endpoint is not None and h.session.endpoint is not None
            other.appeared(uuid, h.session.endpoint, 0.0)
            h.appeared(other.session.uuid, other.session.endpoint, 0.0)
        self.sessions[uuid] = h
        return h

    def pump(self) -> None:
        """Deliver everything, in a random order between pairs, in order within one."""
        while self.queue:
            first = self.rng.randrange(len(self.queue))
            source, target = self.queue[first][:2]
            # the oldest message of that pair goes first (a link keeps order)
            index = next(i for i, m in enumerate(self.queue) if m[0] is source and m[1] == target)
            _, _, frames = self.queue.pop(index)
            h = self.sessions.get(target)
            if h is not None and h.session.running:
                h.receive(b"\x01" + source.uuid.bytes, frames, self.now)

    def settle(self, check: Callable[[], bool], rounds: int = 6) -> None:
        """Deliver everything; while ``check()`` fails, let ``interval`` pass (the timers:
        a wave not over by then starts again) and deliver again, up to ``rounds`` times."""
        self.pump()
        for _ in range(rounds):
            if check():
                return
            self.now += CONFIG.interval
            for h in self.sessions.values():
                h.timer(self.now)
            self.pump()
        assert check(), {h.session.name: h.session.leaders for h in self.sessions.values()}

    def leaders(self, group: str) -> dict[str, list[Optional[str]]]:
        """Each session's LEADER events for ``group`` (the winner's name), then forgotten."""
        got = {}
        for h in self.sessions.values():
            got[h.session.name] = [e.name for e in h.events
                                   if e.type is EventType.LEADER and e.group == group]
            h.events.clear()
        return got


def test_sessions_elect_the_lowest_contester_and_non_contesters_take_part() -> None:
    mesh = Mesh(seed=1)
    sessions = [mesh.add(n, groups=["g"], contest=["g"] if n != "plain" else []).session
                for n in ("one", "two", "plain")]
    winner = min((s for s in sessions if s.name != "plain"), key=lambda s: s.uuid.hex)
    mesh.settle(lambda: all(s.leaders.get("g") == winner.uuid for s in sessions))
    leaders = mesh.leaders("g")
    assert all(names[-1] == winner.name for names in leaders.values()), leaders


@pytest.mark.parametrize("seed", range(8))
def test_a_leader_that_leaves_is_replaced(seed: int) -> None:
    mesh = Mesh(seed=seed)
    sessions = [mesh.add(f"n{i}", groups=["g"], contest=["g"]).session for i in range(4)]
    first = min(sessions, key=lambda s: s.uuid.hex)
    mesh.settle(lambda: all(s.leaders.get("g") == first.uuid for s in sessions))
    mesh.leaders("g")
    mesh.sessions[first.uuid].remove_group("g")
    rest = [s for s in sessions if s is not first]
    second = min(rest, key=lambda s: s.uuid.hex)
    mesh.settle(lambda: all(s.leaders.get("g") == second.uuid for s in rest))
    assert "g" not in first.leaders
    got = mesh.leaders("g")
    assert all(got[s.name][-1] == second.name for s in rest)


def test_a_leader_that_exits_is_replaced_and_the_last_one_leads_alone() -> None:
    mesh = Mesh(seed=3)
    a, b = (mesh.add(n, groups=["g"], contest=["g"]).session for n in ("a", "b"))
    winner, other = (a, b) if a.uuid.hex < b.uuid.hex else (b, a)
    mesh.settle(lambda: other.leaders.get("g") == winner.uuid == winner.leaders.get("g"))
    mesh.sessions[other.uuid].left(winner.uuid, mesh.now)  # a departure it was told of
    assert other.leaders["g"] == other.uuid
    assert mesh.leaders("g")[other.name][-2:] == [winner.name, other.name]


def test_elect_from_a_non_member_or_with_a_bad_id_is_ignored() -> None:
    mesh = Mesh(seed=4)
    driven = mesh.add("a", groups=["g"])
    b = mesh.add("b", groups=["other"]).session
    a = driven.session
    mesh.pump()
    peer = a.peers[b.uuid]
    want = peer.want
    # b is not in g at a: its ELECT is dropped (but its number counts)
    driven.receive(b"\x01" + b.uuid.bytes,
                   zre.encode(zre.Elect(want, "g", zyre_id(b.uuid))), 0.0)
    assert not a.election.waves and not a.peers[b.uuid].link.closed  # type: ignore
    assert peer.want == (want + 1) & 0xFFFF
    mesh.sessions[b.uuid].add_group("g")
    mesh.pump()
    driven.receive(b"\x01" + b.uuid.bytes, zre.encode(zre.Elect(peer.want, "g", "not-an-id")),
                   0.0)
    assert not a.election.waves
    assert not any(e.type is EventType.LEADER for e in driven.events)


@pytest.mark.parametrize("case, neighbours, inputs, gone, left, expected", [
    ("a wave that waited only on the member that left is echoed to its father",
     ["a", "d"], [("elect", "a", A)], "d", ["a"], [SendElect(("a",), A)]),
    ("our own wave that waited only on it wins",
     ["a", "c"], [("start", None, None), ("elect", "a", B)], "c", ["a"],
     [SendLeader(("a",), B)]),
    ("a wave whose father left dies here",
     ["a", "c"], [("elect", "a", A)], "a", ["c"], []),
    ("LEADERs that waited only on it end the election",
     ["a", "c"], [("elect", "a", A), ("elect", "c", A), ("leader", "a", A)], "c", ["a"],
     [Elected(A)]),
    ("alone in our own wave: the leader",
     ["c"], [("start", None, None)], "c", [], [Elected(B)]),
    ("an echo already sent is not sent again",
     ["a", "c"], [("elect", "a", A), ("elect", "c", A)], "c", ["a"], []),
], ids=lambda v: v if isinstance(v, str) and " " in v else None)
def test_a_member_that_leaves_does_not_stall_a_wave(case: str, neighbours: list[str],
                                                     inputs: list, gone: str, left: list[str],
                                                     expected: list) -> None:
    election: Election[str] = Election(B)
    for kind, sender, text in inputs:
        if kind == "start":
            election.start("g", neighbours)
        elif kind == "elect":
            election.on_elect("g", sender, text, neighbours)
        else:
            election.on_leader("g", sender, text, neighbours)
    assert election.member_gone("g", gone, left) == expected


def test_a_non_contesting_member_that_sees_the_leader_go_last_still_completes() -> None:
    # b contests and sees a (the leader) go first; c only takes part and still counts a
    # when b's wave arrives: the wave completes once c sees a go too.
    mesh = Mesh(seed=5)
    a, b = (mesh.add(n, groups=["g"], contest=["g"]).session for n in ("a", "b"))
    c = mesh.add("c", groups=["g"]).session
    leader = min((a, b), key=lambda s: s.uuid.hex)
    other = b if leader is a else a
    mesh.settle(lambda: all(s.leaders.get("g") == leader.uuid for s in (a, b, c)))
    mesh.leaders("g")
    mesh.sessions.pop(leader.uuid)       # the leader is gone (takes nothing in)
    mesh.sessions[other.uuid].left(leader.uuid, mesh.now)  # the other contester learns
    mesh.pump()                          # first: its wave reaches c, which still counts leader
    assert "g" not in other.leaders
    mesh.sessions[c.uuid].left(leader.uuid, mesh.now)  # c learns too: the wave completes
    mesh.pump()  # (no timer needed)
    assert other.leaders["g"] == other.uuid and c.leaders["g"] == other.uuid


def test_a_wave_not_over_in_time_is_forgotten() -> None:
    election: Election[str] = Election(B)
    election.start("g", ["a", "c"], now=10.0)
    election.on_elect("h", "a", A, ["a", "c"], now=12.0)
    assert election.stale(14.9, 5.0) == []
    assert election.stale(15.0, 5.0) == ["g"] and list(election.waves) == ["h"]
    assert election.stale(17.0, 5.0) == ["h"] and not election.waves


def test_the_challengers_own_elect_starts_its_wave_afresh() -> None:
    # c joined a's wave and echoed; a starts again (its wave stalled elsewhere): c counts
    # afresh and echoes again, instead of taking the new ELECT for one it already had.
    election: Election[str] = Election(C)
    assert election.on_elect("g", "a", A, ["a"]) == [SendElect(("a",), A)]
    assert election.on_elect("g", "a", A, ["a"]) == []  # the same wave: counted once
    assert election.on_elect("g", "a", A, ["a"], origin=True) == [SendElect(("a",), A)]
