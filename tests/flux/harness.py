"""An in-memory tree of ``FluxCore`` objects: no sockets, plain-number time.

``Tree`` plays the network: a ``Send`` to ``PARENT`` reaches the core whose
endpoint the sender last dialed, a ``Send`` to an identity reaches the core
with that identity whose DEALER points at the sender. A send to a dead
core's identity is reported back as ``link_down`` (what ROUTER_MANDATORY
does on real sockets); sends to a dead parent vanish.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Any, Optional

from peermesh.flux.core import (
    PARENT, Deliver, Dial, Emit, FluxCore, FluxSettings, Hangup, Notice, Output,
)
from peermesh.flux.topology import Topology


class Tree:
    """Cores by endpoint, the links between them, and what each was handed."""

    def __init__(self, k: int = 2, **settings: Any) -> None:
        self.settings = FluxSettings(topology=Topology(k), **settings)
        self.now = 0.0
        self.cores: dict[str, FluxCore] = {}
        self.dialed: dict[str, Optional[str]] = {}
        self.dead: set[str] = set()
        self.hung: set[str] = set()   # alive to the network, silent: sends to it vanish
        self.delivered: dict[str, list[Deliver]] = {}
        self.notices: list[tuple[str, Notice]] = []
        self._queue: deque[tuple[str, Output]] = deque()
        self.capture: Optional[list[tuple[str, Output]]] = None

    def add(self, *, root: bool = False, rank: Optional[int] = None,
            bootstrap: Optional[list[str]] = None, name: str = "") -> FluxCore:
        endpoint = f"tcp://n{len(self.cores)}{name}"
        if bootstrap is None:
            bootstrap = [] if root else [next(iter(self.cores))]
        core = FluxCore(os.urandom(16), endpoint, settings=self.settings, rank=rank, root=root,
                        bootstrap=bootstrap)
        self.cores[endpoint] = core
        self.delivered[endpoint] = []
        self.dialed[endpoint] = None
        self.run(endpoint, core.start(self.now))
        return core

    def grow(self, count: int, k: int = 2) -> list[FluxCore]:
        """A root and ``count - 1`` nodes joining it, settled."""
        cores = [self.add(root=True)]
        for _ in range(count - 1):
            cores.append(self.add())
        return cores

    def by_rank(self, rank: int) -> FluxCore:
        return next(c for e, c in self.cores.items() if c.rank == rank and e not in self.dead)

    def run(self, source: str, outputs: list[Output]) -> None:
        """Carry ``outputs`` of ``source`` and everything they cause, to quiescence."""
        self._queue.extend((source, o) for o in outputs)
        queue = self._queue
        while queue:
            source, output = queue.popleft()
            if self.capture is not None:
                self.capture.append((source, output))
            if source in self.dead or source in self.hung:
                continue
            core = self.cores[source]
            if isinstance(output, Dial):
                self.dialed[source] = output.endpoint
            elif isinstance(output, Hangup):
                self.dialed[source] = None
            elif isinstance(output, Emit):
                self.notices.append((source, output.event))
            elif isinstance(output, Deliver):
                self.delivered[source].append(output)
            elif output.link == PARENT:
                target = self.dialed[source]
                if target is not None and target not in self.dead | self.hung:
                    peer = self.cores[target]
                    queue.extend((target, o) for o in
                                 peer.receive(core.identity, list(output.frames), self.now))
            else:
                identity = output.frames[0]
                target = next((e for e, c in self.cores.items() if c.identity == identity
                               and self.dialed[e] == source), None)
                if target is None or target in self.dead:
                    queue.extend((source, o) for o in core.link_down(output.link, self.now))
                    continue
                if target in self.hung:
                    continue
                peer = self.cores[target]
                queue.extend((target, o) for o in
                             peer.receive(PARENT, list(output.frames[1:]), self.now))

    def advance(self, seconds: float, step: Optional[float] = None) -> None:
        """Move time on, running every core's timer when due."""
        end = self.now + seconds
        step = step or self.settings.heartbeat / 2
        while self.now < end:
            self.now = min(end, self.now + step)
            for endpoint, core in list(self.cores.items()):
                if endpoint not in self.dead | self.hung and core.next_deadline() <= self.now:
                    self.run(endpoint, core.handle_timer(self.now))

    def kill(self, core: FluxCore) -> None:
        self.dead.add(core.endpoint)

    def call(self, core: FluxCore, outputs: list[Output]) -> None:
        self.run(core.endpoint, outputs)

    def rpc(self, core: FluxCore, handle: int, topic: str, payload: Optional[bytes] = None,
            nodeid: int = 0xFFFFFFFF, flags: Any = 0) -> int:
        from peermesh.wire.flux import MsgFlag
        tag, outputs = core.rpc(handle, topic, payload, nodeid, MsgFlag(flags), self.now)
        self.run(core.endpoint, outputs)
        return tag

    def taken(self, core: FluxCore, handle: Optional[int] = None) -> list[Any]:
        """The messages delivered to ``core`` (to ``handle``), emptied."""
        out = self.delivered[core.endpoint]
        mine = [d.item[1] for d in out if handle is None or d.item[0] == handle]
        self.delivered[core.endpoint] = [d for d in out if handle is not None
                                         and d.item[0] != handle]
        return mine
