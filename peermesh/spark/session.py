"""A local SparkSession with the settings that work for peermesh on one machine.

``local_session(tmp_dir)`` sets, before the JVM starts:

* ``SPARK_LOCAL_IP=127.0.0.1`` (otherwise Spark binds a non-loopback address),
* ``PYSPARK_DRIVER_PYTHON`` to this interpreter, and ``PYSPARK_PYTHON`` to
  this environment's ``peermesh-pyspark-python`` (this interpreter, with the
  installed pyspark ahead of Spark's zip: each stream then starts ~0.5 s
  sooner; see ``pythonexec``), or to this interpreter where that script is
  missing (otherwise Python workers may run another Python, without peermesh),

and builds ``local[N]`` with the UI off, the driver bound to 127.0.0.1 and
the warehouse, local and checkpoint directories under ``tmp_dir``. It never
uses ``spark.jars.packages`` (no Maven access needed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Union

from .pythonexec import installed_launcher

__all__ = ["local_session", "local_environment"]


def local_environment() -> dict[str, str]:
    """The environment variables ``local_session`` sets (already set ones are kept)."""
    workers = installed_launcher() or sys.executable
    return {"SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", workers),
            "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable)}


def local_session(tmp_dir: Union[str, os.PathLike[str]], app: str = "peermesh", cores: int = 2,
                  log_level: str = "WARN", **conf: Any) -> Any:
    """A ``SparkSession`` on ``local[cores]``, everything on loopback and under ``tmp_dir``.

    Further settings go in ``conf``: ``**{"spark.sql.shuffle.partitions": "4"}``
    (``spark.driver.extraJavaOptions`` there is added to the temporary directory's).
    """
    os.environ.update(local_environment())
    from pyspark.sql import SparkSession

    base = Path(tmp_dir)
    for sub in ("warehouse", "local", "checkpoints", "tmp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    java = " ".join(filter(None, (f"-Djava.io.tmpdir={base / 'tmp'}",
                                  conf.pop("spark.driver.extraJavaOptions", None))))
    builder = (SparkSession.builder.master(f"local[{cores}]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.warehouse.dir", str(base / "warehouse"))
               .config("spark.local.dir", str(base / "local"))
               .config("spark.sql.streaming.checkpointLocation", str(base / "checkpoints"))
               .config("spark.driver.extraJavaOptions", java)
               .config("spark.sql.shuffle.partitions", str(cores))
               .config("spark.python.worker.reuse", "true"))
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark
