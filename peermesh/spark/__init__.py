"""PySpark integration: mesh groups as Spark tables and streams, the mesh as a sink.

::

    import peermesh.spark

    service = peermesh.spark.start_service(spark, groups=["telemetry"], interface="lo")
    stream = (spark.readStream.format("peermesh").option("group", "telemetry").load())
    ...
    df.write.format("peermesh").option("group", "alerts").save()
    service.stop()

* ``start_service`` - a mesh node in the driver process (its own thread, no
  monkey-patching) that logs every SHOUT of its groups to SQLite and serves
  the log to Spark's workers; it also registers the data source.
* ``register`` - the ``peermesh`` data source alone (``pyspark.sql.datasource``).
* ``ServiceCaller`` / ``call_service`` - Safir-Darbaan requests from
  executors, for ``mapInArrow`` / ``mapInPandas`` / ``mapPartitions``.

Only ``register``, ``call_service`` and ``ServiceCaller.apply`` import
pyspark; the service and the log work without it. The service (and gevent
with it) is imported on first use: Spark's Python workers import this
package to read and write, and a streaming query's planner is a fresh
process for each query.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from .log import MessageLog
from .protocol import DataLossError, LogServiceError

if TYPE_CHECKING:
    from .service import DriverService, MeshSettings, current_service

__all__ = ["start_service", "register", "DriverService", "MeshSettings", "MessageLog",
           "ServiceCaller", "call_service", "current_service", "LogServiceError",
           "DataLossError", "SCHEMA", "schema"]


def start_service(spark: Any = None, groups: Iterable[str] = (), **settings: Any
                  ) -> DriverService:
    """Start a ``DriverService`` in this process; with ``spark``, also ``register`` the
    ``peermesh`` data source pointed at it and set ``spark.peermesh.endpoint``.

    Keyword settings are ``DriverService``'s. Stop it with ``service.stop()``
    (or use it as a context manager).
    """
    from .service import DriverService

    service = DriverService(groups, **settings).start()
    if spark is not None:
        try:
            register(spark, service)
            assert service.endpoint is not None
            spark.conf.set("spark.peermesh.endpoint", service.endpoint)
        except BaseException:
            service.stop()
            raise
    return service


def register(spark: Any, service: Any = None, **options: Any) -> type:
    """Register the ``peermesh`` format with ``spark`` (see ``source.register``)."""
    from .source import register as _register

    return _register(spark, service, **options)


def schema() -> Any:
    """The default read schema, a ``pyspark.sql.types.StructType``."""
    from .source import SCHEMA as _SCHEMA

    return _SCHEMA


def __getattr__(name: str) -> Any:
    if name in ("ServiceCaller", "call_service"):
        from . import calls

        return getattr(calls, name)
    if name in ("DriverService", "MeshSettings", "current_service"):
        from . import service

        return getattr(service, name)
    if name == "SCHEMA":
        return schema()
    raise AttributeError(f"module 'peermesh.spark' has no attribute {name!r}")
