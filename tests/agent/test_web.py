"""The web view without a browser: what ``MeshView`` makes of a simulated mesh (broker,
Flux instance, liveness, events), and the agent's HTTP answers on loopback (page, API,
stream, access rules)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from peermesh.agent.meshview import MeshView
from peermesh.agent.web import WebView, is_loopback
from peermesh.config import NodeConfig, parse_host_port
from peermesh.events import Event, EventType
from peermesh.zre.node import Node

from cliprocess import PEERMESH, WAIT, CliProcess, _env
from waiting import poll_until

BROKER = "X-PM-BROKER"
FLUX = "X-PM-FLUX-TREE"


# --------------------------------------------------------------------------
# The picture, on simulated nodes


def _sim_nodes(headers: list[dict[str, str]]) -> tuple[Any, list[Node]]:
    from peermesh.sim import SimNetwork

    network = SimNetwork(latency=0.001)
    base = NodeConfig(interface="sim0", interval=0.5)
    nodes = [Node(f"n{i}", config=base.replace(headers=h), transport=network.transport())
             for i, h in enumerate(headers)]
    for node in nodes:
        node.start()
    return network, nodes


def test_mesh_view_of_a_simulated_mesh() -> None:
    network, nodes = _sim_nodes([
        {},
        {BROKER: '{"mode":"auto","priority":1}', FLUX: '{"instance":"f","endpoint":"x"}'},
        {BROKER: '{"mode":"auto","priority":5}', FLUX: '{"instance":"f","endpoint":"y",'
                                                       '"priority":3}'},
        {BROKER: "not json", FLUX: "[1]"},   # malformed: ignored
    ])
    me = nodes[0]
    view = MeshView(me)
    changes = []
    me.add_listener(lambda e: changes.append(view.apply(e)))
    try:
        network.clock.advance(3.0)
        snap = view.snapshot()
        assert sorted(p["name"] for p in snap["peers"]) == ["n1", "n2", "n3"]
        assert all(p["state"] == "alive" for p in snap["peers"])
        assert snap["node"]["name"] == "n0" and snap["node"]["self"]
        assert snap["broker"] == nodes[2].uuid.hex
        assert snap["flux"] == {"f": {"root": nodes[2].uuid.hex,
                                      "members": sorted([nodes[1].uuid.hex,
                                                         nodes[2].uuid.hex]),
                                      "tree": None}}
        assert view.roots() == {"f": "y"}
        tree = {"ranks": [{"rank": 0, "parent": None, "state": "online"}], "size": 1,
                "error": None}
        assert view.set_tree("f", tree) and not view.set_tree("f", dict(tree))
        assert view.snapshot()["flux"]["f"]["tree"] == tree
        assert not view.keep_trees({"f"}) and view.keep_trees(set())
        assert view.flux()["f"]["tree"] is None
        assert [e["type"] for e in snap["events"]].count("ENTER") == 3
        nodes[2].stop()
        network.clock.advance(1.0)
        exit_change = next(c for c in changes if c["event"]["type"] == "EXIT")
        assert exit_change["gone"] == nodes[2].uuid.hex and exit_change["peer"] is None
        assert exit_change["broker"] == nodes[1].uuid.hex
        assert exit_change["flux"]["f"]["root"] == nodes[1].uuid.hex
    finally:
        for node in nodes:
            node.stop()


def test_mesh_view_shows_no_content_and_follows_liveness() -> None:
    network, nodes = _sim_nodes([{}, {}])
    me, other = nodes
    view = MeshView(me)
    try:
        network.clock.advance(2.0)
        change = view.apply(Event(EventType.SHOUT, other.uuid, "n1", group="g",
                                  frames=(b"secret", b"!")))
        assert change["event"]["size"] == 7
        assert "secret" not in json.dumps(change)
        if "last_heard" not in change["peer"]:   # a node without liveness fields
            change = view.apply(Event(EventType.EVASIVE, other.uuid, "n1"))
            assert change["peer"]["state"] == "evasive"
    finally:
        for node in nodes:
            node.stop()


@pytest.mark.parametrize("text, expected", [
    ("8470", ("127.0.0.1", 8470)), ("localhost:1", ("localhost", 1)),
    ("[::1]:80", ("::1", 80)), ("0.0.0.0:0", ("0.0.0.0", 0)),
])
def test_parse_host_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_host_port(text) == expected


@pytest.mark.parametrize("text", ["host:port", "1.2.3.4:70000", ""])
def test_parse_host_port_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_host_port(text)


def test_non_loopback_needs_public() -> None:
    assert is_loopback("127.0.0.5") and is_loopback("::1") and not is_loopback("10.1.1.1")
    with pytest.raises(ValueError, match="not a loopback address"):
        WebView(object(), "10.1.1.1", 0)


# --------------------------------------------------------------------------
# Over HTTP, from the agent


class Agent:
    """An agent with a web view on loopback, and peers on its beacon port."""

    def __init__(self, port: int, tmp_path: Path, *web: str) -> None:
        self.net = ["--interface", "lo", "--port", str(port), "--interval", "0.1"]
        self.process = CliProcess(["agent", "--agent", str(tmp_path / "agent.sock"),
                                   "--name", "alice", *self.net, "--web", *web])
        self.peers: list[CliProcess] = []
        line = self.process.expect_line(lambda s: "web view at" in s, "web view line", "err")
        self.base = re.search(r"(http://\S+?:\d+)/", line).group(1)  # type: ignore[union-attr]
        self.port = int(self.base.rsplit(":", 1)[1])
        self.token_line = None
        if "--web-public" in web:
            self.token_line = self.process.expect_line(lambda s: "token" in s, "token", "err")
        self.process.expect_line(lambda s: "agent at" in s, "agent start-up line", "err")

    def peer(self, name: str) -> CliProcess:
        peer = CliProcess(["run", "--name", name, "--group", "chat", *self.net])
        self.peers.append(peer)
        return peer

    def close(self) -> None:
        for process in [*self.peers, self.process]:
            process.kill()


@pytest.fixture
def agent_factory(free_udp_port: int, tmp_path: Path) -> Iterator[Any]:
    made: list[Agent] = []

    def make(*web: str) -> Agent:
        agent = Agent(free_udp_port, tmp_path, *web)
        made.append(agent)
        return agent
    yield make
    for agent in made:
        agent.close()


def _get(url: str, headers: Optional[dict[str, str]] = None,
         method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=WAIT) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_page_api_and_stream(agent_factory: Any) -> None:
    agent = agent_factory("127.0.0.1:0")
    status, headers, body = _get(agent.base + "/")
    assert status == 200 and b'<script src="view.js"' in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for asset, kind in (("/view.js", "text/javascript"), ("/view.css", "text/css")):
        status, headers, _ = _get(agent.base + asset)
        assert status == 200 and headers["Content-Type"].startswith(kind)
    assert _get(agent.base + "/nothing")[0] == 404
    assert _get(agent.base + "/api/mesh", method="POST")[0] == 405

    with socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT) as stream:
        stream.sendall(b"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % agent.port)
        reader = stream.makefile("rb")
        first = _next_event(reader)
        assert first[0] == "snapshot" and first[1]["node"]["name"] == "alice"
        agent.peer("bob")
        while True:
            kind, data = _next_event(reader)
            if kind == "change" and data["event"]["type"] == "ENTER":
                break
        assert data["peer"]["name"] == "bob" and data["peer"]["groups"] in ([], ["chat"])

    mesh = json.loads(_get(agent.base + "/api/mesh")[2])
    assert [p["name"] for p in mesh["peers"]] == ["bob"]
    assert agent.peers[0].stop(signal.SIGTERM) == 0
    poll_until(lambda: not json.loads(_get(agent.base + "/api/mesh")[2])["peers"], WAIT,
               "bob to leave the view")


def _next_event(reader: Any) -> tuple[str, Any]:
    """The next server-sent event (kind, JSON data) from a chunked HTTP answer."""
    kind, data = "", b""
    while True:
        line = reader.readline()
        assert line, "the stream ended"
        line = line.rstrip(b"\r\n")
        if line.startswith(b"event: "):
            kind = line[7:].decode()
        elif line.startswith(b"data: "):
            data = line[6:]
            return kind, json.loads(data)


def test_loopback_view_refuses_other_host_names(agent_factory: Any) -> None:
    agent = agent_factory("127.0.0.1:0")
    assert _get(agent.base + "/", {"Host": f"localhost:{agent.port}"})[0] == 200
    status, _, body = _get(agent.base + "/api/mesh", {"Host": f"evil.example:{agent.port}"})
    assert status == 421 and b"loopback host name" in body


def test_public_view_needs_its_token(agent_factory: Any) -> None:
    agent = agent_factory("127.0.0.1:0", "--web-public")
    token = re.search(r"token=(\S+)", agent.token_line).group(1)  # type: ignore[union-attr]
    assert _get(agent.base + "/api/mesh")[0] == 401
    assert _get(agent.base + "/api/mesh?token=wrong")[0] == 401
    status, headers, _ = _get(f"{agent.base}/?token={token}")
    assert status == 200 and f"peermesh_token={token}" in headers["Set-Cookie"]
    assert _get(agent.base + "/api/mesh", {"Cookie": f"peermesh_token={token}"})[0] == 200
    assert _get(agent.base + "/api/mesh", {"Authorization": f"Bearer {token}"})[0] == 200


def test_agent_refuses_a_non_loopback_web_address(tmp_path: Path) -> None:
    result = subprocess.run([*PEERMESH, "agent", "--interface", "lo", "--agent",
                             str(tmp_path / "a.sock"), "--web", "192.0.2.1:80"],
                            capture_output=True, env=_env(), timeout=WAIT, text=True)
    assert result.returncode == 2, result.stderr
    assert "not a loopback address" in result.stderr and "--web-public" in result.stderr
    assert "Traceback" not in result.stderr


def test_streams_are_bounded(agent_factory: Any) -> None:
    from peermesh.agent.web import MAX_STREAMS

    agent = agent_factory("127.0.0.1:0")
    request = b"GET /api/stream HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % agent.port
    streams = []
    try:
        for _ in range(MAX_STREAMS):
            stream = socket.create_connection(("127.0.0.1", agent.port), timeout=WAIT)
            streams.append(stream)
            stream.sendall(request)
            assert _next_event(stream.makefile("rb"))[0] == "snapshot"
        status, _, body = _get(agent.base + "/api/stream")
        assert status == 503 and b"follow the mesh already" in body
    finally:
        for stream in streams:
            stream.close()


def test_agent_says_when_the_web_port_is_taken(free_udp_port: int, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*PEERMESH, "agent", "--interface", "lo", "--port",
                                 str(free_udp_port), "--agent", str(tmp_path / "a.sock"),
                                 "--web", f"127.0.0.1:{port}"],
                                capture_output=True, env=_env(), timeout=WAIT, text=True)
    assert result.returncode == 1, result.stderr
    assert f"cannot serve the web view at 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "a.sock").exists()   # the agent cleaned up


# --------------------------------------------------------------------------
# The Flux tree, asked of a real instance


@contextlib.contextmanager
def flux_instance(port: int, ranks: int) -> Iterator[tuple[Any, list[Any]]]:
    """Instance ``webtree`` (kary:2): rank 0 on a node of the mesh at beacon ``port``, the
    other ranks joined through it (not on the mesh), on that node's hub: (node, members)."""
    from peermesh import ThreadedNode
    from peermesh.flux import FluxOverlay, State

    root = FluxOverlay("webtree", root=True, topology="kary:2")
    members: list[FluxOverlay] = []
    with ThreadedNode("fx", overlays=[root], interface="lo", port=port, interval=0.1) as tn:
        try:
            for _ in range(ranks - 1):   # one by one: each attaches to its formula parent
                member = tn.call(lambda node: FluxOverlay(
                    "webtree", parents=[root.endpoint], topology="kary:2",
                    address="127.0.0.1").start())
                members.append(member)
                poll_until(lambda: tn.call(lambda node: member.state is State.ONLINE), WAIT,
                           "the member online")
            yield tn, members
        finally:
            for member in members:
                tn.call(lambda node, m=member: m.stop())


