"""peermesh-pyspark-python: Spark's zips behind the installed release, ``-m`` as Python runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from peermesh.spark.pythonexec import installed_first, installed_launcher

from .conftest import spark_unavailable

VERSION = b'__version__: str = "9.8.7"\n'


def package(root: Path, name: str, version: bytes) -> Path:
    """An installed ``name`` under ``root`` whose ``version.py`` is ``version``."""
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_bytes(b"")
    (root / name / "version.py").write_bytes(version)
    return root


def archive(path: Path, files: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as zipped:
        for name, data in files.items():
            zipped.writestr(name, data)
    return str(path)


def test_a_zip_of_the_installed_release_goes_behind_everything_else(tmp_path: Path) -> None:
    site = str(package(tmp_path / "site", "pyspark", VERSION))
    spark_zip = archive(tmp_path / "pyspark.zip", {"pyspark/__init__.py": b"",
                                                   "pyspark/version.py": VERSION})
    assert installed_first([spark_zip, "/elsewhere", site]) == ["/elsewhere", site, spark_zip]


@pytest.mark.parametrize("files", [
    {"pyspark/version.py": b'__version__: str = "9.8.6"\n'},   # another release
    {"other/version.py": VERSION},                             # a package it does not know
    {},                                                        # an empty archive
], ids=["another-release", "another-package", "empty"])
def test_a_zip_without_an_installed_twin_stays_where_it_is(tmp_path: Path, files: Any) -> None:
    site = str(package(tmp_path / "site", "pyspark", VERSION))
    spark_zip = archive(tmp_path / "pyspark.zip", files)
    assert installed_first([spark_zip, site]) == [spark_zip, site]


def test_a_zip_stays_first_when_its_package_is_not_installed_or_it_is_no_archive(
        tmp_path: Path) -> None:
    spark_zip = archive(tmp_path / "pyspark.zip", {"pyspark/version.py": VERSION})
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not an archive")
    path = [spark_zip, str(broken), str(tmp_path / "missing.zip"), str(tmp_path)]
    assert installed_first(path) == path


def script(directory: Path, first_line: str, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "peermesh-pyspark-python"
    path.write_text(f"{first_line}\nprint('launched')\n")
    path.chmod(mode)
    return path


def test_the_launcher_is_the_first_one_whose_first_line_names_this_interpreter(
        tmp_path: Path) -> None:
    other = script(tmp_path / "user", "#!/usr/bin/python2.7")  # another Python's, shared dir
    unrunnable = script(tmp_path / "noexec", f"#!{sys.executable}", mode=0o644)
    mine = script(tmp_path / "env", f"#!{os.path.realpath(sys.executable)} -E")
    no_shebang = script(tmp_path / "plain", "print('no #! line')")
    dirs = [str(path.parent) for path in (other, unrunnable, no_shebang, mine)]
    assert installed_launcher(dirs) == str(mine)
    assert installed_launcher(dirs[:3] + [str(tmp_path / "missing")]) is None


PROBE = """
import json, sys
import pyspark, py4j
print(json.dumps({"name": __name__, "argv": sys.argv, "path": sys.path,
                  "pyspark": pyspark.__file__, "py4j": py4j.__file__}))
"""


@pytest.fixture
def spark_zips() -> list[str]:
    """Spark's own ``pyspark.zip`` and py4j zip, as Spark puts them on ``PYTHONPATH``."""
    reason = spark_unavailable()
    if reason is not None:
        pytest.skip(reason)
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(path) for path in lib.glob("*.zip"))
    assert any(path.endswith("/pyspark.zip") for path in zips), zips
    return zips


def launcher() -> str:
    path = installed_launcher()
    assert path is not None, "peermesh-pyspark-python is not installed (pip install -e .)"
    return path


def run(argv: list[str], cwd: Path, pythonpath: list[str],
        **env: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath), **env}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("safe_path", ["", "1"], ids=["cwd-first", "PYTHONSAFEPATH"])
def test_the_launcher_runs_a_module_as_python_m_does_with_the_installed_pyspark(
        tmp_path: Path, spark_zips: list[str], safe_path: str) -> None:
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "probe.py").write_text(PROBE)
    work = tmp_path / "work"
    work.mkdir()
    pythonpath = [*spark_zips, str(tmp_path / "modules")]
    argv = ["-m", "probe", "--flag", "value"]
    plain = run([sys.executable, *argv], work, pythonpath, PYTHONSAFEPATH=safe_path)
    launched = run([launcher(), *argv], work, pythonpath, PYTHONSAFEPATH=safe_path)
    assert plain.returncode == 0 and launched.returncode == 0, (plain.stderr, launched.stderr)
    seen, expected = json.loads(launched.stdout), json.loads(plain.stdout)
    assert ".zip" in expected.pop("pyspark") + expected.pop("py4j")  # Spark's zips win without it
    assert ".zip" not in seen.pop("pyspark") + seen.pop("py4j")
    assert (expected["path"][0] == str(work)) == (not safe_path)
    expected["path"] = [entry for entry in expected["path"] if entry not in spark_zips] + spark_zips
    assert seen == expected
    assert expected["name"] == "__main__"
    assert expected["argv"] == [str(tmp_path / "modules" / "probe.py"), "--flag", "value"]


def test_any_other_command_line_goes_to_the_interpreter_as_it_is(tmp_path: Path) -> None:
    code = "import os, sys; print(os.path.realpath(sys.executable), sys.argv[1:]); sys.exit(3)"
    done = run([launcher(), "-c", code, "x"], tmp_path, [])
    assert (done.returncode, done.stdout.split()) == (3, [os.path.realpath(sys.executable),
                                                          "['x']"])


def test_a_streams_planner_and_the_workers_import_the_installed_pyspark(spark: Any) -> None:
    """The session's Python (``local_session``'s default) plans a stream and runs its
    tasks: both processes import pyspark from the installed copy, not from Spark's zip."""
    from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
    from pyspark.sql.functions import udf

    class Where(SimpleDataSourceStreamReader):
        def initialOffset(self) -> dict[str, int]:
            return {"read": 0}

        def read(self, start: dict[str, int]) -> Any:  # runs in the stream's planner
            import pyspark

            return iter([(pyspark.__file__,)] * (1 - start["read"])), {"read": 1}

        def readBetweenOffsets(self, start: dict[str, int], end: dict[str, int]) -> Any:
            return self.read(start)[0]

    class WhereSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pyspark_where"

        def schema(self) -> str:
            return "planner string"

        def simpleStreamReader(self, schema: Any) -> Where:
            return Where()

    @udf("string")
    def worker(_):  # type: ignore[no-untyped-def]  # hints would make Spark look for pandas
        import pyspark

        return pyspark.__file__

    assert installed_launcher() in spark.sparkContext.pythonExec
    spark.dataSource.register(WhereSource)
    query = (spark.readStream.format("pyspark_where").load()
             .select("planner", worker("planner").alias("worker"))
             .writeStream.format("memory").queryName("pyspark_where")
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(120), "the stream did not end within 120 s"
        rows = spark.sql("select * from pyspark_where").collect()
    finally:
        query.stop()
    assert len(rows) == 1 and ".zip" not in rows[0].planner + rows[0].worker, rows
