"""The shape of a config-booted flux-core instance, as flux mode reads it: ranks, parents,
subtrees, and the subtree status of a rank's children (flux-core's names and rules).

``read_config`` reads an instance's configuration file (``[bootstrap]`` and
``[tbon]``, TOML) for one host; ``FluxTree`` answers where a rank sits
(parent, children, which child's subtree holds a rank, ``overlay.topology``'s
JSON); ``FluxChild`` is one child's subtree as its parent sees it, and
``subtree_status`` folds the children's statuses into the rank's own, as
flux-core's ``subtree_status_update`` does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .topology import Topology, TopologyError

__all__ = ["FULL", "PARTIAL", "DEGRADED", "LOST", "OFFLINE", "STATUS_NAMES", "FluxTree",
           "FluxChild", "subtree_status", "read_config", "status_name"]

#: subtree statuses (flux-core's ``enum subtree_status``)
UNKNOWN, FULL, PARTIAL, DEGRADED, LOST, OFFLINE = range(6)
STATUS_NAMES = ("unknown", "full", "partial", "degraded", "lost", "offline")


def status_name(status: int) -> str:
    return STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "unknown"


@dataclass
class FluxChild:
    """A child rank of this one: its hostname (the configuration's), the UUID it said
    hello with (its ZeroMQ identity) and its subtree's status since ``since``."""

    rank: int
    hostname: str
    uuid: bytes = b""
    status: int = OFFLINE
    since: float = 0.0
    error: str = ""

    @property
    def online(self) -> bool:
        return self.status not in (OFFLINE, LOST)


def subtree_status(children: Sequence[FluxChild]) -> int:
    """A rank's subtree status from its children's: full when every child is, partial
    when one is partial or offline, degraded when one is degraded or lost."""
    status = FULL
    for child in children:
        if child.status in (DEGRADED, LOST):
            status = DEGRADED
        elif child.status in (PARTIAL, OFFLINE) and status == FULL:
            status = PARTIAL
    return status


class FluxTree:
    """The parent of every rank (``parents[0]`` is -1), seen from rank ``me``."""

    def __init__(self, parents: Sequence[int], me: int) -> None:
        size = len(parents)
        if not 0 <= me < size or parents[0] != -1 or any(
                not 0 <= p < size or p == r for r, p in enumerate(parents) if r):
            raise ValueError(f"not a tree of {size} ranks with rank {me} in it")
        self.parents = list(parents)
        self.me = me
        self.children: dict[int, list[int]] = {}
        for rank, parent in enumerate(parents):
            if rank:
                self.children.setdefault(parent, []).append(rank)
        #: descendant rank -> the child of ``me`` whose subtree holds it
        self.toward: dict[int, int] = {}
        for rank in range(1, size):
            hop, below, steps = rank, -1, 0
            while hop > 0:
                if self.parents[hop] == me:
                    below = hop
                hop, steps = self.parents[hop], steps + 1
                if steps > size:
                    raise ValueError(f"rank {rank} does not lead to rank 0 (a cycle)")
            if below > 0:
                self.toward[rank] = below

    @classmethod
    def kary(cls, size: int, k: int, me: int) -> "FluxTree":
        """flux-core's ``kary:K`` (``kary:0``: every rank a child of rank 0)."""
        topology = Topology(k)
        return cls([-1] + [topology.parent(r) for r in range(1, size)], me)

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def parent(self) -> int:
        return self.parents[self.me]

    def child_ranks(self, rank: Optional[int] = None) -> list[int]:
        return self.children.get(self.me if rank is None else rank, [])

    def subtree(self, rank: int) -> dict[str, Any]:
        """``overlay.topology``'s answer for ``rank``: ``{"rank", "size", "children"}``
        nested (built without recursion: a chain may be deep)."""
        order = [rank]
        nodes: dict[int, dict[str, Any]] = {}
        for hop in order:
            order.extend(self.children.get(hop, ()))
        for hop in reversed(order):
            kids = [nodes[c] for c in self.children.get(hop, ())]
            nodes[hop] = {"rank": hop, "size": 1 + sum(k["size"] for k in kids),
                          "children": kids}
        return nodes[rank]


def read_config(path: str, hostname: str) -> dict[str, Any]:
    """Where flux-core's config boot puts host ``hostname``: ``{"rank", "size",
    "hosts", "parents" (every rank's parent, -1 for rank 0), "parent" (the parent's
    connect URI; None on rank 0), "bind" (this rank's bind URI; None when it has no
    children), "cert", "config" (the file as JSON, what ``config.get`` answers)}``;
    ValueError naming what the file lacks. Ranks follow ``[[bootstrap.hosts]]`` (one
    plain host name per entry); parents follow ``tbon.topo`` (``kary:K``, or
    flux-core's config-boot default ``custom``: an entry's ``parent`` host, else rank
    0); a URI is the entry's ``connect`` / ``bind``, else ``bootstrap.default_connect``
    / ``default_bind`` with ``%h`` (host) and ``%p`` (``bootstrap.default_port``);
    ``curve_cert`` is relative to the file's directory."""
    import tomllib

    with open(path, "rb") as file:
        try:
            conf = tomllib.load(file)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not TOML: {exc}") from None
    boot = conf.get("bootstrap")
    if not isinstance(boot, dict):
        raise ValueError(f"{path}: no [bootstrap] table")
    hosts = boot.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, dict) and isinstance(
            h.get("host"), str) for h in hosts):
        raise ValueError(f"{path}: no [[bootstrap.hosts]] entries with a host")
    names = [h["host"] for h in hosts]
    if any("[" in name or "," in name for name in names):
        raise ValueError(f"{path}: host lists (node[0-3]) are not read here; one host an entry")
    if hostname not in names:
        raise ValueError(f"{path}: {hostname} is not among the hosts {names}")
    rank = names.index(hostname)
    cert = boot.get("curve_cert")
    if not isinstance(cert, str):
        raise ValueError(f"{path}: no bootstrap.curve_cert")
    tbon = conf.get("tbon")
    topo = tbon.get("topo", "custom") if isinstance(tbon, dict) else "custom"
    if topo == "custom":
        parents = [-1] + [names.index(h["parent"]) if h.get("parent") in names else 0
                          for h in hosts[1:]]
        try:
            tree = FluxTree(parents, rank)
        except ValueError:
            raise ValueError(f"{path}: the hosts' parent entries make no tree") from None
    else:
        try:
            tree = FluxTree.kary(len(names), Topology.parse(topo).k, rank)
        except TopologyError:
            raise ValueError(f"{path}: tbon.topo {topo!r} is not kary:K or custom") from None

    def uri(entry: int, key: str) -> Optional[str]:
        value = hosts[entry].get(key) or boot.get(f"default_{key}")
        if not isinstance(value, str):
            return None
        return value.replace("%h", names[entry]).replace("%p", str(boot.get("default_port", "")))

    parent = None
    if rank:
        parent = uri(tree.parent, "connect")
        if parent is None:
            raise ValueError(f"{path}: no connect URI for {names[tree.parent]} "
                             f"(rank {tree.parent})")
    bind = None
    if tree.child_ranks():
        bind = uri(rank, "bind")
        if bind is None:
            raise ValueError(f"{path}: {hostname} (rank {rank}) has children under {topo} "
                             "but no bind URI")
    return {"rank": rank, "size": len(names), "hosts": names, "parents": tree.parents,
            "parent": parent, "bind": bind, "config": conf,
            "cert": os.path.join(os.path.dirname(os.path.abspath(path)), cert)}
