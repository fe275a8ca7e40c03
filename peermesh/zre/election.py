"""Zyre's leader election (ELECT / LEADER), without I/O: one node's waves, group by group.

How it works
------------
Zyre elects a leader per group with an echo algorithm with extinction. Each
node of a group takes part; only the nodes that *contest* the group start
waves, and the wave of the lowest ID wins (IDs are UUIDs as 32 upper-case hex
digits, compared as strings, as Zyre does). Per group, a node keeps the
current active wave (``caw``: whose wave it supports), the ``father`` (the
neighbour it first heard that wave from) and who sent messages for it (Zyre
counts them: ``erec`` ELECTs, ``lrec`` LEADERs). A node's neighbours are the peers
it sees in the group.

* ``start``: a contesting node opens its own wave: ``caw`` = its ID, ELECT to
  every neighbour (alone in the group, it is the leader at once).
* ELECT(r) from p: a wave of a lower ID than ``caw`` (or none yet) replaces the
  current one: counts reset, ``father`` = p, ELECT(r) to every neighbour but p.
  A higher ID is ignored (that wave dies here). Then, if ``caw`` is r, it counts
  (``erec``); once every neighbour has echoed, the wave's own node has won (LEADER
  to every neighbour) and any other node echoes ELECT(r) to its father.
* LEADER(l) from p (ignored without a wave): the first one is passed on, as
  LEADER(``caw``), to every neighbour (not by the leader itself); once one has
  come from every neighbour the election is over: ``Elected(l)``, the wave is
  forgotten.

The node that owns this object turns the actions it returns into messages
(``SendElect``, ``SendLeader``) and its LEADER event (``Elected``). Deliberate
differences from Zyre, which only make stalls rarer: a wave completes once
every neighbour *present* has sent (checked again by ``member_gone``), so a
member that left during a wave does not stall it; a neighbour counts once
per wave however many ELECTs it sent (they come twice where waves of one
challenger overlap), and an ELECT from its challenger itself starts that
challenger's wave afresh (it started again); an ELECT of this node's own ID when its own wave is
over is ignored; and a wave not over after a bound is dropped
(``stale``). State is one small record per group the node is in; remote
input cannot grow it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Hashable
from dataclasses import dataclass
from typing import Generic, Optional, TypeVar, Union
from uuid import UUID

__all__ = ["Election", "Wave", "SendElect", "SendLeader", "Elected", "Action", "zyre_id",
           "parse_id"]

P = TypeVar("P", bound=Hashable)  # a neighbour: the node's key for a peer (its UUID)
_ID = re.compile(r"[0-9A-Fa-f]{32}")


def zyre_id(uuid: UUID) -> str:
    """A node's ID as Zyre writes it in ELECT and LEADER: 32 upper-case hex digits."""
    return uuid.hex.upper()


def parse_id(text: str) -> Optional[UUID]:
    """The UUID of an ID in an ELECT or LEADER, or None if it is not 32 hex digits."""
    return UUID(hex=text) if _ID.fullmatch(text) else None


@dataclass(frozen=True, slots=True)
class SendElect(Generic[P]):
    """Send ELECT(``challenger``) for the group to each of ``to``."""

    to: tuple[P, ...]
    challenger: str


@dataclass(frozen=True, slots=True)
class SendLeader(Generic[P]):
    """Send LEADER(``leader``) for the group to each of ``to``."""

    to: tuple[P, ...]
    leader: str


@dataclass(frozen=True, slots=True)
class Elected:
    """The group's election is over: ``leader`` won (report a LEADER event)."""

    leader: str


Action = Union[SendElect, SendLeader, Elected]


class Wave(Generic[P]):
    """One group's election state at one node."""

    __slots__ = ("caw", "father", "heard", "told", "leader", "echoed", "since")

    def __init__(self, caw: Optional[str] = None, father: Optional[P] = None,
                 since: float = 0.0) -> None:
        self.caw = caw          # the ID whose wave this node supports
        self.father = father    # the neighbour that wave came from first
        self.heard: set[P] = set()  # neighbours whose ELECT for it came (Zyre's count, erec)
        self.told: set[P] = set()   # neighbours whose LEADER came (lrec)
        self.leader: Optional[str] = None
        self.echoed = False     # its echo (or, for its own wave, LEADER) went out
        self.since = since      # when this node joined the wave

    @property
    def erec(self) -> int:
        """ELECTs received for the wave (from distinct neighbours)."""
        return len(self.heard)

    @property
    def lrec(self) -> int:
        """LEADERs received (from distinct neighbours)."""
        return len(self.told)


