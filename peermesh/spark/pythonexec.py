"""A Python for Spark to start: the installed pyspark ahead of Spark's zip.

Spark starts each Python process it needs as ``PYSPARK_PYTHON -m MODULE``
(its worker daemon, and for every streaming query from a Python data source
``pyspark.sql.streaming.python_streaming_source_runner``) with its own
``pyspark.zip`` and py4j zip first on ``PYTHONPATH``. Python keeps no
bytecode for what it imports from a zip, so each of those processes compiles
pyspark again before it can answer: about 0.6 s of CPU per streaming query.

``peermesh-pyspark-python`` (installed with peermesh, ``main`` here) moves
each such zip behind the installed copy of the same release, whose bytecode
is cached, and then runs the module as ``python -m`` does. A zip whose
package is not installed, or installed in another release, stays first. Any
command line other than ``-m MODULE ...`` goes to the interpreter as it is.
"""

from __future__ import annotations

import os
import runpy
import sys
import sysconfig
import zipimport
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Iterable, Optional, Sequence

__all__ = ["installed_first", "installed_launcher", "main"]

_PACKAGES = ("pyspark", "py4j")
LAUNCHER_NAME = "peermesh-pyspark-python"


def installed_first(path: Sequence[str]) -> list[str]:
    """``path`` with every zip whose package is installed in the same release moved to its end."""
    unzipped = [entry for entry in path if not entry.endswith(".zip")]
    twins = [entry for entry in path
             if entry.endswith(".zip") and _has_installed_twin(entry, unzipped)]
    return [entry for entry in path if entry not in twins] + twins


def _has_installed_twin(archive: str, unzipped: list[str]) -> bool:
    try:
        zipped = zipimport.zipimporter(archive)
    except (zipimport.ZipImportError, OSError):
        return False
    for package in _PACKAGES:
        try:
            version = zipped.get_data(f"{package}/version.py")
        except OSError:
            continue
        installed = PathFinder.find_spec(package, unzipped)
        if installed is None or not installed.submodule_search_locations:
            return False
        twin = Path(list(installed.submodule_search_locations)[0], "version.py")
        try:
            return twin.read_bytes() == version
        except OSError:
            return False
    return False


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run ``-m MODULE ARGS`` with installed packages ahead of their zips; else exec Python."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "-m":
        os.execv(sys.executable, [sys.executable, *args])
    if sys.flags.safe_path:  # neither this script's directory nor -m's is on the path
        sys.path[:] = installed_first(sys.path)
    else:  # -m puts the working directory where a script's own directory is
        sys.path[:] = [os.getcwd(), *installed_first(sys.path[1:])]
    sys.argv = [sys.argv[0], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)


def installed_launcher(directories: Optional[Iterable[str]] = None) -> Optional[str]:
    """The path of ``peermesh-pyspark-python`` for this interpreter, if it is installed.

    It is looked for in ``directories`` (by default where this environment's
    scripts go, then the user's), and taken only when its ``#!`` line names
    this interpreter: the user's directory is shared by every Python version.
    """
    if directories is None:
        directories = [sysconfig.get_path("scripts", scheme) for scheme in
                       (sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user"))]
    interpreter = os.path.realpath(sys.executable)
    for directory in directories:
        script = os.path.join(directory, LAUNCHER_NAME)
        if os.access(script, os.X_OK) and _shebang_interpreter(script) == interpreter:
            return script
    return None


def _shebang_interpreter(script: str) -> Optional[str]:
    try:
        with open(script, "rb") as file:
            first = file.readline(4096)
    except OSError:
        return None
    words = first[2:].split() if first.startswith(b"#!") else []
    return os.path.realpath(os.fsdecode(words[0])) if words else None