def test_the_view_shows_the_flux_tree(agent_factory: Any, free_udp_port: int) -> None:
    """Rank 0 on the mesh and three ranks joined through it (not on the mesh): /api/mesh
    carries every rank with its parent (kary:2: 1 and 2 under 0, 3 under 1) and state."""
    agent = agent_factory("127.0.0.1:0")
    with flux_instance(free_udp_port, 4) as (tn, members):
        def tree() -> Optional[list[tuple[int, Optional[int], str]]]:
            flux = json.loads(_get(agent.base + "/api/mesh")[2])["flux"]
            got = (flux.get("webtree") or {}).get("tree") or {"ranks": []}
            ranks = sorted((r["rank"], r["parent"], r["state"]) for r in got["ranks"])
            return ranks if len(ranks) == 4 and all(
                state == "online" for _, _, state in ranks) else None
        ranks = poll_until(tree, WAIT, "the Flux tree of 4 ranks in the view", step=0.2)
        assert [(rank, parent) for rank, parent, _ in ranks] == \
            [(0, None), (1, 0), (2, 0), (3, 1)]
        info = json.loads(_get(agent.base + "/api/mesh")[2])["flux"]["webtree"]
        assert info["root"] == tn.uuid.hex and info["tree"]["error"] is None
        assert info["tree"]["size"] == 4

        last = members.pop()
        tn.call(lambda node: last.stop())   # rank 3 leaves: its parent says so
        poll_until(lambda: [r["rank"] for r in json.loads(_get(agent.base + "/api/mesh")[2])
                            ["flux"]["webtree"]["tree"]["ranks"]] == [0, 1, 2], WAIT,
                   "rank 3 gone from the tree", step=0.2)
