"""scripts/bench_spark.py removes the scratch it makes: after a run, and when stopped midway."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from childprocs import in_session

from .conftest import spark_unavailable, wait_until

REPO = Path(__file__).resolve().parents[2]
#: bounds: a whole small run (two Spark sessions start), and the stop after SIGTERM
RUN_TIMEOUT = 300.0
STOP_TIMEOUT = 60.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(RUN_TIMEOUT + 2 * STOP_TIMEOUT)]

Bench = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """The benchmark's ``TMPDIR``: empty, and the only place it may leave anything."""
    reason = spark_unavailable()
    if reason is not None:
        pytest.skip(reason)
    path = tmp_path / "tmp"
    path.mkdir()
    return path


@pytest.fixture
def bench(scratch: Path) -> Iterator[Bench]:
    """``bench(*args)``: bench_spark.py in a session of its own with ``TMPDIR`` the scratch;
    at teardown every process of that session (its children are in groups of their own)
    is gone, killed if need be."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "bench_spark.py"), *args],
                                env={**os.environ, "TMPDIR": str(scratch)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        for pid in in_session(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.communicate()


def output(proc: subprocess.Popen[bytes], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"bench_spark still ran after {timeout} s")
    return out.decode(errors="replace")


def test_a_finished_run_of_the_read_and_ingest_phases_leaves_nothing(
        bench: Bench, scratch: Path) -> None:
    proc = bench("--only", "read,ingest", "--rows", "20000", "--rounds", "1",
                 "--peers", "1", "--messages", "2000")
    out = output(proc, RUN_TIMEOUT)
    assert proc.returncode == 0, out
    assert "batch read of 20,000 rows" in out and "ingest end to end" in out, out
    wait_until(lambda: not in_session(proc.pid), STOP_TIMEOUT, "the benchmark's processes to end")
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("stage", [
    "bench-spark-read-*/*",           # the reader is starting its Spark session
    "bench-spark-read-*/*/log/*",     # its Spark session runs and it fills the log
], ids=["starting", "filling"])
def test_a_run_stopped_with_sigterm_midway_leaves_nothing(bench: Bench, scratch: Path,
                                                          stage: str) -> None:
    proc = bench("--only", "read", "--rows", "2000000", "--rounds", "3")

    def reached() -> bool:
        assert proc.poll() is None, output(proc, STOP_TIMEOUT)
        return any(scratch.glob(stage))

    wait_until(reached, RUN_TIMEOUT, stage)
    os.kill(proc.pid, signal.SIGTERM)
    out = output(proc, STOP_TIMEOUT)
    assert proc.returncode != 0 and "interrupted" in out, out
    wait_until(lambda: not in_session(proc.pid), STOP_TIMEOUT, "the benchmark's processes to end")
    assert list(scratch.iterdir()) == []
