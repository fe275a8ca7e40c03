"""Broker election: a pure decision over the mesh view (no sockets, no clock).

How it works
------------
Nodes that may be broker ("candidates") advertise it in their HELLO headers::

    X-PM-BROKER: {"mode": "auto"|"always", "priority": <int>}

Every node (candidate or not) keeps the set of candidates it can see - the
ready peers whose HELLO carried that header, plus itself if it is one - and
computes the broker with ``elect``: the candidate with the highest
``(mode is "always", priority, UUID)``. There is no vote and no message: the
mesh view is the shared state, so every node that sees the same peers
computes the same broker. When the broker leaves the mesh (its EXIT: a
port-0 beacon at once, or ZRE's ``expired`` timeout after a crash) the next
best candidate wins. When a partition heals, each side's broker sees the
other; both compute the same winner and exactly one steps down: the one
with the lower rank. A higher-ranked candidate joining later takes over the
same way (the rule has no memory, which is what makes the heal converge).

The election is neutral: it names a node, nothing more. Each overlay that
rides on the elected node (such as NFP's broker) advertises where it serves
in a header of its own.

Older peermesh versions advertised candidacy in NFP's ``X-PM-NFP-BROKER``
(the same JSON plus NFP's ``endpoint``); a peer without ``X-PM-BROKER`` is
read from that header, so a mesh of old and new versions elects one broker.

``Election`` tracks the view for one node and says when the broker changes
(``Change``); ``peermesh.overlay.broker.BrokerTracker`` feeds it a node's
events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional
from uuid import UUID

from .contract import header_json

__all__ = ["BROKER_HEADER", "NFP_BROKER_HEADER", "MODES", "Candidate", "Change",
           "Election", "elect", "elected", "peer_entries", "parse_candidate", "candidate_header"]

#: HELLO header of a broker candidate: JSON ``{"mode", "priority"}``
BROKER_HEADER = "X-PM-BROKER"
#: HELLO header of an NFP broker candidate: JSON ``{"mode", "priority", "endpoint"}`` (NFP
#: advertises it; the election also reads candidacy from it when ``X-PM-BROKER`` is absent)
NFP_BROKER_HEADER = "X-PM-NFP-BROKER"
#: candidacy choices: never (not a candidate), auto (candidate), always (candidate that
#: outranks every "auto" candidate)
MODES = ("never", "auto", "always")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A node that may be broker, as its HELLO headers describe it."""

    uuid: UUID
    priority: int
    mode: str = "auto"
    name: str = ""

    @property
    def rank(self) -> tuple[int, int, int]:
        """Higher wins: ``always`` before ``auto``, then priority, then UUID."""
        return (1 if self.mode == "always" else 0, self.priority, self.uuid.int)


@dataclass(frozen=True, slots=True)
class Change:
    """The broker this node sees changed from ``old`` to ``new`` (either may be None)."""

    old: Optional[Candidate]
    new: Optional[Candidate]
    me: Optional[UUID] = None

    @property
    def took_over(self) -> bool:
        """This node has just become the broker."""
        return self.new is not None and self.new.uuid == self.me

    @property
    def stepped_down(self) -> bool:
        """This node was the broker and no longer is."""
        return self.old is not None and self.old.uuid == self.me and not self.took_over


def elect(candidates: Iterable[Candidate]) -> Optional[Candidate]:
    """The broker among ``candidates``: highest (always, priority, UUID); None if empty."""
    return max(candidates, key=lambda c: c.rank, default=None)


def elected(members: Iterable[tuple[UUID, Mapping[str, str]]]) -> Optional[UUID]:
    """The UUID of the broker among ``members`` (UUID, HELLO headers): a node and its
    peers give the broker that node sees; None when none is a candidate."""
    winner = elect(c for c in (parse_candidate(uuid, headers) for uuid, headers in members)
                   if c is not None)
    return winner.uuid if winner is not None else None


def peer_entries(node: Any, infos: Iterable[Any]) -> list[dict[str, Any]]:
    """``PeerInfo.to_dict`` of each of ``infos`` with ``broker``: True for the broker that
    ``node`` (a ``Node``, on its hub) sees among itself and its peers."""
    infos = list(infos)
    broker = elected([(node.uuid, node.headers), *((i.uuid, i.headers) for i in infos)])
    return [{**info.to_dict(), "broker": info.uuid == broker} for info in infos]


def candidate_header(mode: str, priority: int) -> str:
    """The ``X-PM-BROKER`` header value of a candidate; ValueError for a bad mode or priority."""
    if mode not in ("auto", "always"):
        raise ValueError(f"broker mode {mode!r} is not 'auto' or 'always'")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError("broker priority must be an integer")
    return json.dumps({"mode": mode, "priority": priority}, separators=(",", ":"))


def parse_candidate(uuid: UUID, headers: Mapping[str, str], name: str = "") -> Optional[Candidate]:
    """The candidate a peer's headers describe; None if it is none or the header is malformed."""
    raw = headers.get(BROKER_HEADER)
    if raw is None:
        raw = headers.get(NFP_BROKER_HEADER)
        if raw is None:
            return None
    data = header_json(raw, BROKER_HEADER)
    if not isinstance(data, dict):
        return None
    mode, priority = data.get("mode"), data.get("priority")
    if mode not in ("auto", "always") or not isinstance(priority, int) \
            or isinstance(priority, bool):
        return None
    return Candidate(uuid, priority, mode, name)


class Election:
    """One node's view of the candidates and the broker it implies."""

    def __init__(self, me: Optional[Candidate] = None, my_uuid: Optional[UUID] = None) -> None:
        self.me = me
        self.my_uuid = me.uuid if me is not None else my_uuid
        self._candidates: dict[UUID, Candidate] = {}
        if me is not None:
            self._candidates[me.uuid] = me
        self.broker: Optional[Candidate] = elect(self._candidates.values())

    @property
    def is_broker(self) -> bool:
        """True while this node is the elected broker."""
        return self.broker is not None and self.broker.uuid == self.my_uuid

    def candidates(self) -> list[Candidate]:
        """Every candidate in view, best first."""
        return sorted(self._candidates.values(), key=lambda c: c.rank, reverse=True)

    def peer_entered(self, uuid: UUID, headers: Mapping[str, str],
                     name: str = "") -> Optional[Change]:
        """A peer said HELLO; the change of broker it causes, if any."""
        if uuid == self.my_uuid:
            return None
        candidate = parse_candidate(uuid, headers, name)
        if candidate is None:
            if self._candidates.pop(uuid, None) is None:
                return None
        else:
            self._candidates[uuid] = candidate
        return self._update()

    def peer_left(self, uuid: UUID) -> Optional[Change]:
        """A peer left the mesh; the change of broker it causes, if any."""
        if uuid == self.my_uuid or self._candidates.pop(uuid, None) is None:
            return None
        return self._update()

    def _update(self) -> Optional[Change]:
        new = elect(self._candidates.values())
        old = self.broker
        if new == old:
            return None
        self.broker = new
        return Change(old, new, self.my_uuid)
