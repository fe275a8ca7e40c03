"""The Flux trees the web view draws: each instance's ranks, parents and states.

Members advertise only their instance and endpoint on the mesh, and a member
that joined through a parent list is not on the mesh at all, so the tree is
asked of the instance itself: ``TreeWatch`` connects a Flux client (no rank)
to the elected root's endpoint and walks the tree with ``peermesh.info``
(``peermesh.flux.commands.walk_tree``, as ``peermesh flux tree`` does).

Bounds: only while someone looks (a page follows the stream, or the API
was asked within ``LINGER`` seconds); every ``INTERVAL`` seconds; at most
``MAX_INSTANCES`` instances and ``MAX_RANKS`` ranks each; ``TIMEOUT`` seconds
to connect and for each answer; only endpoints ``tcp://IP:PORT`` in the
network of the node's interface. A failure is shown as the tree's
``error``, never raised.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from ..io.endpoints import peer_endpoint
from .meshview import MeshView

__all__ = ["TreeWatch", "fetch_tree", "INTERVAL", "MAX_INSTANCES", "MAX_RANKS"]

log = logging.getLogger(__name__)

#: seconds between two walks of the trees
INTERVAL = 3.0
#: seconds to connect, and for each answer
TIMEOUT = 2.0
#: instances walked
MAX_INSTANCES = 4
#: ranks asked per instance
MAX_RANKS = 64
#: seconds the trees are still walked after the last ``/api/mesh``
LINGER = 30.0
_FIELDS = ("rank", "parent", "state", "error")
_TEXT = 200   # characters of a state or an error shown


def fetch_tree(endpoint: str, timeout: float = TIMEOUT,
               limit: int = MAX_RANKS) -> dict[str, Any]:
    """The tree of the instance whose member listens at ``endpoint``: ``{"ranks": [{rank,
    parent, state[, error]}], "size", "error"}`` (``error`` a line, or None)."""
    from ..flux.client import FluxClient
    from ..flux.commands import walk_tree

    client = FluxClient([endpoint], failover=0)
    try:
        client.connect(timeout)
        rows = walk_tree(client, timeout, limit)
    except Exception as exc:   # unreachable, refused, closed meanwhile: shown, not raised
        log.debug("web view: the Flux tree at %s: %s", endpoint, exc)
        return {"ranks": [], "size": None, "error": str(exc)[:_TEXT] or type(exc).__name__}
    finally:
        client.close()
    ranks = [{k: row[k][:_TEXT] if isinstance(row[k], str) else row[k]
              for k in _FIELDS if k in row} for row in rows]   # a member's text, bounded
    return {"ranks": ranks, "size": rows[0].get("size") if rows else None, "error": None}


class TreeWatch:
    """Walks the trees of ``view``'s instances while ``wanted()`` is true; ``changed()``
    after each round that changed a tree."""

    def __init__(self, view: MeshView, wanted: Callable[[], bool],
                 changed: Callable[[], None], interval: float = INTERVAL) -> None:
        self.view = view
        self.wanted = wanted
        self.changed = changed
        self.interval = interval
        self._greenlet: Any = None

    def poke(self) -> None:
        """Start walking (if not already)."""
        import gevent

        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)

    def close(self) -> None:
        greenlet, self._greenlet = self._greenlet, None
        if greenlet is not None:
            greenlet.kill(block=False)

    def _run(self) -> None:
        import gevent

        while self.wanted():
            started = time.monotonic()
            if self.walk():
                self.changed()
            gevent.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def walk(self) -> bool:
        """One round over the instances; whether any tree changed."""
        node = self.view.node
        interface = getattr(node, "interface", None)
        networks = [interface.network] if interface is not None else []
        changed = False
        roots = sorted(self.view.roots().items())[:MAX_INSTANCES]
        for instance, endpoint in roots:
            tree: dict[str, Any]
            if peer_endpoint(endpoint, networks) is None:
                tree = {"ranks": [], "size": None,
                        "error": f"endpoint {endpoint[:80]!r} is not tcp://IP:PORT in the "
                                 "node's network"}
            else:
                tree = fetch_tree(endpoint)
            changed |= self.view.set_tree(instance, tree)
        changed |= self.view.keep_trees(dict(roots))
        return changed
