"""The Prometheus endpoint: addresses, families parsed with prometheus_client's own parser,
the serving commands' --metrics, and a real Prometheus server scraping a live agent."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import gevent
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cliprocess import Cli, CliProcess, _report
from scraping import scrape as _scrape
from scraping import value as _value
from peermesh.config import NodeConfig
from peermesh.counters import Counters
from peermesh.events import EventType
from peermesh.metrics import MetricsServer, parse_listen
from peermesh.overlay import Overlay
from peermesh.zre.node import Node
from peermesh.zre.roundtrip import RoundTrip
from waiting import poll_until, wait_for

METRICS_URL = re.compile(r"^peermesh: metrics at (http://\S+)$")


# --------------------------------------------------------------------------
# Addresses: loopback unless asked


@pytest.mark.parametrize("text, expected", [
    ("9464", ("127.0.0.1", 9464)),
    (":9464", ("127.0.0.1", 9464)),
    ("127.0.0.2:0", ("127.0.0.2", 0)),
    ("localhost:9464", ("localhost", 9464)),
    ("[::1]:9464", ("::1", 9464)),
])
def test_loopback_addresses_are_taken(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464", "example.org:1"])
def test_other_addresses_are_refused_unless_public(text: str) -> None:
    with pytest.raises(ValueError, match="not loopback.*--metrics-public"):
        parse_listen(text)
    assert parse_listen(text, public=True)[1] in (9464, 1)


@pytest.mark.parametrize("text", ["", "host:port", "127.0.0.1:70000", "127.0.0.1:-1"])
def test_malformed_addresses_say_so(text: str) -> None:
    with pytest.raises(ValueError, match="metrics"):
        parse_listen(text)


def test_config_checks_the_address_and_reads_the_environment() -> None:
    with pytest.raises(ValueError, match="not loopback"):
        NodeConfig(metrics="0.0.0.0:9464")
    config = NodeConfig.load(environ={"PEERMESH_METRICS": "0.0.0.0:9464",
                                      "PEERMESH_METRICS_PUBLIC": "true"})
    assert (config.metrics, config.metrics_public) == ("0.0.0.0:9464", True)


# --------------------------------------------------------------------------
# In one process: two nodes, one serving its metrics


class CountingOverlay(Overlay):
    """An overlay that keeps limits and stats as the real ones do, and times something."""

    roles = ("counting",)

    def __init__(self) -> None:
        super().__init__()
        self.limits = Counters(__import__("logging").getLogger(__name__), "counting")
        self.stats = {"requests": 0, "state": "idle"}
        self.times = RoundTrip()

    def metrics(self) -> Any:
        yield from super().metrics()
        yield "counting_seconds", {"what": "work"}, self.times


@pytest.fixture
def pair(free_udp_port: int) -> Iterator[tuple[Node, Node, CountingOverlay]]:
    """alice (with an overlay, serving metrics) and bob, each seeing the other."""
    settings: dict[str, Any] = dict(interface="lo", port=free_udp_port, interval=0.1)
    alice = Node("alice", config=NodeConfig(), groups=["g"], **settings)
    overlay = CountingOverlay()
    overlay.attach(alice)
    bob = Node("bob", config=NodeConfig(), groups=["g"], **settings)
    alice.start()
    bob.start()
    try:
        overlay.start()
        wait_for(alice, lambda e: e.type is EventType.JOIN and e.peer == bob.uuid, 10)
        wait_for(bob, lambda e: e.type is EventType.JOIN and e.peer == alice.uuid, 10)
        yield alice, bob, overlay
    finally:
        overlay.stop()
        bob.stop(timeout=0.5)
        alice.stop(timeout=0.5)


def test_families_follow_the_nodes_totals(pair: tuple[Node, Node, CountingOverlay]) -> None:
    alice, bob, overlay = pair
    server = MetricsServer(alice).start("127.0.0.1:0")
    try:
        for i in range(5):
            alice.whisper(bob.uuid, b"x" * 10)
        alice.shout("g", b"y" * 4)
        assert alice.flush(5.0)  # PINGs bob: a round trip to time
        bob.whisper(alice.uuid, b"back")
        wait_for(alice, lambda e: e.type is EventType.WHISPER, 10)
        overlay.stats["requests"] = 7
        overlay.limits.add("max_things", 2)
        overlay.times.add(0.003)
        overlay.times.add(7.0)

        families = _scrape(server.url)
    finally:
        server.close()
    assert _value(families, "peermesh_peers") == 1
    assert _value(families, "peermesh_peers_by_state", state="alive") == 1
    assert _value(families, "peermesh_messages", kind="whisper", direction="out") == 5
    assert _value(families, "peermesh_messages", kind="shout", direction="out") == 1
    assert _value(families, "peermesh_messages", kind="whisper", direction="in") == 1
    assert _value(families, "peermesh_bytes", direction="out") == 5 * 10 + 4
    assert _value(families, "peermesh_bytes", direction="in") == 4
    assert _value(families, "peermesh_limit_hits", component="node",
                  limit="peers_refused") == 0
    assert _value(families, "peermesh_dropped", reason="malformed") == 0
    assert families["peermesh_messages"].type == "counter"
    assert families["peermesh_peers"].type == "gauge"
    # a round trip per peer, as a histogram
    rtt = families["peermesh_peer_rtt_seconds"]
    assert rtt.type == "histogram"
    count = _value(families, "peermesh_peer_rtt_seconds", "peermesh_peer_rtt_seconds_count",
                   peer=bob.uuid.hex, name="bob")
    assert count >= 1
    assert _value(families, "peermesh_peer_rtt_seconds", "peermesh_peer_rtt_seconds_bucket",
                  peer=bob.uuid.hex, le="+Inf") == count
    # the overlay's own counters, read generically
    assert _value(families, "peermesh_overlay_events", overlay="counting",
                  event="requests") == 7
    assert _value(families, "peermesh_limit_hits", component="counting",
                  limit="max_things") == 2
    assert _value(families, "peermesh_node_info", name="alice", uuid=alice.uuid.hex) == 1
    assert "process_cpu_seconds" in families
    assert families["peermesh_counting_seconds"].type == "histogram"
    assert _value(families, "peermesh_counting_seconds", "peermesh_counting_seconds_bucket",
                  what="work", le="0.005") == 1
    assert _value(families, "peermesh_counting_seconds", "peermesh_counting_seconds_bucket",
                  what="work", le="+Inf") == 2
    assert _value(families, "peermesh_counting_seconds", "peermesh_counting_seconds_sum",
                  what="work") == pytest.approx(7.003)


def test_a_failing_overlay_does_not_fail_the_scrape(
        pair: tuple[Node, Node, CountingOverlay]) -> None:
    alice, _, overlay = pair

    def broken() -> Any:
        raise RuntimeError("boom")
    overlay.metrics = broken  # type: ignore[method-assign]
    server = MetricsServer(alice).start("127.0.0.1:0")
    try:
        assert _value(_scrape(server.url), "peermesh_peers") == 1
    finally:
        server.close()


def test_a_bad_request_gets_an_http_error_not_a_traceback(
        pair: tuple[Node, Node, CountingOverlay]) -> None:
    alice = pair[0]
    server = MetricsServer(alice).start("127.0.0.1:0")
    try:
        assert server.address is not None

        def garbage() -> bytes:
            with socket.create_connection(server.address, timeout=10) as sock:
                sock.sendall(b"\x00\xff garbage \r\n\r\n")
                return sock.recv(100)
        answer = gevent.get_hub().threadpool.apply(garbage)
        assert answer.startswith(b"HTTP/1.1 400")
        assert _value(_scrape(server.url), "peermesh_peers") == 1  # still serving
    finally:
        server.close()


# --------------------------------------------------------------------------
# The commands


def _metrics_url(process: CliProcess) -> str:
    line = process.expect_line(lambda s: METRICS_URL.match(s) is not None, "metrics line", "err")
    match = METRICS_URL.match(line)
    assert match is not None
    return match.group(1)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode("utf-8")
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_run_and_agent_serve_metrics_that_count_their_peer(cli: Cli, tmp_path: Path) -> None:
    run = cli.start("run", "--json", "--name", "runner", "--metrics", "127.0.0.1:0")
    agent = cli.start("agent", "--name", "agent", "--agent", str(tmp_path / "agent.sock"),
                      "--metrics", "0")
    run_url, agent_url = _metrics_url(run), _metrics_url(agent)
    for url in (run_url, agent_url):
        assert url.startswith("http://127.0.0.1:")
        poll_until(lambda: _value(_get(url), "peermesh_peers") == 1, 10,
                   f"one peer at {url}")


def test_a_public_address_is_refused_with_one_line(cli: Cli) -> None:
    result = cli.call("run", "--metrics", "0.0.0.0:0")
    assert result.returncode == 2, _report(result)
    assert result.stderr.strip().splitlines() == [
        "peermesh: error: metrics address 0.0.0.0 is not loopback: the metrics name every "
        "peer; add --metrics-public (metrics_public = true) to serve them beyond this host"]


def test_a_flux_member_without_the_mesh_refuses_metrics(cli: Cli) -> None:
    result = cli.call("flux", "run", "--root", "--metrics", "0")
    assert result.returncode == 2, _report(result)
    assert "a member given --root or --parent runs without one" in result.stderr


def test_a_port_in_use_is_a_runtime_failure(cli: Cli) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = cli.call("run", "--metrics", f"127.0.0.1:{taken.getsockname()[1]}")
    assert result.returncode == 1, _report(result)
    assert "cannot serve metrics at 127.0.0.1:" in result.stderr


# --------------------------------------------------------------------------
# A real Prometheus server scraping a live agent


def _free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_prometheus_scrapes_a_live_agent(cli: Cli, tmp_path: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus; "
                    ".ci/run installs it)")
    port = _free_tcp_port()
    agent = cli.start("agent", "--name", "scraped", "--agent", str(tmp_path / "agent.sock"),
                      "--metrics", f"127.0.0.1:{port}")
    cli.start("run", "--name", "other")
    assert _metrics_url(agent) == f"http://127.0.0.1:{port}/metrics"
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: peermesh\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n")
    web = _free_tcp_port()
    server = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{web}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    try:
        def peers_seen() -> Optional[float]:
            url = f"http://127.0.0.1:{web}/api/v1/query?query=peermesh_peers"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    data = json.loads(answer.read())
            except OSError:
                return None
            results = data.get("data", {}).get("result", [])
            return next((float(r["value"][1]) for r in results
                         if float(r["value"][1]) == 1), None)
        poll_until(peers_seen, 60, "Prometheus to scrape peermesh_peers == 1", step=0.5)

        url = f"http://127.0.0.1:{web}/api/v1/targets"
        with urllib.request.urlopen(url, timeout=5) as answer:
            targets = json.loads(answer.read())["data"]["activeTargets"]
        assert [t["health"] for t in targets] == ["up"], targets
    finally:
        server.terminate()
        server.wait(30)
