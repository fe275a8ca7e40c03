"""The Arrow side of reads: the default schema and log chunks as Arrow batches or rows.

``_Columns`` turns the chunks the log service (or the local log file) gives
into record batches of a read's schema; ``value_converter`` turns a decoded
value into what a column of a user schema takes."""

from __future__ import annotations

import datetime
import json
from array import array
from bisect import bisect_left
from typing import Any, Iterable, Iterator, Mapping, Optional

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DataType, DateType, DecimalType,
                               DoubleType, FloatType, IntegerType, LongType, MapType, ShortType,
                               ByteType, StringType, StructField, StructType, TimestampNTZType,
                               TimestampType)

from .codec import TEXT_LATER, TEXT_NULL, TEXT_STORED, payload_text, payload_texts, payload_value
from .log import Chunk, DecodedChunk, decode_chunk, rows_of

__all__ = ["HEADERS", "METADATA", "SCHEMA", "value_converter"]


#: the default schema of a read (``spark.read`` / ``spark.readStream``)
SCHEMA = StructType([
    StructField("group", StringType(), False),
    StructField("sender", StringType(), False),        # UUID, 32 hex digits
    StructField("sender_name", StringType(), False),
    StructField("received", TimestampType(), False),   # when the driver's node got it
    StructField("offset", LongType(), False),          # the log offset
    StructField("payload", BinaryType(), False),       # the message (frames joined)
    StructField("text", StringType(), True),           # msgpack as JSON, or UTF-8; else null
])
#: the column ``includeHeaders`` adds: the sender's HELLO headers, as Kafka's source gives
#: a record's headers (``array<struct<key: string, value: binary>>``)
HEADERS = StructField("headers", ArrayType(StructType([
    StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), False),
    True)


def _header_pairs(headers: Optional[Mapping[str, str]]) -> list[tuple[str, bytes]]:
    """HELLO headers as Kafka's ``(key, value)`` pairs, values as UTF-8 octets."""
    return [(k, str(v).encode("utf-8")) for k, v in (headers or {}).items()]
METADATA = ("group", "sender", "sender_name", "received", "offset", "payload", "text",
            "headers")


#: columns of repeated values a reader keeps (each a chunk long: tens of kilobytes)
_REPEATS_KEPT = 16


class _Columns:
    """Turns log chunks into Arrow record batches or Python rows for a schema."""

    def __init__(self, schema: StructType, decode: str, merge: bool) -> None:
        self.schema = schema
        self.decode = decode
        self.merge = merge          # several groups: chunks overlap, sort by offset
        self.arrow = to_arrow_schema(schema, timezone="UTC")
        names = schema.fieldNames()
        known = {f.name: f.dataType for f in (*SCHEMA.fields, HEADERS)}
        self.fast = all(f.name in METADATA and f.dataType == known[f.name]
                        for f in schema.fields)
        self.needs_value = any(n not in METADATA for n in names)
        self.converters = [value_converter(f.dataType) for f in schema.fields]
        #: (value, type) -> the longest column of it made so far: a chunk's group (and
        #: often its one sender) repeats in every batch of a read
        self._repeats: dict[tuple[Any, pa.DataType], pa.Array] = {}

    def emit(self, chunks: list[Chunk], start: int, end: int,
             floors: Mapping[str, int]) -> Iterator[Any]:
        """The messages of ``chunks`` with ``start <= offset < end`` (and not below their
        group's floor), in offset order."""
        if not self.fast:
            rows: Iterable[Any] = (r for r in rows_of(chunks, start, end)
                                   if r[0] >= floors.get(r[1], start))
            if self.merge:
                rows = sorted(rows, key=lambda r: r[0])
            headers = ({p[0]: p[2] for c in chunks for p in decode_chunk(c).peers if len(p) > 2}
                       if "headers" in self.schema.fieldNames() else {})
            yield from self.tuples(rows, headers)
            return
        batches = [b for b in (self.batch(decode_chunk(c), max(start, floors.get(c.group, 0)),
                                          end) for c in chunks)
                   if b is not None]
        if self.merge and len(batches) > 1:
            table = pa.Table.from_batches(batches, schema=self.arrow)
            keys = (table.column("offset") if "offset" in self.arrow.names
                    else _offsets_of(chunks, start, end, floors))
            yield from table.take(_order(keys)).combine_chunks().to_batches()
            return
        yield from batches

    def batch(self, chunk: DecodedChunk, start: int, end: int) -> Optional[pa.RecordBatch]:
        """The rows of one decoded chunk in ``[start, end)`` (metadata columns only), built
        from the chunk's buffers without a Python object per message."""
        offsets = chunk.offsets
        a, b = bisect_left(offsets, start), bisect_left(offsets, end)
        n = b - a
        if n <= 0:
            return None
        total = len(offsets)
        arrays = []
        peers = None
        for pa_field in self.arrow:
            name, kind = pa_field.name, pa_field.type
            if name == "group":
                arrays.append(self.repeat(chunk.group, kind, n))
            elif name in ("sender", "sender_name", "headers"):
                if name == "headers":
                    described = [[{"key": k, "value": v} for k, v in
                                  _header_pairs(p[2] if len(p) > 2 else None)]
                                 for p in chunk.peers]
                else:
                    column = 0 if name == "sender" else 1
                    described = [p[column] for p in chunk.peers]
                if len(described) == 1:  # one sender (often): no index to follow
                    one = described[0]
                    arrays.append(self.repeat(one, kind, n) if isinstance(one, str)
                                  else pa.repeat(pa.scalar(one, kind), n))
                    continue
                if peers is None:
                    peers = _fixed(pa.int32(), total, chunk.peer_index).slice(a, n)
                arrays.append(pa.array(described, kind).take(peers))
            elif name == "received":
                arrays.append(_micros(chunk.received, a, n, kind))
            elif name == "offset":
                arrays.append(_fixed(kind, total, offsets).slice(a, n))
            elif name == "payload":
                arrays.append(_variable(kind, total, chunk.payload_ends,
                                        chunk.payload_data).slice(a, n))
            else:  # text
                arrays.append(self.text(chunk, a, b, kind))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow)

    def repeat(self, value: str, kind: pa.DataType, n: int) -> pa.Array:
        """A string column of ``n`` times ``value``: a slice of one made before when it
        is long enough (Arrow arrays do not change), else made and kept (a few at most)."""
        key = (value, kind)
        made = self._repeats.get(key)
        if made is None or len(made) < n:
            if len(self._repeats) >= _REPEATS_KEPT:
                self._repeats.clear()
            made = self._repeats[key] = _repeated(value.encode("utf-8"), kind, n)
        return made if len(made) == n else made.slice(0, n)

    def text(self, chunk: DecodedChunk, a: int, b: int, kind: pa.DataType) -> pa.Array:
        """The ``text`` of messages ``a`` to ``b - 1``: as the log stored it, when it did
        and ``decode`` is ``auto``; else made here."""
        states = chunk.text_states
        if (self.decode != "auto" or chunk.text_ends is None
                or states.find(TEXT_LATER, a, b) != -1):
            return pa.array(payload_texts(chunk.payloads(a, b), self.decode), kind)
        total = len(chunk.offsets)
        valid = None
        if states.find(TEXT_NULL, a, b) != -1:
            valid = _equal(_fixed(pa.uint8(), total, states), TEXT_STORED).buffers()[1]
        return _variable(kind, total, chunk.text_ends, chunk.text_data, valid).slice(a, b - a)

    def tuples(self, rows: Iterable[Any], headers: Mapping[str, Any]) -> Iterator[tuple]:
        """Python rows for any schema: metadata columns by name, the rest from the payload."""
        fields = self.schema.fields
        converters = self.converters
        decode = self.decode
        needs_value = self.needs_value
        utc = datetime.timezone.utc
        for offset, group, sender, name_, received, payload in rows:
            value = payload_value(payload, decode) if needs_value else None
            row = []
            for f, convert in zip(fields, converters):
                name = f.name
                if name == "group":
                    item: Any = group
                elif name == "sender":
                    item = sender
                elif name == "sender_name":
                    item = name_
                elif name == "received":
                    item = datetime.datetime.fromtimestamp(received, utc)
                elif name == "offset":
                    item = offset
                elif name == "payload":
                    item = payload
                elif name == "text":
                    item = payload_text(payload, decode)
                elif name == "headers":
                    item = _header_pairs(headers.get(sender))
                else:
                    item = value.get(name) if isinstance(value, dict) else None
                row.append(convert(item))
            yield tuple(row)


