"""``peermesh job|worker|broker|file`` as a user runs them (subprocesses on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(free_udp_port: int, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``cli(*args, serve=False, path="")``: run ``peermesh ARGS`` on loopback with a private
    data dir (``path``: a directory to import from too)."""
    env = {**os.environ, "PEERMESH_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}
    common = ["-i", "lo", "-p", str(free_udp_port), "--interval", "0.05"]
    servers: list[subprocess.Popen[str]] = []

    def run(*args: str, serve: bool = False, timeout: float = 20.0, path: str = "") -> Any:
        argv = [sys.executable, "-m", "peermesh", *args, *common]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), path)))
        if serve:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env=env)
            servers.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert json.loads(line)["event"] == "ready", line
            return proc
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)

    try:
        yield run
    finally:
        for proc in servers:
            proc.terminate()
        for proc in servers:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def test_usage_errors_exit_2(cli: Callable[..., Any]) -> None:
    for args in (("job", "post", "svc"), ("job", "get"), ("job", "post", "s", "t", "{bad"),
                 ("job", "post", "s", "t", "--target", "a,,b"), ("broker", "show"),
                 ("file", "get", "http://x", "dest"), ("job", "list", "--limit", "-5"),
                 ("job", "get", "feedbeef", "--wait", "nan"),
                 ("file", "get", "nf://x", "/nonexistent/dir/x"),
                 ("broker", "run", "--broker", "always", "--files-root", "/nonexistent/x"),
                 ("worker", "--inventory", __file__), ("job", "post", "demo", "add", "-t", ""),
                 ("worker", "--name", ""), ("job", "post", "demo", "add", "[1]", "--wait", "[2]"),
                 ("job", "get", "a", "--wait", "b"), ("job", "post", "d\udce9mo", "add")):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert "error" in done.stderr
    for args, message in ((("job", "post", "demo", "add", "--target", ""),
                           "argument --target/-t: must not be empty"),
                          (("worker", "--name", " "), "argument --name/-n: must not be empty"),
                          (("job", "post", "d\udce9mo", "add"),
                           "argument SERVICE: b'd\\xe9mo' is not UTF-8 text"),
                          (("worker", "--data-dir", __file__),
                           f"data directory {__file__} is a file, not a directory")):
        done = cli(*args)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
    done = cli("job", "get", "feedbeef")
    assert done.returncode == 2 and "give --service" in done.stderr


def test_a_broken_store_file_is_an_error_not_a_traceback(cli: Callable[..., Any],
                                                        tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "nfp-cli.sqlite3").write_bytes(b"garbage" * 100)
    for args in (("job", "list"), ("worker", "--name", "cli")):
        done = cli(*args)
        assert done.returncode == 1, (args, done.stderr)
        assert "is not a usable peermesh job store" in done.stderr
        assert "Traceback" not in done.stderr


def test_worker_jobs_broker_and_files(cli: Callable[..., Any], tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "r1.cfg").write_text("hostname r1\n")
    cli("worker", "--name", "cw1", "--service", "demo", serve=True)
    done = cli("job", "post", "demo", "add", "[1, 2, 3]", "--target", "any", "--wait")
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["status"] == 200 and reply["workers"]["cw1"]["result"] == 6
    # --wait takes a number only: the JSON after it stays the job's arguments
    done = cli("job", "post", "demo", "add", "--target", "any", "--wait", "[4, 5]")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workers"]["cw1"]["result"] == 9
    done = cli("job", "post", "demo", "echo", '{"x": 1}', "-t", "cw1")
    assert done.returncode == 0, done.stderr
    uuid = json.loads(done.stdout)["uuid"]
    done = cli("job", "get", uuid[:10], "--wait", "5")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["workers"]["cw1"]["result"] == {"args": [],
                                                                   "kwargs": {"x": 1}}
    listed = json.loads(cli("job", "list", "--json").stdout)
    assert [j["uuid"] for j in listed][0] == uuid and listed[0]["state"] == "completed"
    cli("broker", "run", "--name", "cb1", "--files-root", str(files), serve=True)
    deadline = time.monotonic() + 10
    while True:
        done = cli("broker", "show", "workers")
        if done.returncode == 0 and "cw1" in done.stdout or time.monotonic() > deadline:
            break
    assert done.returncode == 0, done.stderr
    assert {"cw1", "cb1.mmi"} <= {w["name"] for w in json.loads(done.stdout)}
    dest = tmp_path / "got.cfg"
    done = cli("file", "get", "nf://r1.cfg", str(dest))
    assert done.returncode == 0, done.stderr
    assert dest.read_text() == "hostname r1\n"
    done = cli("file", "get", "nf://../../etc/passwd", str(tmp_path / "passwd"))
    assert done.returncode == 1 and "outside the files root" in done.stderr
    assert not (tmp_path / "passwd").exists()


