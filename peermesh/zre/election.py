"""Zyre's leader election (ELECT / LEADER), without I/O: one node's waves, group by group.

How it works
------------
Zyre elects a leader per group with an echo algorithm with extinction. Each
node of a group takes part; only the nodes that *contest* the group start
waves, and the wave of the lowest ID wins (IDs are UUIDs as 32 upper-case hex
digits, compared as strings, as Zyre does). Per group, a node keeps the
current active wave (``caw``: whose wave it supports), the ``father`` (the
neighbour it first heard that wave from) and two counts of messages received
for it (``erec`` ELECTs, ``lrec`` LEADERs). A node's neighbours are the peers
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
(``SendElect``, ``SendLeader``) and its LEADER event (``Elected``). One
deliberate difference from Zyre: a wave completes once the count reaches
the neighbours *present* (``>=``), so a member that left during a wave does
not stall it. State is one small record per group the node is in; remote
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

    __slots__ = ("caw", "father", "erec", "lrec", "leader")

    def __init__(self, caw: Optional[str] = None, father: Optional[P] = None) -> None:
        self.caw = caw          # the ID whose wave this node supports
        self.father = father    # the neighbour that wave came from first
        self.erec = 0           # ELECTs received for it
        self.lrec = 0           # LEADERs received
        self.leader: Optional[str] = None


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

    def start(self, group: str, neighbours: Collection[P]) -> list[Action]:
        """Challenge for ``group``: a new wave of this node's own, any earlier one dropped."""
        if not neighbours:
            self.waves.pop(group, None)
            return [Elected(self.me)]
        self.waves[group] = Wave(self.me)
        return [SendElect(tuple(neighbours), self.me)]

    def on_elect(self, group: str, sender: P, challenger: str,
                 neighbours: Collection[P]) -> list[Action]:
        """ELECT(``challenger``) from ``sender``; ``neighbours``: the group's peers now."""
        actions: list[Action] = []
        wave = self.waves.get(group)
        if wave is None:
            wave = self.waves[group] = Wave()
        if wave.caw is None or challenger < wave.caw:
            wave.caw, wave.father = challenger, sender  # a better wave: join it
            wave.erec = wave.lrec = 0
            wave.leader = None
            others = tuple(p for p in neighbours if p != sender)
            if others:
                actions.append(SendElect(others, challenger))
        if wave.caw == challenger:
            wave.erec += 1
            if wave.erec >= len(neighbours):
                if challenger == self.me:
                    actions.append(SendLeader(tuple(neighbours), self.me))
                elif wave.father is not None:
                    actions.append(SendElect((wave.father,), challenger))
        return actions

    def on_leader(self, group: str, sender: P, leader: str,
                  neighbours: Collection[P]) -> list[Action]:
        """LEADER(``leader``) from ``sender``; ``neighbours``: the group's peers now."""
        wave = self.waves.get(group)
        if wave is None or wave.caw is None:
            return []  # no wave here (reset meanwhile): Zyre ignores it too
        actions: list[Action] = []
        if leader != self.me and wave.lrec == 0:
            actions.append(SendLeader(tuple(neighbours), wave.caw))
        wave.lrec += 1
        wave.leader = leader
        if wave.lrec >= len(neighbours):
            del self.waves[group]
            actions.append(Elected(leader))
        return actions