# pyarrow.compute is imported where rows are made, not where queries are planned (a
# streaming query's planner is a fresh Python process for each query: ~30 ms less)


def _order(keys: Any) -> pa.Array:
    """The indices that sort ``keys``."""
    import pyarrow.compute as pc
    return pc.sort_indices(keys)


def _micros(seconds: array, a: int, n: int, kind: pa.DataType) -> pa.Array:
    """Epoch seconds ``a`` to ``a + n - 1`` (float64) as a timestamp column ``kind``: whole
    microseconds, rounded half to even (numpy: a tenth of the CPU of Arrow's kernels here)."""
    import numpy as np
    micros = np.rint(np.frombuffer(seconds, np.float64, n, 8 * a) * 1e6).astype(np.int64)
    exact = pa.types.is_timestamp(kind) and kind.unit == "us"
    column = pa.Array.from_buffers(kind if exact else pa.int64(), n,
                                   [None, pa.py_buffer(micros)])
    return column if exact else column.cast(kind)


def _repeated(value: bytes, kind: pa.DataType, n: int) -> pa.Array:
    """A string or binary column of ``n`` times ``value``, made from its two buffers
    (``pa.repeat`` walks the values: ten times slower, a hundred for a one-octet value)."""
    import numpy as np
    if n * len(value) >= 2 ** 31:  # beyond 32-bit offsets: Arrow says why
        return pa.repeat(pa.scalar(value, kind), n)
    ends = np.arange(n + 1, dtype=np.int32) * len(value)
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(ends), pa.py_buffer(value * n)])