def test_a_tasks_module_that_cannot_be_used_is_a_usage_error(cli: Callable[..., Any],
                                                            tmp_path: Path) -> None:
    (tmp_path / "raising.py").write_text('raise RuntimeError("boom at import")\n')
    (tmp_path / "broken.py").write_text("tasks = (\n")
    (tmp_path / "empty.py").write_text("x = 1\n")
    for module, error in (("raising", "RuntimeError: boom at import"),
                          ("broken", "SyntaxError: '(' was never closed"),
                          ("empty", "module empty has no 'tasks'"),
                          ("no_such_module", "No module named 'no_such_module'")):
        done = cli("worker", "--tasks", module, path=str(tmp_path))
        assert done.returncode == 2, done.stderr
        assert f"error: --tasks {module}: {error}" in done.stderr
        assert "Traceback" not in done.stderr


def test_worker_reads_the_nfp_table_of_the_config(cli: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    config = tmp_path / "peermesh.toml"
    config.write_text('[node]\nname = "cfgnode"\n\n[nfp]\nservice = "conf"\n'
                      'worker_name = "cfgw"\nbroker = "auto"\npriority = 4\nkeepalive = 0.2\n'
                      'multiplier = 4\nretention = 60.0\ntasks = "peermesh.nfp.demo"\n')
    cli("worker", "--config", str(config), serve=True)
    done = cli("job", "post", "conf", "add", "[2, 3]", "--target", "any", "--wait",
               "--config", str(config))
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["workers"]["cfgw"]["result"] == 5
    # the worker's broker candidacy came from the file too: it is the broker, at keepalive 0.2
    done = cli("broker", "show", "broker", "--config", str(config))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["name"] == "cfgnode" and shown["keepalive"] == 0.2 and shown["multiplier"] == 4


def test_command_line_wins_over_the_nfp_table(free_udp_port: int, tmp_path: Path) -> None:
    config = tmp_path / "peermesh.toml"
    config.write_text('[nfp]\nservice = "conf"\nworker_name = "cfgw"\nbroker = "always"\n'
                      'data_dir = "/nonexistent/not-used"\n')
    argv = [sys.executable, "-m", "peermesh", "worker", "--config", str(config),
            "--service", "cli", "--broker", "never", "-i", "lo", "-p", str(free_udp_port)]
    env = {**os.environ, "PEERMESH_DATA_DIR": str(tmp_path / "d"), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.wait(5)
    assert ready["broker_mode"] == "never" and ready["broker_endpoint"] is None
    assert [(w["name"], w["service"]) for w in ready["workers"]] == [("cfgw", "cli")]
    assert ready["store"].startswith(str(tmp_path / "d"))   # $PEERMESH_DATA_DIR wins


@pytest.mark.parametrize("table, message", [
    ("bogus = 1", "unknown key(s) bogus"),
    ('keepalive = "fast"', "keepalive must be a positive number"),
    ("multiplier = 1", "multiplier must be an integer of at least 2"),
    ('broker = "sometimes"', "broker must be one of never, auto, always"),
    ("priority = 1.5", "priority must be an integer"),
])
def test_a_bad_nfp_table_is_a_usage_error(cli: Callable[..., Any], tmp_path: Path,
                                          table: str, message: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f"[nfp]\n{table}\n")
    done = cli("worker", "--config", str(config))
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "[nfp]" in done.stderr


def test_example_config_documents_every_nfp_key(tmp_path: Path) -> None:
    from peermesh.config import NodeConfig
    from peermesh.nfp.commands import NFP_KEYS, load_nfp_table

    example = REPO / "deploy" / "peermesh.example.toml"
    text = example.read_text()
    section = text[text.index("# [nfp]"):]
    for key in NFP_KEYS:
        assert f"# {key} = " in section, f"[nfp] {key} is not in the example config"
    # uncommented, the section is a valid [nfp] table with every key, and [node] still loads
    lines = []
    for line in section.splitlines():
        if line == "# [nfp]" or any(line.startswith(f"# {key} = ") for key in NFP_KEYS):
            lines.append(line[2:])
    enabled = tmp_path / "enabled.toml"
    enabled.write_text(text[:text.index("# [nfp]")] + "\n".join(lines) + "\n")
    assert set(load_nfp_table(enabled)) == set(NFP_KEYS)
    assert NodeConfig.load(enabled, environ={}).interface == "lo"
    assert load_nfp_table(example) == {}            # commented out: nothing set


def _start(cli_args: list[str], env_from: Callable[..., Any], *args: str) -> Any:
    """``peermesh ARGS`` started (not waited for) like the ``cli`` fixture runs it."""
    return subprocess.Popen([sys.executable, "-m", "peermesh", *args, *cli_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_from())


def _interrupt(proc: subprocess.Popen[str], signum: int) -> tuple[int, str, str]:
    """Send ``signum``; (exit code, stdout, stderr). The command must end within 10 s."""
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running 10 s after signal {signum}: {err}")
    return proc.returncode, out, err


def _until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not within {timeout} s")
        time.sleep(0.05)


def test_waits_stop_on_a_signal_and_say_what_was_left(cli: Callable[..., Any],
                                                      free_udp_port: int,
                                                      tmp_path: Path) -> None:
    """job post --wait, job get --wait and file get, brokerless and with a broker."""
    import signal

    common = ["-i", "lo", "-p", str(free_udp_port), "--interval", "0.05"]

    def env() -> dict[str, str]:
        return {**os.environ, "PEERMESH_DATA_DIR": str(tmp_path / "data"),
                "PYTHONPATH": str(REPO)}

    def posted() -> list[dict[str, Any]]:
        done = cli("job", "list", "--json")
        return [j for j in json.loads(done.stdout or "[]") if j["task"] == "sleep"]

    cli("worker", "--name", "sw1", "--service", "demo", serve=True)
    post = _start(common, env, "job", "post", "demo", "sleep", '{"seconds": 120}',
                  "--target", "any", "--wait")
    (job,) = _until(posted, "the posted job in the client store")
    code, out, err = _interrupt(post, signal.SIGINT)
    assert code == 130 and out == "", err
    assert err.splitlines()[-1] == (f"peermesh: interrupted: job {job['uuid']} was posted and "
                                    f"may still run; fetch its result later with `peermesh job "
                                    f"get {job['uuid']}`")

    get = _start(common, env, "job", "get", job["uuid"], "--wait", "120", "-v")
    _until(lambda: any("beacons on port" in line for line in [get.stderr.readline()]),
           "the node's start-up log line")
    code, out, err = _interrupt(get, signal.SIGTERM)
    assert code == 130 and out == "", err
    assert err.splitlines()[-1] == (f"peermesh: interrupted: job {job['uuid']} not fetched; "
                                    f"ask again with `peermesh job get {job['uuid']}`")

    files = tmp_path / "files"
    files.mkdir()
    with open(files / "big.bin", "wb") as f:
        f.truncate(128 * 1024 * 1024)  # sparse: costs no disk, takes many chunks
    cli("broker", "run", "--name", "fb1", "--files-root", str(files), serve=True)
    dest = tmp_path / "dest"
    dest.mkdir()
    fetch = _start(common, env, "file", "get", "nf://big.bin", str(dest))
    _until(lambda: list(dest.iterdir()), "the download's temporary file", timeout=30)
    code, out, err = _interrupt(fetch, signal.SIGINT)
    assert code == 130, err  # never 0: the file was not written
    last = err.splitlines()[-1]
    assert last.startswith(f"peermesh: interrupted: {dest / 'big.bin'} not written (") \
        and last.endswith(" chunks of nf://big.bin fetched)"), err
    assert list(dest.iterdir()) == []  # the partial download is removed


@pytest.mark.parametrize("argv, has, lacks", [
    (["job", "post"], ["SERVICE TASK [ARGS-JSON]", "--target", "--wait", "--job-timeout",
                       "--timeout", "--interface"],
     ["--limit", "--service", "--keepalive", "--broker", "--files-root"]),
    (["job", "get"], ["UUID", "--service", "--wait", "--timeout"],
     ["--job-timeout", "--limit", "ARGS-JSON", "--keepalive"]),
    (["job", "list"], ["--json", "--limit", "--data-dir", "--store"],
     ["--wait", "--target", "--timeout", "--keepalive"]),
    (["broker", "show"], ["WHAT", "--timeout", "--interface"],
     ["--broker ", "--priority", "--admin-token", "--retention", "--inventory",
      "--files-root", "--keepalive", "--multiplier"]),
    (["broker", "run"], ["--broker", "--priority", "--files-root", "--keepalive"],
     ["WHAT", "--store", "--timeout "]),
    (["file", "get"], ["nf://PATH", "DEST", "--timeout", "--store"],
     ["--keepalive", "--multiplier", "--broker ", "--files-root"]),
])
def test_help_text_of_each_action(argv: list[str], has: list[str], lacks: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "peermesh", *argv, "--help"],
                          capture_output=True, text=True, timeout=20,
                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith(f"usage: peermesh {' '.join(argv)} "), text
    for option in has:
        assert option in text, option
    for option in lacks:
        assert option not in text, option


def test_a_worker_serves_its_jobs_by_state_as_metrics(cli: Callable[..., Any]) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    worker = cli("worker", "--name", "mw1", "--service", "demo", "--metrics", "0", serve=True)
    line = worker.stderr.readline()  # printed before "ready"
    assert line.startswith("peermesh: metrics at http://127.0.0.1:"), line
    url = line.split()[-1]
    done = cli("job", "post", "demo", "add", "[1, 2]", "--target", "any", "--wait")
    assert done.returncode == 0, done.stderr
    with urllib.request.urlopen(url, timeout=10) as answer:
        families = {f.name: f for f in text_string_to_metric_families(answer.read().decode())}
    jobs = {s.labels["state"]: s.value for s in families["peermesh_nfp_jobs"].samples
            if s.labels["worker"] == "mw1"}
    assert jobs == {"completed": 1}
    accepted = [s.value for s in families["peermesh_overlay_events"].samples
                if s.labels == {"overlay": "nfp-worker", "event": "accepted"}]
    assert accepted == [1]
