"""Flux on CURVE keys (loopback): members and rankless clients of a secure instance, and a
member whose key is not allowed, alone (``curve=``) and on ZRE nodes with keys."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peermesh import Node
from peermesh.flux import Errno, FluxClient, FluxError, FluxOverlay, FluxSettings, FluxStateError
from peermesh.io.curve import Curve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zre"))
from curvemesh import KeyRing  # noqa: E402

from .conftest import wait_until  # noqa: E402

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.3)
TIMING = dict(interval=0.05, evasive=0.3, silent=0.4, expired=0.6)
#: how long a member whose key is refused is given to get in (it never does)
REFUSED_FOR = 1.5


@pytest.fixture
def ring(tmp_path: Path) -> KeyRing:
    ring = KeyRing(tmp_path)
    ring.allow("allowed", "root", "one", "client")
    return ring


@pytest.fixture
def started() -> Iterator[list[FluxOverlay]]:
    made: list[FluxOverlay] = []
    yield made
    for flux in reversed(made):
        flux.stop()


def test_a_secure_instance_alone(ring: KeyRing, started: list[FluxOverlay]) -> None:
    allowed = str(ring.root / "allowed")

    def member(name: str, **kw: Any) -> FluxOverlay:
        flux = FluxOverlay(curve=Curve.load(ring.secret(name), allowed), settings=FAST,
                           address="127.0.0.1", **kw).start()
        started.append(flux)
        return flux

    root = member("root", root=True)
    root_key = ring.public("root").decode()
    one = member("one", parents={root.endpoint: root_key})
    assert one.wait_online(10)
    root.register("demo.who", lambda request: {"rank": root.rank})
    assert one.rpc("demo.who", None, 0).get_json(5) == {"rank": 0}
    events = one.subscribe("demo.")
    root.publish("demo.x", {"n": 1}).get(5)
    assert events.get(5).topic == "demo.x"  # type: ignore[union-attr]

    with FluxClient({one.endpoint: ring.public("one").decode()},
                    curve=Curve.load(ring.secret("client"))).connect(5) as client:
        assert client.rpc("demo.who").get_json(5) == {"rank": 0}
    with pytest.raises(FluxStateError, match="needs each member's key"):
        FluxClient([one.endpoint], curve=Curve.load(ring.secret("client")))

    # a key the allowlist does not hold gets nothing: no rank, no answer, no event
    rogue = member("rogue", parents={root.endpoint: root_key})
    stranger = member("stranger", parents=[root.endpoint])   # no key for root: never dialed
    with pytest.raises(FluxError) as info:
        FluxClient({one.endpoint: ring.public("one").decode()},
                   curve=Curve.load(ring.secret("rogue"))).connect(REFUSED_FOR)
    assert info.value.errnum == Errno.ETIMEDOUT
    assert not rogue.wait_online(REFUSED_FOR) and not stranger.wait_online(0)
    assert rogue.rank is None and stranger.rank is None
    assert root.size == 2 and sorted(root.core.directory.members) == [0, 1]
    assert root.info()["clients"] == 0 and one.info()["clients"] == 0


def test_a_secure_instance_on_the_mesh(ring: KeyRing, free_udp_port: int) -> None:
    allowed = str(ring.root / "allowed")
    made: list[tuple[Node, FluxOverlay]] = []

    def add(name: str, **kw: Any) -> FluxOverlay:
        node = Node(name, interface="lo", port=free_udp_port, key_file=ring.secret(name),
                    allowed_keys=allowed, **TIMING)  # type: ignore[arg-type]
        flux = FluxOverlay("test", settings=FAST, settle=0.3, **kw)
        flux.attach(node)
        node.start()
        flux.start()
        made.append((node, flux))
        return flux

    try:
        root, one = add("root", priority=5), add("one")
        assert root.wait_online(10) and one.wait_online(10)
        assert one.info()["parent"] == 0
        assert one.keys[root.endpoint] == ring.public("root").decode()  # its X-PUBLICKEY
        assert one.rpc("broker.ping", b"x", 0).get(5) == b"x"
        seen = one.subscribe("t.")
        root.publish("t.x").get(5)
        assert seen.get(5).topic == "t.x"  # type: ignore[union-attr]
        assert root.size == 2
    finally:
        for node, flux in reversed(made):
            flux.stop()
            node.stop(0.1)


def test_commands_on_keys_find_and_reach_the_members(ring: KeyRing, free_udp_port: int) -> None:
    """``flux run`` and a one-shot ``flux tree`` with node keys: the command is a CURVE client
    of the member's key (its X-PUBLICKEY), with its node's keypair."""
    from cliprocess import Cli, _report

    ring.allow("allowed", "tool")
    allowed = str(ring.root / "allowed")
    cli = Cli(free_udp_port)

    def keyed(name: str) -> tuple[str, ...]:
        return ("--key-file", ring.secret(name), "--allowed-keys", allowed)

    try:
        first = cli.start("flux", "run", "--json", "--priority", "5", *keyed("root"))
        first.expect_event(event="online")
        second = cli.start("flux", "run", "--json", *keyed("one"))
        second.expect_event(event="online")
        result = cli.call("flux", "tree", "--json", *keyed("tool"))
        assert result.returncode == 0, _report(result)
        rows = json.loads(result.stdout)
        assert [row["rank"] for row in rows] == [0, 1], rows
    finally:
        cli.close()


def test_a_client_on_keys_fails_over_to_a_member_found_later_with_its_key(
        ring: KeyRing, started: list[FluxOverlay]) -> None:
    allowed = str(ring.root / "allowed")
    ring.allow("allowed", "two")

    def member(name: str, **kw: Any) -> FluxOverlay:
        flux = FluxOverlay(curve=Curve.load(ring.secret(name), allowed), settings=FAST,
                           address="127.0.0.1", **kw).start()
        started.append(flux)
        return flux

    root = member("root", root=True)
    one = member("one", parents={root.endpoint: ring.public("root").decode()})
    assert one.wait_online(10)
    found: dict[str, str] = {}
    client = FluxClient({one.endpoint: ring.public("one").decode()},
                        curve=Curve.load(ring.secret("client")), heartbeat=0.1, lost=0.6,
                        failover=10, find_members=lambda timeout: found).connect(5)
    try:
        two = member("two", parents={root.endpoint: ring.public("root").decode()})
        assert two.wait_online(10)
        found.update({"tcp://127.0.0.1:1": "", two.endpoint: ring.public("two").decode()})
        notices: list[Any] = []
        client.add_listener(notices.append)
        one.stop()
        wait_until(lambda: len(notices) == 2, 10, "the client on the member found later")
        assert [n.what for n in notices] == ["member-lost", "member-changed"]
        # the member without a key cannot be reached on keys: never tried, never kept
        assert client.endpoint == two.endpoint and client.rank == two.rank
        assert "tcp://127.0.0.1:1" not in client.endpoints
        assert client.keys[two.endpoint] == ring.public("two").decode()
        assert client.rpc("peermesh.info").get_json(5)["rank"] == two.rank
    finally:
        client.close()