def _equal(values: pa.Array, value: int) -> pa.Array:
    import pyarrow.compute as pc
    return pc.equal(values, value)


def _fixed(kind: pa.DataType, n: int, values: Any) -> pa.Array:
    """An Arrow array of ``n`` fixed-width values over a buffer (native byte order)."""
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(values)])


def _variable(kind: pa.DataType, n: int, ends: array, data: bytes,
              valid: Optional[pa.Buffer] = None) -> pa.Array:
    """An Arrow string or binary array of ``n`` values: ``data`` cut at ``ends`` (n + 1
    int32 offsets), null where the ``valid`` bitmap has a 0 bit."""
    return pa.Array.from_buffers(kind, n, [valid, pa.py_buffer(ends), pa.py_buffer(data)],
                                 null_count=-1 if valid is not None else 0)


def _offsets_of(chunks: list[Chunk], start: int, end: int,
                floors: Mapping[str, int]) -> pa.Array:
    """The offsets ``emit`` keeps, chunk after chunk (to sort rows without an offset column)."""
    parts = []
    for chunk in chunks:
        offsets = decode_chunk(chunk).offsets
        first = max(start, floors.get(chunk.group, 0))
        a, b = bisect_left(offsets, first), bisect_left(offsets, end)
        parts.append(_fixed(pa.int64(), len(offsets), offsets).slice(a, b - a))
    return pa.concat_arrays(parts)


def value_converter(kind: DataType) -> Any:
    """A lenient converter for payload values: a wrong type becomes null, not an error."""

    def guard(fn: Any) -> Any:
        def convert(value: Any) -> Any:
            if value is None:
                return None
            try:
                return fn(value)
            except (TypeError, ValueError, OverflowError, ArithmeticError):
                return None
        return convert

    if isinstance(kind, (LongType, IntegerType, ShortType, ByteType)):
        return guard(lambda v: int(v) if not isinstance(v, (str, bytes)) or str(v).strip()
                     .lstrip("-").isdigit() else None)
    if isinstance(kind, (DoubleType, FloatType)):
        return guard(lambda v: float(v) if not isinstance(v, bytes) else None)
    if isinstance(kind, DecimalType):
        import decimal
        return guard(lambda v: decimal.Decimal(str(v)))
    if isinstance(kind, BooleanType):
        return guard(lambda v: v if isinstance(v, bool) else
                     (str(v).lower() in ("true", "1") if isinstance(v, (str, int)) else None))
    if isinstance(kind, StringType):
        return guard(lambda v: v if isinstance(v, str) else json.dumps(
            v, ensure_ascii=False, default=str) if not isinstance(v, bytes) else
            v.decode("utf-8", "replace"))
    if isinstance(kind, BinaryType):
        return guard(lambda v: bytes(v) if isinstance(v, (bytes, bytearray)) else
                     str(v).encode("utf-8"))
    if isinstance(kind, (TimestampType, TimestampNTZType)):
        utc = isinstance(kind, TimestampType)

        def stamp(v: Any) -> Any:
            if isinstance(v, datetime.datetime):
                return v
            if isinstance(v, (int, float)):
                when = datetime.datetime.fromtimestamp(v, datetime.timezone.utc)
            else:
                when = datetime.datetime.fromisoformat(str(v))
            return when if utc else when.replace(tzinfo=None)
        return guard(stamp)
    if isinstance(kind, DateType):
        return guard(lambda v: v if isinstance(v, datetime.date) else
                     datetime.date.fromisoformat(str(v)))
    if isinstance(kind, (ArrayType, MapType, StructType)):
        return lambda v: v  # left to Spark's own conversion
    return lambda v: v
