"""The agent's ops that act on its node: peers, groups, join, leave, contest, leader,
shout and whisper.

Each op takes a request's ``args`` (a map, as ``peermesh.agent.protocol``
lists them) and returns its result, or raises ``OpRefused`` (with the reply's
code), a ``PeermeshError`` of the node, or ``ValueError``/``TypeError``: the
server (``peermesh.agent.server``) turns each into an error reply. An op that
waits for the mesh (``wait``) waits through ``wait_change``, the server's
wake-up on any event of the node; ``wait`` is at most ``MAX_WAIT`` seconds.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from ..errors import AmbiguousPeerError, PeermeshError, UnknownPeerError
from .resolve import resolve_peer, settle_time

__all__ = ["MeshOps", "OpRefused", "MAX_WAIT"]

#: longest ``wait`` argument, in seconds
MAX_WAIT = 3600.0


class OpRefused(PeermeshError):
    """An op refused its request: ``code`` (``bad-args``, ``not-found``, ``ambiguous``)
    is the error reply's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class MeshOps:
    """The ops on ``node`` (a started ``Node``) by name, in ``by_name``.

    ``started``: when the agent started (monotonic), from which ``settle_time``
    counts; ``wait_change(deadline)``: waits until the mesh changes or
    ``deadline``.
    """

    def __init__(self, node: Any, started: float,
                 wait_change: Callable[[float], Any]) -> None:
        self.node = node
        self.started = started
        self._wait_change = wait_change
        #: op name -> its call (args -> result)
        self.by_name: dict[str, Callable[[dict[str, Any]], Any]] = {
            "peers": self.peers, "groups": self.groups, "join": self.join,
            "leave": self.leave, "contest": self.contest, "leader": self.leader,
            "shout": self.shout, "whisper": self.whisper,
        }

    def _settled_at(self) -> float:
        """When every peer on the LAN has beaconed at least once since the agent started."""
        return self.started + settle_time(self.node.config)

    def peers(self, args: dict[str, Any]) -> Any:
        """Peers with their liveness (``PeerInfo.to_dict``) and ``broker``."""
        from ..overlay.election import peer_entries

        group = _opt_str(args, "group")
        wait = _wait_arg(args)
        settled = min(self._settled_at(), time.monotonic() + wait)
        while time.monotonic() < settled:
            self._wait_change(settled)
        node = self.node
        uuids = node.peers_by_group(group) if group is not None else node.peers()
        infos = []
        for uuid in uuids:
            try:
                infos.append(node.peer_info(uuid))
            except Exception:  # gone meanwhile
                continue
        infos.sort(key=lambda info: (info.name, info.uuid.hex))
        return peer_entries(node, infos)

    def groups(self, args: dict[str, Any]) -> Any:
        node = self.node
        leaders = {g: u.hex for g in node.groups() if (u := node.leader(g)) is not None}
        return {"joined": node.groups(), "known": node.known_groups(), "leaders": leaders}

    def contest(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        self.node.contest(group)
        return {"group": group, "contested": self.node.contested()}

    def leader(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        leader = self.node.leader(group)
        return {"group": group, "leader": leader.hex if leader is not None else None,
                "self": leader == self.node.uuid}

    def join(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        changed = group not in self.node.groups()
        self.node.join(group)
        return {"group": group, "changed": changed, "groups": self.node.groups()}

    def leave(self, args: dict[str, Any]) -> Any:
        group = _req_str(args, "group")
        changed = group in self.node.groups()
        self.node.leave(group)
        return {"group": group, "changed": changed, "groups": self.node.groups()}

    def shout(self, args: dict[str, Any]) -> Any:
        node = self.node
        group, frames, wait, confirm = _send_args(args, "group")
        deadline = time.monotonic() + wait
        settled = min(self._settled_at(), deadline)
        while True:
            now = time.monotonic()
            members = node.peers_by_group(group)
            if members and now >= settled:
                break
            if now >= deadline:
                if members:
                    break
                raise OpRefused("not-found", f"no peer in group {group!r} appeared "
                                             f"within {wait:g} s")
            self._wait_change(deadline if not members else settled)
        node.shout(group, *frames)
        confirmed = node.flush(1.0) if confirm else None
        return {"group": group, "peers": len(members), "confirmed": confirmed}

    def whisper(self, args: dict[str, Any]) -> Any:
        node = self.node
        target, frames, wait, confirm = _send_args(args, "peer")
        try:
            uuid = resolve_peer(node, target, wait, self._settled_at(), self._wait_change)
        except AmbiguousPeerError as exc:
            raise OpRefused("ambiguous", str(exc)) from None
        except UnknownPeerError as exc:
            raise OpRefused("not-found", str(exc)) from None
        name = node.peer_name(uuid)
        node.whisper(uuid, *frames)
        confirmed = node.flush(1.0) if confirm else None
        return {"peer": uuid.hex, "name": name, "confirmed": confirmed}


def _send_args(args: dict[str, Any], key: str) -> tuple[str, list[bytes], float, bool]:
    """What ``shout`` and ``whisper`` take: ``key`` (the group or peer), the frames, ``wait``
    and ``confirm``."""
    return (_req_str(args, key), _frames_arg(args), _wait_arg(args),
            _bool_arg(args, "confirm", True))


def _req_str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise OpRefused("bad-args", f"{key} must be a non-empty string")
    return value


def _opt_str(args: dict[str, Any], key: str) -> Optional[str]:
    if args.get(key) is None:
        return None
    return _req_str(args, key)


def _wait_arg(args: dict[str, Any]) -> float:
    value = args.get("wait", 0)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_WAIT:
        raise OpRefused("bad-args", f"wait must be a number of seconds from 0 to {MAX_WAIT:g}")
    return float(value)


def _bool_arg(args: dict[str, Any], key: str, default: bool) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise OpRefused("bad-args", f"{key} must be true or false")
    return value


def _frames_arg(args: dict[str, Any]) -> list[bytes]:
    if "frames" in args:
        frames = args["frames"]
        if not isinstance(frames, list) or not frames or len(frames) > 1024:
            raise OpRefused("bad-args", "frames must be a list of 1 to 1024 byte strings")
    elif "message" in args:
        frames = [args["message"]]
    else:
        raise OpRefused("bad-args", "give message (bytes or str) or frames (a list)")
    out = []
    for part in frames:
        if isinstance(part, str):
            part = part.encode("utf-8")
        if not isinstance(part, bytes):
            raise OpRefused("bad-args", "message and frames must be bytes or strings")
        out.append(part)
    return out
