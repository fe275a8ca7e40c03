"""MTL profiles: which resources a client may lease and how content moves between them.

* ``test`` - the spec's profile: exactly one resource, ``resource``; content
  is never confirmed; every writer's content is fanned out to every reader
  that summoned it, on this gateway only.
* ``mesh`` - resources are ZRE groups of the gateway's mesh (under the
  virtual host's prefix); a writer's content is shouted into the group and
  handed to the gateway's own readers of it; a reader that summons a group
  receives the group's shouts. ``confirm: full`` is offered when the gateway
  has a store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Profile", "TEST", "MESH", "PROFILES"]


@dataclass(frozen=True, slots=True)
class Profile:
    """A profile: its name, confirm models, resources (None: any name) and whether its
    resources are mesh groups."""

    name: str
    confirms: frozenset[str]
    resources: Optional[frozenset[str]]
    mesh: bool

    def knows(self, resource: str) -> bool:
        """True if ``resource`` exists in this profile."""
        return self.resources is None or resource in self.resources


TEST = Profile("test", frozenset({"none"}), frozenset({"resource"}), mesh=False)
MESH = Profile("mesh", frozenset({"none", "full"}), None, mesh=True)
#: every profile peermesh implements, by (lower-case) name
PROFILES = {p.name: p for p in (TEST, MESH)}
