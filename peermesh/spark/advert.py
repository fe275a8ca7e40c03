"""The driver's log service as others see it: its counters (``ServiceStats``) and its
advert on the mesh (``LogAdvert``: a HELLO header, a role and Prometheus metrics)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from ..overlay import Overlay
from .log import MessageLog

__all__ = ["HEADER_LOG", "LogAdvert", "ServiceStats"]

#: HELLO header of the driver node: the log service's endpoint
HEADER_LOG = "X-PM-SPARK-LOG"


@dataclass
class ServiceStats:
    """Counters of a running ``DriverService``."""

    messages: int = 0          #: SHOUTs appended to the log
    batches: int = 0           #: append transactions
    requests: int = 0          #: PMLOG1 requests answered
    errors: int = 0            #: of which ERR
    chunks_served: int = 0     #: log chunks sent in FETCH replies
    trimmed: int = 0           #: messages deleted (commits, retention, trims)
    rejected: int = 0          #: SHOUTs that could not be stored (too large for SQLite)
    #: writes through the gateway refused: not a logged group, too large, or (sent again)
    #: while the log was behind
    gateway_refused: int = 0
    #: service calls relayed through the gateway (``peermesh.spark.remotecalls``)
    gateway_calls: int = 0


class LogAdvert(Overlay):
    """The driver's log service as the mesh sees it: ``X-PM-SPARK-LOG`` and role
    ``spark-log`` on the driver node's HELLO."""

    roles = ("spark-log",)

    def __init__(self, endpoint: str, stats: Optional[ServiceStats] = None,
                 path: Optional[Path] = None) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.service_stats = stats
        self.path = path                          # the log, read when metrics are scraped
        self._reader: Optional[MessageLog] = None  # opened on first scrape, on the hub

    def on_stop(self, timeout: float) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def headers(self) -> dict[str, str]:
        return {HEADER_LOG: self.endpoint}

    def metrics(self) -> Any:
        """``Overlay.metrics`` plus the service's totals as ``spark_log_total{what}``, the
        log's offsets and each streaming query's committed offset and lag (messages)."""
        yield from super().metrics()
        if self.service_stats is not None:
            for what, count in asdict(self.service_stats).items():
                yield "spark_log_total", {"what": what}, count
        if self.path is None or not self.running:
            return
        if self._reader is None:
            self._reader = MessageLog(self.path)
        earliest, following = self._reader.bounds()
        yield "spark_log_earliest_offset", {}, earliest
        yield "spark_log_next_offset", {}, following
        for consumer in self._reader.consumers():
            labels = {"consumer": consumer.id, "groups": ",".join(consumer.groups)}
            yield "spark_consumer_committed_offset", labels, consumer.committed
            yield "spark_consumer_lag", labels, max(0, following - consumer.committed)
