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
"""

from __future__ import annotations

import datetime
import itertools
import json
import logging
import math
import time
import uuid
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (DataSource, DataSourceReader, DataSourceStreamReader,
                                    DataSourceStreamWriter, DataSourceWriter, InputPartition,
                                    WriterCommitMessage)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)
from pyspark.sql.types import (ArrayType, BinaryType, BooleanType, DataType, DateType,
                               DecimalType, DoubleType, FloatType, IntegerType, LongType,
                               MapType, ShortType, ByteType, StringType, StructField,
                               StructType,
                               TimestampNTZType, TimestampType)

from .client import local_log, log_client
from .codec import (TEXT_LATER, TEXT_NULL, TEXT_STORED, pack_value, payload_text,
                    payload_texts, payload_value)
from .log import Chunk, DecodedChunk, decode_chunk, rows_of
from .options import Use, check as check_options, check_use, parsed
from .protocol import MAX_FETCH_BYTES, DataLossError

if TYPE_CHECKING:
    from .executor import GatewaySettings
    from .service import MeshSettings

__all__ = ["PeermeshDataSource", "SCHEMA", "register", "SourceOptions", "WriteOptions"]

log = logging.getLogger(__name__)

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
#: the column a write without option ``group`` takes each row's group from (Kafka's ``topic``)
GROUP_COLUMN = "group"


def _groups(options: Mapping[str, str]) -> list[str]:
    raw = options.get("group") or options.get("groups") or ""
    groups = [g.strip() for g in raw.split(",") if g.strip()]
    return list(dict.fromkeys(groups))


@dataclass(frozen=True)
class SourceOptions:
    """Read options, parsed (keys arrive lower-cased, values as strings)."""

    endpoint: str
    groups: tuple[str, ...]
    token: Optional[str] = None
    #: the log service's CURVE public key (``DriverService.server_key``), if it has keys
    server_key: Optional[str] = None
    partitions: int = 1
    starting: str = "latest"
    ending: str = "latest"
    max_offsets: Optional[int] = None
    fail_on_data_loss: bool = True
    decode: str = "auto"
    auto_join: bool = True
    #: where single groups start, as ``startingOffsets`` allows per group
    starting_by_group: Mapping[str, str] = field(default_factory=dict)
    #: epoch seconds per group: start at the first message received then or later
    starting_times: Mapping[str, float] = field(default_factory=dict)
    min_offsets: Optional[int] = None
    max_trigger_delay: float = 15 * 60.0
    consumer_name: Optional[str] = None
    #: a group with no message at or after its starting time: ``error`` or ``latest``
    timestamp_strategy: str = "error"

    @classmethod
    def parse(cls, options: Mapping[str, str], batch: bool) -> "SourceOptions":
        """From data source options; ``ValueError`` naming the bad option."""
        endpoint = options.get("endpoint")
        if not endpoint:
            raise ValueError(
                "option 'endpoint' (the driver's log service, tcp://HOST:PORT) is missing: "
                "start it with peermesh.spark.start_service(spark, groups=[...]), which "
                "registers the source with the endpoint, or pass .option('endpoint', ...)")
        groups = _groups(options)
        if not groups:
            raise ValueError("option 'group' is missing: name one group, or several "
                             "separated by commas")
        check_use(options, Use.BATCH_READ if batch else Use.STREAM_READ)
        default = "earliest" if batch else "latest"
        starting = parsed(options, "startingOffsets", default)
        by_group = starting if isinstance(starting, dict) else {}
        at = parsed(options, "startingTimestamp")
        named_times = parsed(options, "startingOffsetsByTimestamp", {})
        # startingOffsetsByTimestamp wins for the groups it names, startingTimestamp holds
        # for the others
        times = {**({g: at for g in groups} if at is not None else {}), **named_times}
        for name, named in (("startingOffsets", by_group),
                            ("startingOffsetsByTimestamp", named_times)):
            stray = sorted(set(named) - set(groups))
            if stray:
                raise ValueError(f"option {name} names group(s) {', '.join(stray)} that the "
                                 f"read does not include (groups: {', '.join(groups)})")
        ending = parsed(options, "endingOffsets", "latest")
        if batch:  # as Kafka's source: a batch reads a range that is there
            if "latest" in ([starting] if isinstance(starting, str) else starting.values()):
                raise ValueError("option startingOffsets: latest (-1) is not valid for a "
                                 "batch read (spark.read), as in Kafka's source: start at "
                                 "earliest, an offset, or use spark.readStream")
            if ending == "earliest":
                raise ValueError("option endingOffsets: earliest (-2) is not valid for a "
                                 "batch read, as in Kafka's source: end at latest or an offset")
        least, most = (parsed(options, "minOffsetsPerTrigger"),
                       parsed(options, "maxOffsetsPerTrigger"))
        if least is not None and most is not None and least > most:
            raise ValueError(f"option minOffsetsPerTrigger ({least}) must not be greater than "
                             f"maxOffsetsPerTrigger ({most}), as in Kafka's source")
        return cls(endpoint=endpoint, groups=tuple(groups), token=options.get("token") or None,
                   server_key=options.get("serverkey") or None,
                   partitions=parsed(options, "partitions", 1),
                   starting=default if by_group else starting,
                   starting_by_group=by_group, starting_times=times,
                   min_offsets=least,
                   max_trigger_delay=parsed(options, "maxTriggerDelay", 15 * 60.0),
                   consumer_name=parsed(options, "consumerName"),
                   ending=ending, max_offsets=most,
                   timestamp_strategy=parsed(options, "startingOffsetsByTimestampStrategy",
                                             "error"),
                   fail_on_data_loss=parsed(options, "failOnDataLoss", True),
                   decode=parsed(options, "decode", "auto"),
                   auto_join=parsed(options, "autoJoin", True))


@dataclass(frozen=True)
class WriteOptions:
    """Write options, parsed."""

    group: Optional[str]
    service: Optional[str]
    action: Optional[str]
    version: Optional[str]
    category: str
    column: Optional[str]
    mesh: MeshSettings
    peers: int = 1
    discovery_timeout: float = 10.0
    require_delivery: bool = True
    timeout: Optional[float] = None
    max_in_flight: int = 64
    retries: int = 0
    #: shout each row to the group its ``group`` column names (no option ``group``)
    group_column: bool = False
    #: write through the driver's MTL gateway (option ``gateway``) instead of a mesh node
    gateway: Optional[GatewaySettings] = None

    @classmethod
    def parse(cls, options: Mapping[str, str], columns: Sequence[str] = ()) -> "WriteOptions":
        """From data source options (and the data's column names); ``ValueError`` naming
        the bad option."""
        from .executor import GatewaySettings
        from .service import MeshSettings

        check_use(options, Use.WRITE)
        group, service = options.get("group") or None, options.get("service") or None
        by_column = group is None and service is None and GROUP_COLUMN in columns
        if (group is None) == (service is None) and not by_column:
            raise ValueError("a peermesh write needs exactly one of option 'group' (shout each "
                             "row), a 'group' column (shout each row to the group it names) "
                             "or option 'service' (send each row as a Safir-Darbaan "
                             "request, with option 'action')")
        if service is not None and not options.get("action"):
            raise ValueError("option 'service' needs option 'action'")
        gateway = GatewaySettings.from_options(options)
        if options.get("serverkey") and not options.get("keyfile") and gateway is None:
            raise ValueError("the mesh has keys (option serverKey is set): a write needs "
                             "option keyFile, the secret certificate of the workers' hosts "
                             "(and allowedKeys, the directory of the keys they admit)")
        return cls(group=group, service=service, action=options.get("action") or None,
                   version=options.get("version") or None,
                   category=options.get("category") or "",
                   column=options.get("column") or None,
                   mesh=MeshSettings.from_options(options),
                   peers=parsed(options, "peers", 1),
                   discovery_timeout=parsed(options, "discoveryTimeout", 10.0),
                   require_delivery=parsed(options, "requireDelivery", True),
                   timeout=parsed(options, "timeout"),
                   max_in_flight=parsed(options, "maxInFlight", 64),
                   retries=parsed(options, "retries", 0), group_column=by_column,
                   gateway=gateway)


# --- offsets ------------------------------------------------------------------


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


# --- reading rows -------------------------------------------------------------


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
                arrays.append(pa.repeat(pa.scalar(chunk.group, kind), n))
            elif name in ("sender", "sender_name", "headers"):
                if peers is None:
                    peers = _fixed(pa.int32(), total, chunk.peer_index).slice(a, n)
                if name == "headers":
                    described = [[{"key": k, "value": v} for k, v in
                                  _header_pairs(p[2] if len(p) > 2 else None)]
                                 for p in chunk.peers]
                else:
                    column = 0 if name == "sender" else 1
                    described = [p[column] for p in chunk.peers]
                arrays.append(pa.array(described, kind).take(peers))
            elif name == "received":
                seconds = _fixed(pa.float64(), total, chunk.received).slice(a, n)
                arrays.append(_micros(seconds).cast(kind))
            elif name == "offset":
                arrays.append(_fixed(pa.int64(), total, offsets).slice(a, n).cast(kind))
            elif name == "payload":
                arrays.append(_variable(kind, total, chunk.payload_ends,
                                        chunk.payload_data).slice(a, n))
            else:  # text
                arrays.append(self.text(chunk, a, b, kind))
        return pa.RecordBatch.from_arrays(arrays, schema=self.arrow)

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


def _micros(seconds: pa.Array) -> pa.Array:
    """Epoch seconds (float64) as whole microseconds (int64)."""
    import pyarrow.compute as pc
    return pc.round(pc.multiply(seconds, 1_000_000.0)).cast(pa.int64())


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


def read_range(opts: SourceOptions, schema: StructType, part: OffsetRange) -> Iterator[Any]:
    """Rows of ``part`` fetched from the log service (Arrow batches when possible)."""
    local = local_log(part.path, part.host, part.log_id)
    if local is not None:  # on the driver's machine: read the file, not through the service
        def fetch(start: int, end: int) -> dict:
            return local.fetch(start, end, opts.groups, MAX_FETCH_BYTES)
    else:
        def fetch(start: int, end: int) -> dict:
            return log_client(opts.endpoint, opts.token, opts.server_key).fetch(opts.groups, start, end)
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


# --- readers ------------------------------------------------------------------


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


    def _starts(self, default: str) -> tuple[int, dict[str, int]]:
        """Where the read starts: the lowest start of its groups, and the later starts of
        single groups (``startingOffsets`` per group, or by time)."""
        opts = self.opts
        client = self._client()
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
            info = client.info([group])
            spec = opts.starting_by_group.get(group, default)
            starts[group] = _resolve(spec, info["earliest"], info["next"])
            if starts[group] < info["earliest"]:
                _data_loss(opts, f"startingOffsets {starts[group]} of group {group!r} is below "
                                 f"the earliest offset it holds, {info['earliest']}")
        first = min(starts.values())
        return first, {g: n for g, n in starts.items() if n > first}


class BatchReader(_ReaderBase, DataSourceReader):
    """``spark.read.format("peermesh")``: what the log holds between two offsets."""

    def partitions(self) -> Sequence[InputPartition]:
        """Split ``[startingOffsets, endingOffsets)`` (default: everything held)."""
        info = self._info()
        start, floors = self._starts(self.opts.starting)
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
        self._last_batch = time.monotonic()    # for minOffsetsPerTrigger's maxTriggerDelay

    def _ensure(self) -> None:
        if not self._ready:
            self._info(join=True)
            self._ready = True

    def initialOffset(self) -> dict:
        """Where a new query starts (``startingOffsets``); registers it as a consumer."""
        info = self._info(join=True)
        self._ready = True
        start, floors = self._starts(self.opts.starting)
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
        return _offset(reply["log"], end, consumer, floors)

    def reportLatestOffset(self) -> Optional[dict]:
        """The log's next offset and, per group, how many messages the query is behind
        (``behind``), for the query's progress reports."""
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
        """Everything below ``end`` is processed: tell the log (which may trim it)."""
        consumer = end.get("consumer")
        if consumer is None or end.get("log") != self._log_id and self._log_id is not None:
            return
        try:
            self._client().commit(consumer, self.opts.groups, int(end["offset"]))
        except Exception:  # trimming is a convenience: never fail the query for it
            log.warning("peermesh source: commit of offset %s failed", end, exc_info=True)

    def stop(self) -> None:
        """Nothing to release: sockets belong to the process, not the reader."""


# --- writers ------------------------------------------------------------------


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


# --- the data source ----------------------------------------------------------


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
