"""The benchmarks' shared harness (scripts/harness.py): statistics, the table, rounds,
and child processes that end however the run does."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts"))

import harness  # noqa: E402
from childprocs import alive as _alive  # noqa: E402
from harness import ChildFailed, Children  # noqa: E402


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return not _alive(pid)


# --- statistics and the table -------------------------------------------

def test_percentile_is_nearest_rank() -> None:
    values = [float(x) for x in range(1, 11)]
    assert harness.percentile(values, 50) == 5.0
    assert harness.percentile(values, 90) == 9.0
    assert harness.percentile(values, 99) == 10.0
    assert harness.percentile(values, 0) == 1.0
    assert harness.percentile([], 50) != harness.percentile([], 50)   # NaN


def test_median_run_takes_the_lower_middle_and_lists_every_trial() -> None:
    runs = [{"rate": 3, "x": "c"}, {"rate": 1, "x": "a"}, {"rate": 4, "x": "d"},
            {"rate": 2, "x": "b"}]
    chosen = harness.median_run(runs, "rate")
    assert chosen["x"] == "b"
    assert chosen["trials"] == [3, 1, 4, 2]
    assert "trials" not in runs[3]


def test_round_ratios_pair_rounds_and_skip_failed_ones() -> None:
    top = [{"r": 6.0}, None, {"r": 9.0}, {"r": 1.0}]
    bottom = [{"r": 3.0}, {"r": 5.0}, {"r": 3.0}, {"r": 0}]
    assert harness.round_ratios(top, bottom, "r") == [2.0, 3.0]


def test_ratio_and_verdict() -> None:
    assert harness.ratio(3, 4) == 0.75
    assert harness.ratio(3, 0) is None
    assert harness.ratio(None, 4) is None
    assert harness.verdict(0.7, 0.6, at_least=True) == "PASS (>=0.600)"
    assert harness.verdict(1.6, 1.5, at_least=False) == "MISS (<=1.50)"
    assert harness.verdict(None, 1.5, at_least=False) == "-"


def test_fmt_gives_digits_by_size() -> None:
    assert [harness.fmt(x) for x in (123456.7, 123.4, 12.34, 1.234, 0.1234)] == \
        ["123,457", "123", "12.3", "1.23", "0.123"]
    assert harness.fmt(None) == "-"
    assert harness.fmt(float("nan")) == "n/a"


def test_table_aligns_the_first_column_left_and_the_rest_right() -> None:
    lines = harness.table(["case", "rate"], [["raw", 1500.0], ["peermesh long", "x"]])
    assert lines == ["case            rate",
                     "-------------  -----",
                     "raw            1,500",
                     "peermesh long      x"]


def test_interleaved_alternates_cases_and_records_failures() -> None:
    calls: list[tuple[str, int]] = []

    def case(name: str, fail_in: int = -1):  # type: ignore[no-untyped-def]
        def run(r: int) -> str:
            calls.append((name, r))
            if r == fail_in:
                raise ValueError("broken")
            return f"{name}{r}"
        return run
    errors: dict[str, str] = {}
    runs = harness.interleaved({"a": case("a"), "b": case("b", fail_in=1)}, 2, errors)
    assert calls == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert runs == {"a": ["a0", "a1"], "b": ["b0", None]}
    assert errors == {"b/2": "ValueError: broken"}
    with pytest.raises(ValueError):
        harness.interleaved({"b": case("b", fail_in=0)}, 1)


def test_baseline_tree_takes_a_directory_and_refuses_what_is_not_a_commit(tmp_path) -> None:
    (tmp_path / "peermesh").mkdir()
    assert harness.baseline_tree(str(tmp_path)) == str(tmp_path)
    with pytest.raises(SystemExit, match="neither a directory"):
        harness.baseline_tree("no-such-revision-xyz")


# --- child processes ------------------------------------------------------

def test_a_role_answers_commands_and_its_stray_output_does_not_corrupt_the_line() -> None:
    with Children() as kids:
        # bench_sada's raw client: connects a DEALER (nothing needs to listen), then
        # answers "run" commands; n=0 round trips measures nothing but the protocol.
        client = kids.start("bench_sada", "raw_client", endpoint=harness.free_tcp_endpoint())
        client.expect("ready", 30)
        answer = client.ask(timeout=30, op="run", n=0, window=1)
        assert answer["samples"] == []
        pid = client.pid
    assert _gone_within(pid, 5)


def test_a_role_that_fails_is_reported_with_its_traceback() -> None:
    with Children() as kids:
        child = kids.start("bench_mesh", "raw_sink")   # no n: TypeError in the child
        with pytest.raises(ChildFailed, match="TypeError"):
            child.expect("ready", 30)


def test_a_silent_child_times_out_and_is_ended() -> None:
    with pytest.raises(ChildFailed, match="no 'ready' within"):
        with Children() as kids:
            sleeper = kids.popen([sys.executable, "-c", "import time; time.sleep(60)"])
            sleeper.expect("ready", 0.3)
    assert _gone_within(sleeper.pid, 5)


def test_a_child_that_ignores_sigterm_is_killed_when_the_block_is_left() -> None:
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('[\"ready\", null]', flush=True); time.sleep(60)")
    with pytest.raises(RuntimeError, match="the test fails here"):
        with Children(grace=0, term_wait=0.2) as kids:
            stubborn = kids.popen([sys.executable, "-c", code])
            stubborn.expect("ready", 30)
            raise RuntimeError("the test fails here")
    assert _gone_within(stubborn.pid, 1)


def test_what_a_child_started_ends_with_it() -> None:
    """A child's own children (Spark's JVM under a benchmark's reader) end with it, also
    one that ignores SIGTERM: before the block is left, nothing of the group runs."""
    code = ("import signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "grand = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)']); "
            "print('[\"ready\", %d]' % grand.pid, flush=True); grand.wait()")
    with Children(grace=0, term_wait=0.2) as kids:
        child = kids.popen([sys.executable, "-c", code])
        grandchild = child.expect("ready", 30)
        assert _alive(grandchild)
    assert not _alive(grandchild) and not _alive(child.pid)


def test_children_die_with_their_parent() -> None:
    # A parent that starts a child and then vanishes without cleaning up.
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); from harness import Children; "
            "child = Children().popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print(child.pid, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code, harness.HERE], capture_output=True,
                         text=True, timeout=30, check=True)
    assert _gone_within(int(out.stdout), 5)


# --- bench_mesh: the roles over each backend's adapter ---------------------

@pytest.mark.parametrize("kind", ["raw", "peermesh", "threaded"])
def test_bench_mesh_throughput_roles_run_on_a_backend(kind: str) -> None:
    import bench_mesh
    result = bench_mesh.bench_throughput(kind, 300)
    assert result["messages"] == 300 and result["rate"] > 0 and result["tx_cpu_us"] > 0


@pytest.mark.parametrize("kind", ["raw", "raw_each_way", "peermesh"])
def test_bench_mesh_latency_roles_run_on_a_backend(kind: str) -> None:
    import bench_mesh
    result = bench_mesh.bench_latency(kind, 50, 5)
    assert result["round_trips"] == 50 and 0 < result["min_us"] <= result["p50_us"]
    assert result["echo_cpu_us"] >= 0


def test_bench_mesh_names_a_role_on_one_backend() -> None:
    import bench_mesh
    assert bench_mesh.role_raw_ping.keywords == {"backend": "raw"}
    assert bench_mesh.role_pm_peer.func is bench_mesh.role_peer
    with pytest.raises(AttributeError):
        bench_mesh.role_nosuch_ping
