"""A Flux node's settings (timers and bounds) and the states it goes through."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .errors import FluxStateError
from .topology import Topology

__all__ = ["FluxSettings", "State"]


class State(enum.Enum):
    """Where a node is in joining its instance."""

    DETACHED = "detached"
    JOINING = "joining"
    ATTACHING = "attaching"
    ONLINE = "online"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class FluxSettings:
    """Timers (seconds) and the bounds of what remote senders can grow."""

    topology: Topology = Topology(32)
    heartbeat: float = 2.0       #: a link idle this long gets a heartbeat
    torpid: float = 10.0         #: a child silent this long is reported torpid
    lost: float = 30.0           #: a link silent this long is lost
    hello_timeout: float = 5.0   #: a join or hello unanswered this long is tried elsewhere
    retry: float = 0.05          #: a refused join or hello is tried again after this, doubled
                                 #: per refusal up to ``heartbeat``
    max_children: int = 4096     #: children (and adopted orphans) one node accepts
    max_size: int = 1 << 17      #: ranks (and rank numbers) rank 0 gives and keeps
    max_joining: int = 1024      #: ranks rank 0 gave that did not attach yet (reclaimed
                                 #: after ``lost`` s)
    joins_per_link: int = 4      #: of those, asked for over one connection
    reclaim: float = 300.0       #: a rank reported lost is given again after this
    max_inflight: int = 65536    #: requests one node tracks in flight through its links
    max_pending: int = 65536     #: RPCs in flight per local handle
    recent_events: int = 1024    #: events rank 0 keeps for replay; events a node holds
    replay_batch: int = 256      #: events per replay answer
    max_ancestors: int = 32      #: ancestors a node keeps for re-attaching
    max_clients: int = 1024      #: rankless client links one node serves
    client_prefixes: int = 16    #: event subscriptions per client
    client_services: int = 64    #: services (with nodeid) per client told when it goes

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat <= self.torpid <= self.lost:
            raise FluxStateError("Flux settings need 0 < heartbeat <= torpid <= lost, not "
                                 f"{self.heartbeat}, {self.torpid}, {self.lost}")
        if self.reclaim < self.lost:
            raise FluxStateError(f"Flux setting reclaim must be at least lost ({self.lost}), "
                                 f"not {self.reclaim}")
        if not 0 < self.retry <= self.heartbeat:
            raise FluxStateError(f"Flux setting retry must be in (0, heartbeat], not {self.retry}")
        for name in ("max_children", "max_size", "max_joining", "joins_per_link",
                     "max_inflight", "max_pending",
                     "recent_events", "replay_batch", "max_ancestors", "max_clients",
                     "client_prefixes", "client_services"):
            if getattr(self, name) < 1:
                raise FluxStateError(f"Flux setting {name} must be at least 1")
