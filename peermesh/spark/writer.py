"""Writes: every row as a SHOUT (to option ``group`` or to each row's ``group``
column), through the driver's MTL gateway, or as a Safir-Darbaan request."""

from __future__ import annotations

import logging
import itertools
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from .codec import pack_value
from .settings import GROUP_COLUMN, WriteOptions

__all__ = ["MeshCommit", "MeshStreamWriter", "MeshWriter", "write_rows"]

log = logging.getLogger(__name__)


@dataclass
class MeshCommit(WriterCommitMessage):
    """What one write task sent."""

    rows: int
    mode: str


def _payloads(rows: list, column: Optional[str], without: Optional[str] = None) -> list[bytes]:
    result = []
    for row in rows:
        if column is None:
            values = row.asDict(recursive=True)
            values.pop(without, None)
            result.append(pack_value(values))
            continue
        value = row[column]
        if isinstance(value, (bytes, bytearray)):
            result.append(bytes(value))
        elif isinstance(value, str):
            result.append(value.encode("utf-8"))
        else:
            result.append(pack_value(value.asDict(recursive=True) if hasattr(value, "asDict")
                                     else value))
    return result


def _request_values(rows: list, column: Optional[str]) -> list[Any]:
    if column is None:
        return [row.asDict(recursive=True) for row in rows]
    return [row[column].asDict(recursive=True) if hasattr(row[column], "asDict")
            else row[column] for row in rows]


def _chunks(iterator: Iterator[Any], size: int) -> Iterator[list]:
    chunk: list = []
    for row in iterator:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def write_rows(opts: WriteOptions, iterator: Iterator[Any]) -> MeshCommit:
    """Send every row (runs in an executor's Python worker); raises to fail the task.

    The worker's mesh node is opened (and the group or service waited for)
    only once a task has a row to send: empty partitions send nothing.
    """
    from .executor import MeshWriteError, executor_mesh, request_many

    total = 0
    mesh = None
    if opts.gateway is not None and opts.service is None:
        return _write_through_gateway(opts, iterator)
    if opts.group_column:
        return _shout_by_column(opts, iterator)
    if opts.group is not None:
        for chunk in _chunks(iterator, 2000):
            if mesh is None:
                mesh = executor_mesh(opts.mesh)
                mesh.wait_group(opts.group, opts.peers, opts.discovery_timeout)
            mesh.shout_many(opts.group, _payloads(chunk, opts.column))
            total += len(chunk)
        if mesh is not None and not mesh.flush(opts.discovery_timeout) \
                and opts.require_delivery:
            raise MeshWriteError(f"not every member of group {opts.group!r} confirmed the "
                                 f"{total} messages within {opts.discovery_timeout:g} s")
        return MeshCommit(total, "shout")
    assert opts.service is not None and opts.action is not None
    for chunk in _chunks(iterator, 2000):
        outcomes = request_many(opts.mesh, opts.gateway, opts.service, opts.action,
                                _request_values(chunk, opts.column), version=opts.version,
                                category=opts.category, timeout=opts.timeout,
                                window=opts.max_in_flight, retries=opts.retries,
                                discovery_timeout=opts.discovery_timeout)
        for index, outcome in enumerate(outcomes):
            if not outcome.ok:
                raise MeshWriteError(f"request {opts.service}/{opts.action} for row "
                                     f"{total + index} of this task failed: {outcome.error}")
        total += len(chunk)
    return MeshCommit(total, "request")


def _shout_by_column(opts: WriteOptions, iterator: Iterator[Any]) -> MeshCommit:
    """Shout each row to the group in its ``group`` column (the rest of the row, or
    option ``column``, is the message)."""
    from .executor import MeshWriteError, executor_mesh

    mesh = None
    met: set[str] = set()
    total = 0
    for chunk in _chunks(iterator, 2000):
        if mesh is None:
            mesh = executor_mesh(opts.mesh)
        for target, rows in _by_group(chunk, total).items():
            if target not in met:
                mesh.wait_group(target, opts.peers, opts.discovery_timeout)
                met.add(target)
            mesh.shout_many(target, _payloads(rows, opts.column, without=GROUP_COLUMN))
        total += len(chunk)
    if mesh is not None and not mesh.flush(opts.discovery_timeout) and opts.require_delivery:
        raise MeshWriteError(f"not every member of groups {', '.join(sorted(met))} confirmed "
                             f"the {total} messages within {opts.discovery_timeout:g} s")
    return MeshCommit(total, "shout")


def _write_through_gateway(opts: WriteOptions, iterator: Iterator[Any]) -> MeshCommit:
    """Send every row through the driver's MTL gateway; done once it confirmed them all
    (they are in the driver's log)."""
    from .executor import executor_gateway

    assert opts.gateway is not None
    chunks = _chunks(iterator, 2000)
    first = next(chunks, None)
    if first is None:
        return MeshCommit(0, "gateway")
    writer = executor_gateway(opts.gateway)
    total = 0
    with writer.lock:
        for chunk in itertools.chain([first], chunks):
            if opts.group is not None:
                writer.send_many(opts.group, _payloads(chunk, opts.column))
            else:
                for target, rows in _by_group(chunk, total).items():
                    writer.send_many(target, _payloads(rows, opts.column, without=GROUP_COLUMN))
            total += len(chunk)
        if opts.require_delivery:
            writer.confirm(opts.discovery_timeout)
    return MeshCommit(total, "gateway")


def _by_group(chunk: list, first: int) -> dict[str, list]:
    """The rows of ``chunk`` by the group their ``group`` column names (``first``: the
    task's number of the chunk's first row, for the error)."""
    from .executor import MeshWriteError

    by_group: dict[str, list] = {}
    for index, row in enumerate(chunk, first):
        target = row[GROUP_COLUMN]
        if not isinstance(target, str) or not target:
            raise MeshWriteError(f"row {index} of this task has no group in its "
                                 f"{GROUP_COLUMN!r} column ({target!r})")
        by_group.setdefault(target, []).append(row)
    return by_group


class MeshWriter(DataSourceWriter):
    """``df.write.format("peermesh")``: shout each row, or send it as a request."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> MeshCommit:
        """Send this task's rows; the commit message counts them."""
        return write_rows(self.opts, iterator)

    def commit(self, messages: list) -> None:
        """Every task succeeded (rows were sent as each task ran)."""
        sent = sum(m.rows for m in messages if isinstance(m, MeshCommit))
        log.info("peermesh write: %d rows sent by %d tasks", sent, len(messages))

    def abort(self, messages: list) -> None:
        """A task failed: what other tasks sent cannot be called back."""
        log.warning("peermesh write aborted; rows already sent stay sent")


class MeshStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("peermesh")``: each micro-batch's rows, as ``MeshWriter``."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> MeshCommit:
        """Send this task's rows."""
        return write_rows(self.opts, iterator)

    def commit(self, messages: list, batchId: int) -> None:
        """Every task of micro-batch ``batchId`` succeeded."""

    def abort(self, messages: list, batchId: int) -> None:
        """A task of micro-batch ``batchId`` failed."""
