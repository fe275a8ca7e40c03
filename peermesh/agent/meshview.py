"""What the web view shows: a node's picture of the mesh, kept up to date from its events.

``MeshView(node)`` reads the node's API only (``peers``, ``peer_info``,
``headers``, ``groups``, ``known_groups``, ``leader`` where the node has it),
so it runs on real and simulated nodes alike. ``snapshot()`` is the whole
picture; ``apply(event)`` folds one event in and returns what changed, as the
page receives it. Both are JSON-friendly dicts:

* ``node``: this node (``peer``, ``name``, ``address``, ``headers``,
  ``groups``).
* ``peers``: one record per ready peer, as ``PeerInfo.to_dict`` gives it
  (``peer``, ``name``, ``address``, ``headers``, ``groups``, and the
  liveness fields ``state``, ``last_heard``, ``rtt``, ``roles`` where the
  node reports them; ``state`` otherwise follows EVASIVE and SILENT).
* ``broker``: the UUID (hex) the broker election names from the peers'
  ``X-PM-BROKER`` headers, or None; ``leaders``: ``{group: UUID hex}`` when
  the node elects group leaders.
* ``flux``: ``{instance: {root, members, tree}}`` from the ``X-PM-FLUX-TREE``
  headers: the mesh peers of each Flux instance and the root they elect;
  ``tree`` is None, or what the instance itself said last (``set_tree``, as
  ``peermesh.agent.fluxtree`` asks it): ``{"ranks": [{rank, parent, state}],
  "size", "error"}``, ranks joined through a parent list included.
* ``events``: the last ``recent`` events (``seq``, ``time`` in seconds since
  the epoch, ``type``, ``peer``, ``name``, ``group``, ``size`` of the
  content in octets, ``reason``). Message content is never shown.

``apply`` returns ``{"event": ..., "peer": the peer's record (None when it
left, or for a message that changed nothing about it), "gone": UUID hex or
None, "broker": ..., "flux": ... (after ENTER and EXIT), "leaders": ...
(after LEADER)}``.
"""

from __future__ import annotations

import json
import time
from collections import deque
from typing import Any, Optional
from uuid import UUID

from ..overlay.election import Candidate, elect, parse_candidate

__all__ = ["MeshView", "RECENT"]

#: events the view keeps for a page that opens
RECENT = 200
_FLUX_HEADER = "X-PM-FLUX-TREE"   # peermesh.flux.overlay.FLUX_HEADER (not imported: no zmq here)
_LIVENESS = {"EVASIVE": "evasive", "SILENT": "silent"}
_MESSAGES = frozenset({"SHOUT", "WHISPER"})


def _flux_member(headers: Any) -> Optional[tuple[str, int, str]]:
    """``(instance, priority, endpoint)`` from a ``X-PM-FLUX-TREE`` header; None when absent or bad."""
    try:
        data = json.loads(headers.get(_FLUX_HEADER, ""))
    except (ValueError, TypeError):
        return None
    if not isinstance(data, dict):
        return None
    instance, priority = data.get("instance"), data.get("priority", 0)
    endpoint = data.get("endpoint", "")
    if not isinstance(instance, str) or not isinstance(priority, int) \
            or isinstance(priority, bool) or not isinstance(endpoint, str):
        return None
    return instance[:200], priority, endpoint[:256]


