"""Reads: offsets, the ranges of a batch, and the batch and streaming readers.

See ``peermesh.spark.source`` for how offsets, consumers and commits work."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from typing import Any, Iterator, Mapping, Optional, Sequence

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import StructType

from .client import local_log, log_client
from .columns import _Columns
from .log import Chunk
from .protocol import MAX_FETCH_BYTES, DataLossError
from .settings import SourceOptions

__all__ = ["BatchReader", "OffsetRange", "StreamReader", "consumer_id", "read_range",
           "split_range"]

log = logging.getLogger(__name__)


def _offset(log_id: str, offset: int, consumer: Optional[str],
            floors: Optional[Mapping[str, int]] = None) -> dict:
    """A query's offset: a log position and, while the query's groups started at different
    offsets (``startingOffsets`` per group), the later starts of single groups."""
    result: dict[str, Any] = {"log": log_id, "offset": int(offset)}
    if consumer is not None:
        result["consumer"] = consumer
    later = {g: int(n) for g, n in (floors or {}).items() if int(n) > int(offset)}
    if later:
        result["floors"] = later
    return result


class OffsetRange(InputPartition):
    """Offsets ``start <= o < end`` of log ``log_id`` (one Spark task); messages of a group
    in ``floors`` count only from that group's floor on. ``path`` and ``host``: where the
    log file is (``INFO``), for a task on that machine to read it itself."""

    def __init__(self, log_id: str, start: int, end: int, index: int = 0,
                 floors: Optional[Mapping[str, int]] = None, path: Optional[str] = None,
                 host: Optional[str] = None) -> None:
        super().__init__((start, end))
        self.log_id = log_id
        self.start = start
        self.end = end
        self.index = index
        self.floors = dict(floors or {})
        self.path = path
        self.host = host

    def __repr__(self) -> str:
        return f"OffsetRange({self.start}, {self.end}, #{self.index})"


def split_range(log_id: str, start: int, end: int, parts: int,
                floors: Optional[Mapping[str, int]] = None,
                where: Optional[Mapping[str, Any]] = None) -> list[OffsetRange]:
    """``[start, end)`` in at most ``parts`` contiguous, nearly equal ranges (``where``: the
    ``path`` and ``host`` of the log file, from ``INFO``)."""
    if end <= start:
        return []
    parts = max(1, min(parts, end - start))
    step = math.ceil((end - start) / parts)
    where = where or {}
    return [OffsetRange(log_id, a, min(a + step, end), i, floors, where.get("path"),
                        where.get("host"))
            for i, a in enumerate(range(start, end, step))]


def _resolve(spec: str, earliest: int, nxt: int) -> int:
    """An offset spec as ``options.offset_spec`` leaves it: earliest, latest or an offset."""
    if spec == "earliest":
        return earliest
    if spec == "latest":
        return nxt
    return int(spec)


def consumer_id(name: Optional[str]) -> str:
    """A new query's consumer id: ``NAME#`` and a random suffix with ``consumerName``, so
    that two queries given one name (two checkpoints) commit apart and neither trims what
    the other has not read; a query restarted from its checkpoint keeps its id there."""
    suffix = uuid.uuid4().hex
    return f"{name}#{suffix[:12]}" if name else suffix


def read_range(opts: SourceOptions, schema: StructType, part: OffsetRange) -> Iterator[Any]:
    """Rows of ``part`` fetched from the log service (Arrow batches when possible)."""
    local = local_log(part.path, part.host, part.log_id)
    if local is not None:  # on the driver's machine: read the file, not through the service
        def fetch(start: int, end: int) -> dict:
            return local.fetch(start, end, opts.groups, MAX_FETCH_BYTES)
    else:
        def fetch(start: int, end: int) -> dict:
            return log_client(opts.endpoint, opts.token, opts.server_key).fetch(
                opts.groups, start, end)
    columns = _Columns(schema, opts.decode, merge=len(opts.groups) > 1)
    position, end = part.start, part.end
    first = True
    while position < end:
        reply = fetch(position, end)
        if reply["log"] != part.log_id:
            _data_loss(opts, f"the log service now serves log {reply['log']}, not "
                             f"{part.log_id}: offsets {position}-{end - 1} are gone")
            return
        floors = _group_floors(reply, opts.groups)
        if first:
            _check_trimmed(opts, position, part.floors, floors, end)
        first = False
        resume = int(reply["resume"])
        chunks = [Chunk(*c) for c in reply["chunks"]]
        if chunks:
            keep = {g: max(part.floors.get(g, 0), floors[g]) for g in opts.groups}
            yield from columns.emit(chunks, position, min(resume, end), keep)
        if resume <= position:
            if int(reply["next"]) < end:
                _data_loss(opts, f"the log ends at {reply['next']}, before offset {end} "
                                 "that this batch was planned with")
            return
        position = resume


def _group_floors(reply: Mapping[str, Any], groups: Sequence[str]) -> dict[str, int]:
    """Each group's earliest offset in a reply (a service without ``floors``: its one
    ``earliest`` for all)."""
    floors = reply.get("floors") or {}
    return {g: int(floors.get(g, reply["earliest"])) for g in groups}


def _check_trimmed(opts: SourceOptions, position: int, starts: Mapping[str, int],
                   floors: Mapping[str, int], end: Optional[int] = None) -> None:
    """Data loss where a group was trimmed above where the query reads it (``position``,
    or the group's later start in ``starts``), group by group."""
    lost = []
    for group, floor in floors.items():
        begin = max(position, int(starts.get(group, position)))
        if floor > begin and (end is None or begin < end):
            top = floor if end is None else min(floor, end)
            lost.append(f"offsets {begin}-{top - 1} of group {group!r}")
    if lost:
        _data_loss(opts, f"{', '.join(lost)} were trimmed from the log before this query "
                         "read them")


def _data_loss(opts: SourceOptions, what: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"{what}. Some messages may have been lost. If you want the query to go on "
            "regardless, set option failOnDataLoss to false.")
    log.warning("peermesh source: %s (failOnDataLoss=false: going on)", what)


class _ReaderBase:
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._log_id: Optional[str] = None
        self._where: Optional[dict[str, Any]] = None   # the log file's path and host

    def _client(self) -> Any:
        return log_client(self.opts.endpoint, self.opts.token, self.opts.server_key)

    def _info(self, join: bool = False) -> dict:
        """The log's bounds; ``join``: the driver's node joins groups it does not log yet."""
        client = self._client()
        info = client.info(self.opts.groups)
        missing = [g for g in self.opts.groups if g not in info["groups"]]
        if missing and join and self.opts.auto_join:
            client.join(missing)
        self._log_id = info["log"]
        self._where = {"path": info.get("path"), "host": info.get("host")}
        return info

    def read(self, partition: Optional[InputPartition]) -> Iterator[Any]:
        """Rows of one range (runs in an executor's Python worker).

        Spark reads an empty plan as one stand-in partition (``None``, or an
        ``InputPartition`` of ``None``): it has no rows.
        """
        if isinstance(partition, OffsetRange):
            return read_range(self.opts, self.schema, partition)
        if getattr(partition, "value", None) is None:
            return iter(())
        raise TypeError(f"the peermesh source cannot read partition {partition!r}")


    def _starts(self, default: str, info: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
        """Where the read starts: the lowest start of its groups, and the later starts of
        single groups (``startingOffsets`` per group, or by time); ``info``: the log's
        ``INFO`` for the read's groups."""
        opts = self.opts
        client = self._client()
        earliest, nxt = _group_floors(info, opts.groups), int(info["next"])
        starts: dict[str, int] = {}
        for group in opts.groups:
            when = opts.starting_times.get(group)
            if when is not None:
                found = client.seek([group], when)
                if found["offset"] >= found["next"] and opts.timestamp_strategy == "error":
                    raise ValueError(
                        f"group {group!r} has no message received at or after "
                        f"{when * 1000:.0f} (ms since the epoch), the starting timestamp; set "
                        "option startingOffsetsByTimestampStrategy to latest to start at "
                        "the end instead (as in Kafka's source)")
                starts[group] = int(found["offset"])
                continue
            spec = opts.starting_by_group.get(group, default)
            starts[group] = _resolve(spec, earliest[group], nxt)
            if starts[group] < earliest[group]:
                _data_loss(opts, f"startingOffsets {starts[group]} of group {group!r} is below "
                                 f"the earliest offset it holds, {earliest[group]}")
        first = min(starts.values())
        return first, {g: n for g, n in starts.items() if n > first}


class BatchReader(_ReaderBase, DataSourceReader):
    """``spark.read.format("peermesh")``: what the log holds between two offsets."""

    def partitions(self) -> Sequence[InputPartition]:
        """Split ``[startingOffsets, endingOffsets)`` (default: everything held)."""
        info = self._info()
        start, floors = self._starts(self.opts.starting, info)
        end = _resolve(self.opts.ending, info["earliest"], info["next"])
        return split_range(info["log"], start, min(end, info["next"]), self.opts.partitions,
                           floors, self._where or {})


class StreamReader(_ReaderBase, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("peermesh")``: see the module's docstring."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        super().__init__(opts, schema)
        self._consumer: Optional[str] = None
        self._target: Optional[int] = None
        self._ready = False
        self._position: Optional[int] = None   # the end of the last batch planned
        self._latest: Optional[dict] = None    # the log's answer that planned it
        self._committing: Optional[threading.Thread] = None  # the last commit sent
        self._last_batch = time.monotonic()    # for minOffsetsPerTrigger's maxTriggerDelay

    def _ensure(self) -> None:
        if not self._ready:
            self._info(join=True)
            self._ready = True

    def initialOffset(self) -> dict:
        """Where a new query starts (``startingOffsets``); registers it as a consumer."""
        info = self._info(join=True)
        self._ready = True
        start, floors = self._starts(self.opts.starting, info)
        # Registered with the log by the first latestOffset that uses it: Spark may ask
        # for an initial offset more than once and use only one of the answers.
        return _offset(info["log"], start, consumer_id(self.opts.consumer_name), floors)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``maxOffsetsPerTrigger`` as ``ReadMaxRows``, else everything available."""
        if self.opts.max_offsets is not None:
            return ReadMaxRows(self.opts.max_offsets)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: nothing that arrives after this call is read by the run."""
        info = self._info(join=True)
        self._ready = True
        self._target = int(info["next"])

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch (admission control through ``limit``, and
        ``minOffsetsPerTrigger`` waiting at most ``maxTriggerDelay``)."""
        self._ensure()
        consumer = start.get("consumer")
        position = int(start["offset"])
        floors = start.get("floors")
        if consumer is not None and consumer != self._consumer:
            self._client().register(consumer, self.opts.groups, position)
            self._consumer = consumer
        if start.get("log") != self._log_id:
            _data_loss(self.opts, f"the query's offsets belong to log {start.get('log')}, "
                                  f"but the service now serves log {self._log_id}")
            # failOnDataLoss=false: go on from the beginning of the new log
            info = self._client().info(self.opts.groups)
            position, floors = int(info["earliest"]), None
            start = _offset(self._log_id or info["log"], position, consumer)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        client = self._client()
        reply = client.latest(self.opts.groups, position, max_rows, self._target)
        _check_trimmed(self.opts, position, floors or {},
                       _group_floors(reply, self.opts.groups))
        end = int(reply["end"])
        least = self.opts.min_offsets
        if (least is not None and end > position and self._target is None
                and time.monotonic() - self._last_batch < self.opts.max_trigger_delay
                and client.count(self.opts.groups, position, end)["count"] < least):
            end = position  # too few yet: wait for more, up to maxTriggerDelay
        if end > position:
            self._last_batch = time.monotonic()
        self._position = end
        self._latest = reply if end == int(reply["end"]) else None
        return _offset(reply["log"], end, consumer, floors)

    def reportLatestOffset(self) -> Optional[dict]:
        """The log's next offset and, per group, how many messages the query is behind
        (``behind``), for the query's progress reports: as the log answered the
        ``latestOffset`` Spark calls this after, without asking again."""
        latest = self._latest
        if latest is not None and "behind" in latest:
            report = _offset(latest["log"], latest["next"], self._consumer)
            report["behind"] = {g: int(n) for g, n in latest["behind"].items()}
            return report
        try:
            client = self._client()
            info = client.info(self.opts.groups)
            behind = {group: client.count([group], self._position, info["next"])["count"]
                      for group in self.opts.groups} if self._position is not None else {}
        except Exception:
            return None
        report = _offset(info["log"], info["next"], self._consumer)
        if self._position is not None:
            report["behind"] = behind
        return report

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """Split ``[start, end)`` into ``partitions`` ranges."""
        same = start.get("log") == end.get("log")
        first = int(start["offset"]) if same else 0
        if self._where is None:
            self._where = {}  # asked once: a query restarted mid-batch may plan first
            self._info()
        return split_range(end["log"], first, int(end["offset"]), self.opts.partitions,
                           start.get("floors") if same else None, self._where)

    def commit(self, end: dict) -> None:
        """Everything below ``end`` is processed: tell the log (which may trim it).

        Told from a thread of its own: Spark calls this before it plans each batch, and
        the log's answer (and its trim) need not hold the batch up. Commits reach the
        log in order; ``committed`` (and ``stop``) wait for them. The checkpoint, not the log,
        says where a query resumes: a commit lost with the process only delays a trim."""
        consumer = end.get("consumer")
        if consumer is None or end.get("log") != self._log_id and self._log_id is not None:
            return
        before = self._committing
        offset = int(end["offset"])

        def tell() -> None:
            if before is not None:
                before.join()
            try:
                self._client().commit(consumer, self.opts.groups, offset)
            except Exception:  # trimming is a convenience: never fail the query for it
                log.warning("peermesh source: commit of offset %s failed", end, exc_info=True)

        self._committing = threading.Thread(target=tell, name="peermesh-commit", daemon=True)
        self._committing.start()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_committing"] = None  # a thread of this process
        return state

    def committed(self, timeout: Optional[float] = None) -> bool:
        """Wait until every commit was answered by the log (at most ``timeout`` s);
        whether they were."""
        last = self._committing
        if last is not None:
            last.join(timeout)
            return not last.is_alive()
        return True

    def stop(self) -> None:
        """Wait for the last commit (sockets belong to the process, not the reader)."""
        self.committed()
