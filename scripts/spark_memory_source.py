"""The ceiling of ``bench_spark.py``'s read phase: a minimal Python data source, no peermesh.

Format ``arrowfile`` reads the record batches of one Arrow IPC file
(option ``path``), memory-mapped, so it hands Spark the batches as they are,
with nothing computed in Python. As a batch read it splits the file's
batches into ``partitions`` ranges; as a stream its offsets are batch
numbers (``initialOffset`` 0, ``latestOffset`` the file's batch count).
What it costs next to parquet is what Spark's Python data source API costs
any source, whatever it reads: the workers' Arrow stream to the JVM, the
rows made from it, and for a stream the Python process Spark starts to plan
each query.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    InputPartition)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

__all__ = ["ArrowFileSource", "write_batches"]


def write_batches(path: str, batches: Sequence[pa.RecordBatch]) -> None:
    """Write ``batches`` (one schema) to an Arrow IPC file at ``path``."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)


def _count(path: str) -> int:
    with pa.memory_map(path) as source:
        return pa.ipc.open_file(source).num_record_batches


def _split(count: int, parts: int) -> list[InputPartition]:
    step = -(-count // max(1, parts))
    return [InputPartition((a, min(a + step, count))) for a in range(0, count, step)]


def _read(path: str, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    first, last = partition.value
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        for i in range(first, last):
            yield reader.get_batch(i)


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.parts = int(options.get("partitions", "2"))

    def partitions(self) -> Sequence[InputPartition]:
        return _split(_count(self.path), self.parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.path, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.parts = int(options.get("partitions", "2"))

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"batch": _count(self.path)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first = start["batch"]
        return [InputPartition((first + a, first + b)) for a, b in
                (p.value for p in _split(end["batch"] - first, self.parts))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.path, partition)

    def commit(self, end: dict) -> None:
        pass


class ArrowFileSource(DataSource):
    """Format ``arrowfile``: the batches of the Arrow IPC file at option ``path``; the
    schema is given with ``.schema(...)``."""

    @classmethod
    def name(cls) -> str:
        return "arrowfile"

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(self.options)