class MeshView:
    """One node's picture of the mesh (see the module docstring)."""

    def __init__(self, node: Any, recent: int = RECENT) -> None:
        self.node = node
        self.events: deque[dict[str, Any]] = deque(maxlen=recent)
        self._seq = 0
        self._candidates: dict[UUID, Candidate] = {}
        self._flux: dict[UUID, tuple[str, int, str]] = {}
        self._trees: dict[str, dict[str, Any]] = {}
        self._state: dict[UUID, str] = {}
        self.broker: Optional[str] = None
        me = node.uuid
        mine = parse_candidate(me, node.headers, node.name)
        if mine is not None:
            self._candidates[me] = mine
        flux = _flux_member(node.headers)
        if flux is not None:
            self._flux[me] = flux
        for uuid in node.peers():
            self._entered(uuid)
        self._elect()

    # --- the picture ----------------------------------------------------

    def me(self) -> dict[str, Any]:
        """This node, as a peer record."""
        node = self.node
        return {"peer": node.uuid.hex, "name": node.name, "address": node.endpoint,
                "headers": dict(node.headers), "groups": list(node.groups()), "self": True}

    def record(self, uuid: UUID) -> Optional[dict[str, Any]]:
        """A ready peer's record; None when the node does not know it (any more)."""
        try:
            record = dict(self.node.peer_info(uuid).to_dict())
        except Exception:   # gone meanwhile (UnknownPeerError), or not ready
            return None
        return self._complete(uuid, record)

    def _complete(self, uuid: UUID, record: dict[str, Any]) -> dict[str, Any]:
        if "state" not in record:   # a node that does not report liveness
            record["state"] = self._state.get(uuid, "alive")
        return record

    def peers(self) -> list[dict[str, Any]]:
        """Every ready peer's record."""
        infos = getattr(self.node, "peer_infos", None)
        if infos is not None:
            return [self._complete(info.uuid, dict(info.to_dict())) for info in infos()]
        records = (self.record(uuid) for uuid in self.node.peers())
        return [r for r in records if r is not None]

    def flux(self) -> dict[str, dict[str, Any]]:
        """``{instance: {root, members}}``: each Flux instance's members and elected root."""
        instances: dict[str, list[Candidate]] = {}
        for uuid, (instance, priority, _) in self._flux.items():
            instances.setdefault(instance, []).append(Candidate(uuid, priority))
        result = {}
        for instance, members in sorted(instances.items()):
            root = elect(members)
            result[instance] = {"root": root.uuid.hex if root else None,
                                "members": sorted(m.uuid.hex for m in members),
                                "tree": self._trees.get(instance)}
        return result

    def roots(self) -> dict[str, str]:
        """``{instance: the elected root's endpoint}`` (as its header names it)."""
        return {instance: self._flux[UUID(info["root"])][2]
                for instance, info in self.flux().items() if info["root"]}

    def set_tree(self, instance: str, tree: dict[str, Any]) -> bool:
        """What ``instance`` said its tree is (see the module docstring); whether it changed."""
        if self._trees.get(instance) == tree:
            return False
        self._trees[instance] = tree
        return True

    def keep_trees(self, instances: Any) -> bool:
        """Forget the trees of instances not in ``instances``; whether any was forgotten."""
        gone = [name for name in self._trees if name not in instances]
        for name in gone:
            del self._trees[name]
        return bool(gone)

    def leaders(self) -> dict[str, str]:
        """``{group: leader UUID hex}`` where the node elects group leaders (else empty)."""
        leader = getattr(self.node, "leader", None)
        if leader is None:
            return {}
        result = {}
        groups = set(self.node.groups()) | set(getattr(self.node, "known_groups", list)())
        for group in sorted(groups):
            try:
                uuid = leader(group)
            except Exception:   # no leader known for the group yet
                continue
            if uuid is not None:
                result[group] = getattr(uuid, "hex", str(uuid))
        return result

    def snapshot(self) -> dict[str, Any]:
        """The whole picture."""
        return {"node": self.me(), "peers": self.peers(), "broker": self.broker,
                "leaders": self.leaders(), "flux": self.flux(), "events": list(self.events),
                "time": time.time()}

    # --- events ---------------------------------------------------------

    def apply(self, event: Any) -> dict[str, Any]:
        """Fold ``event`` (an ``Event``) in; the change as the page gets it."""
        kind = str(getattr(event.type, "value", event.type))
        uuid = event.peer
        self._seq += 1
        item = {"seq": self._seq, "time": round(time.time(), 3), "type": kind,
                "peer": uuid.hex if uuid else None, "name": event.name, "group": event.group,
                "size": sum(map(len, event.frames or ())), "reason": event.reason}
        self.events.append(item)
        change: dict[str, Any] = {"event": item, "peer": None, "gone": None}
        if uuid is None:
            return change
        if kind == "EXIT":
            self._candidates.pop(uuid, None)
            self._flux.pop(uuid, None)
            self._state.pop(uuid, None)
            change["gone"] = uuid.hex
        else:
            if kind == "ENTER":
                self._entered(uuid)
            state = _LIVENESS.get(kind, "alive")
            before = self._state.get(uuid)
            self._state[uuid] = state
            if kind not in _MESSAGES or before != state:   # a message changes no record
                change["peer"] = self.record(uuid)
        if kind in ("ENTER", "EXIT"):
            self._elect()
            change["flux"] = self.flux()
        if kind == "LEADER":
            change["leaders"] = self.leaders()
        change["broker"] = self.broker
        return change

    def _entered(self, uuid: UUID) -> None:
        try:
            headers = self.node.peer_headers(uuid)
        except Exception:  # gone meanwhile
            return
        candidate = parse_candidate(uuid, headers)
        if candidate is not None:
            self._candidates[uuid] = candidate
        flux = _flux_member(headers)
        if flux is not None:
            self._flux[uuid] = flux

    def _elect(self) -> None:
        best = elect(self._candidates.values())
        self.broker = best.uuid.hex if best else None
