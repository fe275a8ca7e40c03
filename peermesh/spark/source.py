"""The ``peermesh`` Python data source (PySpark >= 4, ``pyspark.sql.datasource``).

How it works
------------
Spark runs every callback of a Python data source in a Python worker
process it starts itself, never in the driver's own process: planning and
offset management in one long-lived worker per streaming query, reads and
writes in the executors' workers. So the source object carries only plain
options (it is pickled), and each worker process opens its own connection
to the driver's log service (``client.log_client``) or its own mesh node
(``executor.executor_mesh``) the first time it needs one.

Streaming read: an offset is ``{"log": id, "offset": n, "consumer": c}``,
``n`` one past the last message of the batch. ``initialOffset`` picks a new
consumer id ``c`` for the query; the first ``latestOffset`` that starts from
an offset carrying ``c`` registers it with the log (Spark may ask for an
initial offset more than once and keep one answer). A query restarted from
its checkpoint keeps its id, because the id lives in the checkpointed
offsets. ``commit`` tells the log how far ``c`` got, so the log can trim
what every consumer has processed. ``latestOffset`` asks the
log for the end of what is there (at most ``maxOffsetsPerTrigger`` messages
of the query's groups; not past the target of an ``availableNow``
trigger). ``partitions`` splits a batch's range; ``read`` fetches its range
from the log service. The same range always yields the same rows, so a
batch replayed after a restart is identical: with an idempotent or
transactional sink (Spark's file sinks, ``foreachBatch`` keyed by batch id)
every message arrives exactly once.

The pieces: ``settings`` (the options, parsed), ``columns`` (the default
schema, log chunks as Arrow batches), ``reader`` (offsets, ranges, the
readers), ``writer`` (the writers); this module is the data source itself
and keeps their public names importable from here.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter)
from pyspark.sql.types import StructType

from .columns import HEADERS, METADATA, SCHEMA, value_converter
from .options import check as check_options, parsed
from .reader import BatchReader, OffsetRange, StreamReader, consumer_id, read_range, split_range
from .settings import GROUP_COLUMN, SourceOptions, WriteOptions
from .writer import MeshCommit, MeshStreamWriter, MeshWriter, write_rows

__all__ = ["PeermeshDataSource", "SCHEMA", "HEADERS", "METADATA", "GROUP_COLUMN", "register",
           "SourceOptions", "WriteOptions", "OffsetRange", "BatchReader", "StreamReader",
           "MeshWriter", "MeshStreamWriter", "MeshCommit", "write_rows", "read_range",
           "split_range", "consumer_id", "value_converter"]


class PeermeshDataSource(DataSource):
    """The ``peermesh`` format: mesh groups as tables and streams, and a mesh sink."""

    #: options every instance starts from (``register`` fills in the service's)
    defaults: dict[str, str] = {}

    def __init__(self, options: dict[str, str]) -> None:
        merged = {k.lower(): v for k, v in self.defaults.items()}
        merged.update({k.lower(): v for k, v in dict(options).items()})
        check_options(merged)
        super().__init__(merged)
        self.options = merged

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "peermesh"

    def schema(self) -> StructType:
        """The default schema (see ``SCHEMA``), with ``headers`` for ``includeHeaders``."""
        if parsed(self.options, "includeHeaders", False):
            return StructType([*SCHEMA.fields, HEADERS])
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reader."""
        return BatchReader(SourceOptions.parse(self.options, batch=True), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Streaming reader."""
        return StreamReader(SourceOptions.parse(self.options, batch=False), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Batch writer (append only)."""
        _refuse_overwrite(overwrite)
        return MeshWriter(WriteOptions.parse(self.options, schema.fieldNames()))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Streaming writer (append only)."""
        _refuse_overwrite(overwrite)
        return MeshStreamWriter(WriteOptions.parse(self.options, schema.fieldNames()))


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise ValueError("the peermesh format only appends: messages sent to a mesh cannot "
                         "be taken back, so mode('overwrite') does not apply; use "
                         "mode('append')")


def register(spark: Any, service: Any = None, **options: Any) -> type:
    """Register the ``peermesh`` format with ``spark``; returns the registered class.

    Readers and writers start from ``service.options()`` (default: the
    service this process started last, if any), then ``options`` (e.g.
    ``endpoint=...``, ``interface="lo"``, ``port=5670``), then what
    ``.option(...)`` gives.
    """
    if service is None:
        from .service import current_service

        service = current_service()
    defaults: dict[str, str] = {}
    if service is not None:
        defaults.update(service.options())
    for key, value in options.items():
        if value is not None:
            defaults[key.lower()] = ",".join(value) if isinstance(value, (list, tuple)) \
                else str(value)
    # A class made here is pickled by value (with its defaults) into Spark's workers.
    source = type("PeermeshDataSource", (PeermeshDataSource,),
                  {"defaults": defaults, "__module__": __name__,
                   "__qualname__": "PeermeshDataSource.<registered>"})
    spark.dataSource.register(source)
    return source