def _all(got: set[P], neighbours: Collection[P]) -> bool:
    """Every neighbour is in ``got`` (the count first: cheap while it falls short)."""
    return len(got) >= len(neighbours) and got.issuperset(neighbours)


class Election(Generic[P]):
    """The waves one node (``me``, its ID) takes part in, by group."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.waves: dict[str, Wave[P]] = {}

    def running(self, group: str) -> bool:
        """True while a wave of ``group`` is under way here."""
        wave = self.waves.get(group)
        return wave is not None and wave.caw is not None

    def forget(self, group: str) -> None:
        """Drop ``group``'s wave (the node left the group)."""
        self.waves.pop(group, None)

    def start(self, group: str, neighbours: Collection[P], now: float = 0.0) -> list[Action]:
        """Challenge for ``group``: a new wave of this node's own, replacing one of a higher
        ID; none while a wave of a lower ID runs here (ours would die in it, and leaving
        it made this node pass on LEADER of its own ID, so the group ended split)."""
        if not neighbours:
            self.waves.pop(group, None)
            return [Elected(self.me)]
        running = self.waves.get(group)
        if running is not None and running.caw is not None and running.caw < self.me:
            return []
        self.waves[group] = Wave(self.me, since=now)
        return [SendElect(tuple(neighbours), self.me)]

    def stale(self, now: float, bound: float) -> list[str]:
        """Forget the waves joined ``bound`` seconds ago or more and still not over; their
        groups (a contester then starts again: a wave can stall where members saw the
        group's membership differently while it ran)."""
        groups = [g for g, w in self.waves.items() if w.caw is not None and now - w.since >= bound]
        for group in groups:
            del self.waves[group]
        return groups

    def on_elect(self, group: str, sender: P, challenger: str,
                 neighbours: Collection[P], now: float = 0.0,
                 origin: bool = False) -> list[Action]:
        """ELECT(``challenger``) from ``sender``; ``neighbours``: the group's peers now;
        ``origin``: the sender is the challenger (a challenger sends its own ELECT only
        when it starts a wave, so one of a wave this node is in is a new wave)."""
        actions: list[Action] = []
        wave = self.waves.get(group)
        if challenger == self.me and (wave is None or wave.caw != self.me):
            return []  # an echo of a wave of ours that is over: nothing to join
        if wave is None:
            wave = self.waves[group] = Wave()
        if wave.caw is None or challenger < wave.caw or (origin and challenger == wave.caw):
            wave.caw, wave.father = challenger, sender  # a better (or new) wave: join it
            wave.heard, wave.told = set(), set()
            wave.leader = None
            wave.echoed = False
            wave.since = now
            others = tuple(p for p in neighbours if p != sender)
            if others:
                actions.append(SendElect(others, challenger))
        if wave.caw == challenger:
            wave.heard.add(sender)
            actions.extend(self._echo(wave, neighbours))
        return actions

    def _echo(self, wave: Wave[P], neighbours: Collection[P]) -> list[Action]:
        """Once every neighbour has echoed: LEADER for our own wave, else the echo to the
        father (each once)."""
        if wave.echoed or wave.caw is None or not _all(wave.heard, neighbours):
            return []
        wave.echoed = True
        if wave.caw == self.me:
            return [SendLeader(tuple(neighbours), self.me)]
        if wave.father is not None:
            return [SendElect((wave.father,), wave.caw)]
        return []

    def on_leader(self, group: str, sender: P, leader: str,
                  neighbours: Collection[P]) -> list[Action]:
        """LEADER(``leader``) from ``sender``; ``neighbours``: the group's peers now."""
        wave = self.waves.get(group)
        if wave is None or wave.caw is None:
            return []  # no wave here (reset meanwhile): Zyre ignores it too
        actions: list[Action] = []
        if leader != self.me and not wave.told:
            actions.append(SendLeader(tuple(neighbours), wave.caw))
        wave.told.add(sender)
        wave.leader = leader
        if _all(wave.told, neighbours):
            del self.waves[group]
            actions.append(Elected(leader))
        return actions

    def member_gone(self, group: str, gone: P, neighbours: Collection[P]) -> list[Action]:
        """``gone`` left ``group`` (``neighbours``: those left): a wave that waited only on
        it completes; one whose father it was dies here (its challenger starts again)."""
        wave = self.waves.get(group)
        if wave is None or wave.caw is None:
            return []
        if wave.father == gone and wave.caw != self.me:
            del self.waves[group]
            return []
        if wave.told and wave.leader is not None and _all(wave.told, neighbours):
            del self.waves[group]
            return [Elected(wave.leader)]
        if not neighbours and wave.caw == self.me:
            del self.waves[group]
            return [Elected(self.me)]
        return self._echo(wave, neighbours)
