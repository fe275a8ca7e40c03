"""Calling Safir-Darbaan services of the mesh from Spark executors.

::

    caller = ServiceCaller("calc", "add", max_in_flight=64, errors="column")
    out = caller.apply(df, payload="numbers", reply_schema="sum double")
    # out: df's columns + sum, status, error

    # or by hand, in mapPartitions / mapInPandas / a UDF:
    rdd.mapPartitions(lambda rows: caller.replies([r.numbers for r in rows]))

Each Python worker process opens one mesh node with a channel the first
time it calls (``executor.executor_mesh``) and keeps it; servers on the mesh
connect to it. A batch of payloads goes to the node's hub in one hand-over
and at most ``max_in_flight`` requests are outstanding at any time.

When the driver's service runs an MTL gateway (``start_service(...,
gateway=...)``), calls go through it instead (``gateway``; see
``remotecalls``): the worker opens no mesh node, the driver's channel makes
the calls, and the outcomes are the same.

``errors="fail"`` (default): the first failed request (an error status,
no server, a timeout) fails the Spark task. ``errors="column"``: failures
become rows whose reply columns are null and whose ``status`` / ``error``
columns say what happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from .executor import GatewaySettings, MeshWriteError, Outcome, request_many
from .service import MeshSettings, current_service

__all__ = ["ServiceCaller", "ServiceCallError", "call_service"]


class ServiceCallError(MeshWriteError):
    """A request failed and the caller was made with ``errors="fail"``."""


@dataclass(frozen=True)
class ServiceCaller:
    """Requests to one service action from Spark workers (picklable, holds no sockets).

    ``mesh``: how worker nodes join the mesh (default: the settings of the
    ``DriverService`` running in this process, else each worker's defaults).
    ``timeout``: per request (None: the channel's default, 5 s).
    ``discovery_timeout``: how long a worker waits for a server of the
    service to appear. ``retries``: re-send a request once its server dies
    (only for idempotent actions).

    On a mesh with keys, ``key_file`` and ``allowed_keys`` are the secret
    certificate and the allowed-keys directory of the executors' hosts, as a
    writer's options ``keyFile`` and ``allowedKeys``: each worker's node and
    channel speak CURVE with that keypair and admit those keys (None: any
    key). They are paths on the workers' hosts, read there; the driver's own
    key is never handed to executors.
    """

    service: str
    action: str
    version: Optional[str] = None
    category: str = ""
    timeout: Optional[float] = None
    max_in_flight: int = 64
    retries: int = 0
    errors: str = "fail"
    discovery_timeout: float = 10.0
    mesh: Optional[MeshSettings] = field(default=None)
    key_file: Optional[str] = None
    allowed_keys: Optional[str] = None
    gateway: Union[GatewaySettings, bool, None] = None

    def __post_init__(self) -> None:
        if self.errors not in ("fail", "column"):
            raise ValueError(f"errors must be 'fail' or 'column', not {self.errors!r}")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        service = current_service() if self.mesh is None or self.gateway is None else None
        if self.mesh is None:
            object.__setattr__(self, "mesh", service.mesh if service is not None and
                               service.mesh is not None else MeshSettings())
        if self.gateway is None:
            options = service.options() if service is not None and \
                service.gateway_endpoint is not None else {}
            object.__setattr__(self, "gateway", GatewaySettings.from_options(
                {k.lower(): v for k, v in options.items()}) or False)
        elif self.gateway is True or not isinstance(self.gateway, (GatewaySettings, bool)):
            raise ValueError("gateway is GatewaySettings, False or None (the driver "
                             f"service's gateway, if any), not {self.gateway!r}")
        for name in ("key_file", "allowed_keys"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} is a path on the executors' hosts, not {value!r}")
        if self.allowed_keys is not None and self.key_file is None:
            raise ValueError("allowed_keys needs key_file, the secret certificate of the "
                             "executors' hosts (as a writer's allowedKeys needs keyFile)")
        if self.key_file is not None:
            assert self.mesh is not None
            object.__setattr__(self, "mesh", replace(self.mesh, key_file=self.key_file,
                                                     allowed_keys=self.allowed_keys))

    # --- plain Python: usable in any worker code ------------------------------

    def call_many(self, payloads: Sequence[Any]) -> list[Outcome]:
        """One ``Outcome`` per payload, in order (``errors="fail"``: raise on the first failure)."""
        assert self.mesh is not None
        try:
            gateway = self.gateway if isinstance(self.gateway, GatewaySettings) else None
            outcomes = request_many(self.mesh, gateway, self.service, self.action,
                                    list(payloads), version=self.version,
                                    category=self.category, timeout=self.timeout,
                                    window=self.max_in_flight, retries=self.retries,
                                    discovery_timeout=self.discovery_timeout)
        except MeshWriteError as exc:
            raise ServiceCallError(str(exc)) from exc
        if self.errors == "fail":
            for index, outcome in enumerate(outcomes):
                if not outcome.ok:
                    raise ServiceCallError(f"{self.service}/{self.action} request {index} of "
                                           f"this batch failed: {outcome.error}")
        return outcomes

    def replies(self, payloads: Iterable[Any], batch: int = 1000) -> Iterator[Any]:
        """The reply values, in order, sending ``batch`` payloads at a time (for
        ``mapPartitions``; failed requests give None with ``errors="column"``)."""
        chunk: list[Any] = []
        for payload in payloads:
            chunk.append(payload)
            if len(chunk) >= batch:
                yield from (o.value for o in self.call_many(chunk))
                chunk = []
        if chunk:
            yield from (o.value for o in self.call_many(chunk))

    # --- DataFrames -----------------------------------------------------------

    def output_schema(self, input_schema: Any, reply_schema: Any = None) -> Any:
        """``input_schema`` plus the reply columns (and ``status``, ``error``)."""
        from pyspark.sql.types import IntegerType, StringType, StructField, StructType

        reply = _reply_fields(reply_schema)
        fields = list(input_schema.fields) + list(reply.fields)
        if self.errors == "column":
            fields += [StructField("status", IntegerType(), True),
                       StructField("error", StringType(), True)]
        names = [f.name for f in fields]
        clash = sorted({n for n in names if names.count(n) > 1})
        if clash:
            raise ValueError(f"reply columns clash with the input's: {', '.join(clash)}")
        return StructType(fields)

    def apply(self, df: Any, payload: Union[str, Sequence[str], None] = None,
              reply_schema: Any = None) -> Any:
        """``df`` with each row's reply as columns (through ``mapInArrow``).

        ``payload``: the column whose value is sent, a list of columns sent as
        a map, or None (the whole row as a map). ``reply_schema`` (DDL string
        or StructType): columns taken from a map reply by name (a one-column
        schema also takes a reply that is not a map); None: one ``reply``
        column holding the reply as JSON.
        """
        out_schema = self.output_schema(df.schema, reply_schema)
        reply = _reply_fields(reply_schema)
        return df.mapInArrow(_ArrowMapper(self, payload, reply, out_schema), out_schema)


def _reply_fields(reply_schema: Any) -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    if reply_schema is None:
        return StructType([StructField("reply", StringType(), True)])
    if isinstance(reply_schema, str):
        from pyspark.sql.types import _parse_datatype_string

        parsed = _parse_datatype_string(reply_schema)
        if not isinstance(parsed, StructType):
            raise ValueError(f"reply_schema {reply_schema!r} is not a struct")
        return StructType([StructField(f.name, f.dataType, True) for f in parsed.fields])
    return StructType([StructField(f.name, f.dataType, True) for f in reply_schema.fields])


class _ArrowMapper:
    """The ``mapInArrow`` function of ``ServiceCaller.apply`` (picklable)."""

    def __init__(self, caller: ServiceCaller, payload: Union[str, Sequence[str], None],
                 reply: Any, out_schema: Any) -> None:
        self.caller = caller
        self.payload = payload
        self.reply = reply
        self.out_schema = out_schema

    def _payloads(self, rows: list[dict]) -> list[Any]:
        payload = self.payload
        if payload is None:
            return rows
        if isinstance(payload, str):
            return [row[payload] for row in rows]
        return [{k: row[k] for k in payload} for row in rows]

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import json

        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        from .codec import to_jsonable
        from .columns import value_converter

        arrow = to_arrow_schema(self.out_schema, timezone="UTC")
        reply_fields = self.reply.fields
        converters = [value_converter(f.dataType) for f in reply_fields]
        as_json = _is_default_reply(self.reply)
        with_errors = self.caller.errors == "column"
        for batch in batches:
            if batch.num_rows == 0:
                continue
            rows = batch.to_pylist()
            outcomes = self.caller.call_many(self._payloads(rows))
            columns: list[list[Any]] = [[] for _ in reply_fields]
            for outcome in outcomes:
                value = outcome.value if outcome.ok else None
                if as_json:
                    columns[0].append(None if not outcome.ok else json.dumps(
                        to_jsonable(value), ensure_ascii=False, separators=(",", ":")))
                    continue
                for i, (f, convert) in enumerate(zip(reply_fields, converters)):
                    if isinstance(value, dict):
                        item = value.get(f.name)
                    elif len(reply_fields) == 1:
                        item = value
                    else:
                        item = None
                    columns[i].append(convert(item))
            arrays = list(batch.columns)
            fields = list(batch.schema)
            width = batch.num_columns
            for i, values in enumerate(columns):
                fields.append(arrow.field(width + i))
                arrays.append(pa.array(values, fields[-1].type))
            if with_errors:
                fields += [arrow.field("status"), arrow.field("error")]
                arrays.append(pa.array([o.status for o in outcomes], fields[-2].type))
                arrays.append(pa.array([o.error for o in outcomes], fields[-1].type))
            yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _is_default_reply(reply: Any) -> bool:
    from pyspark.sql.types import StringType

    return len(reply.fields) == 1 and reply.fields[0].name == "reply" and \
        isinstance(reply.fields[0].dataType, StringType)


def call_service(df: Any, service: str, action: str, *,
                 payload: Union[str, Sequence[str], None] = None, reply_schema: Any = None,
                 **settings: Any) -> Any:
    """``ServiceCaller(service, action, **settings).apply(df, payload, reply_schema)``."""
    return ServiceCaller(service, action, **settings).apply(df, payload, reply_schema)
