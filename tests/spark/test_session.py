"""local_session: the settings it makes, with the caller's."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_java_options_join_the_temporary_directory(spark: Any) -> None:
    """The fixture's session passes a JVM option of its own: the JVM gets it and keeps the
    temporary directory under the session's directory."""
    system = spark.sparkContext._jvm.java.lang.System
    assert system.getProperty("peermesh.tests") == "1"
    tmp = Path(system.getProperty("java.io.tmpdir"))
    assert tmp.name == "tmp" and tmp.parent.name.startswith("spark"), tmp
