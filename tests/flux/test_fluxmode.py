"""A peermesh rank inside a real flux-core tree (flux mode): a config-booted flux-core
rank 0 on loopback, and rank 1 a ``FluxModeMember``. Skipped without flux-core >= 0.88."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import gevent
import pytest
from gevent import subprocess

from peermesh.flux import FluxClient, FluxError
from peermesh.flux.errors import FluxStateError
from peermesh.flux.fluxmode import FluxModeMember

from .fluxcore import SKIP, ConfigBootedRank0, flux_core_version

pytestmark = pytest.mark.skipif(flux_core_version() is None, reason=SKIP)


@pytest.fixture
def rank0(tmp_path: Path, free_tcp_port: int) -> Iterator[ConfigBootedRank0]:
    broker = ConfigBootedRank0(tmp_path, 3, free_tcp_port)
    try:
        yield broker
    finally:
        broker.stop()


def overlay_status(rank0: ConfigBootedRank0) -> str:
    return subprocess.run(["flux", "overlay", "status"], capture_output=True, text=True,
                          env=rank0.env(), timeout=60).stdout


def test_a_peermesh_rank_in_a_flux_core_tree(rank0: ConfigBootedRank0) -> None:
    member = FluxModeMember.from_config(str(rank0.config), "fake1").start()  # the same file
    assert (member.rank, member.core.size, member.parent) == (1, 3, rank0.endpoint)
    try:
        assert member.wait_online(30) and len(member.core.parent_uuid) == 36
        member.register("pm.hello", lambda request: {"from": "peermesh", "rank": 1})
        assert re.search(r"1 fake1: full", overlay_status(rank0))
        # flux-core's own tools reach it through rank 0
        ping = subprocess.run(["flux", "ping", "-c", "2", "-i", "0.01", "1"],
                              capture_output=True, text=True, env=rank0.env(), timeout=60)
        assert ping.returncode == 0, ping.stderr
        assert re.fullmatch(r"flux-ping 1!broker\n(1!broker\.ping pad=0 seq=\d time=[\d.]+ "
                            r"ms \([0-9a-f!-]+\)\n){2}", ping.stdout), ping.stdout
        call = subprocess.run(
            ["flux", "python", "-c", "import flux, json; "
             "print(json.dumps(flux.Flux().rpc('pm.hello', nodeid=1).get()))"],
            capture_output=True, text=True, env=rank0.env(), timeout=60)
        assert call.returncode == 0 and json.loads(call.stdout) == {
            "from": "peermesh", "rank": 1}, call.stderr
        # its own requests go through the tree; the instance's events come down to it
        assert json.loads(member.rpc("attr.get", {"name": "size"}, 0, 10).rstrip(b"\0")) == \
            {"value": "3", "flags": 1}
        events = member.subscribe("fm.")
        pub = subprocess.run(["flux", "event", "pub", "fm.x", '{"a": 1}'], capture_output=True,
                             text=True, env=rank0.env(), timeout=60)
        assert pub.returncode == 0, pub.stderr
        event = events(10)
        assert event is not None and event.topic == "fm.x"
        # a peermesh client of rank 0's local connector reaches the peermesh rank too
        client = FluxClient([rank0.uri]).connect(20)
        try:
            assert client.rpc("pm.hello", None, 1).get_json(10)["from"] == "peermesh"
            assert client.attr_get("size", 10) == "3"
        finally:
            client.close()
        gevent.sleep(member.core.heartbeat * 2)   # heartbeats keep it full, not torpid
        assert re.search(r"1 fake1: full", overlay_status(rank0))
    finally:
        member.stop()
    assert member.core.state == "stopped"
    assert re.search(r"1 fake1: offline", overlay_status(rank0))   # overlay.goodbye


@pytest.mark.parametrize("rank,hostname,why", [
    (1, "elsewhere", "EINVAL answering overlay.hello"),  # not the hostname the config gives
    (2, "fake2", None),                               # fine: the check is per rank
])
def test_a_rank_the_config_does_not_give_is_refused(rank0: ConfigBootedRank0, rank: int,
                                                     hostname: str, why: str) -> None:
    member = FluxModeMember(rank0.endpoint, str(rank0.cert), rank=rank, size=3,
                            hostname=hostname).start()
    try:
        if why is None:
            assert member.wait_online(30)
            return
        with pytest.raises(FluxStateError, match=why):
            member.wait_online(30)
        assert member.core.state == "stopped"
    finally:
        member.stop()


def test_a_version_the_parent_does_not_run_is_refused(rank0: ConfigBootedRank0) -> None:
    member = FluxModeMember(rank0.endpoint, str(rank0.cert), rank=1, size=3,
                            hostname="fake1", version=(0, 87, 0)).start()
    try:
        with pytest.raises(FluxStateError, match="version"):
            member.wait_online(30)
    finally:
        member.stop()


def test_a_flux_core_broker_under_a_peermesh_rank_0_is_refused_with_a_reason(
        tmp_path: Path) -> None:
    """Not a hang: the flux-core child logs the refusal and shuts down."""
    from peermesh.flux import FluxOverlay
    from peermesh.flux.core import FLUX_CORE_CHILD_REFUSED
    from peermesh.io.curve import Curve

    from .fluxcore import clean_env

    cert = tmp_path / "curve.cert"
    subprocess.run(["flux", "keygen", str(cert)], check=True, capture_output=True,
                   env=clean_env(), timeout=60)
    cert.chmod(0o600)
    root = FluxOverlay(root=True, address="127.0.0.1", curve=Curve.load(cert)).start()
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "bootstrap.toml").write_text(
        f'[bootstrap]\ncurve_cert = "{cert}"\n[[bootstrap.hosts]]\nhost = "fake0"\n'
        f'connect = "{root.endpoint}"\n[[bootstrap.hosts]]\nhost = "fake1"\n')
    child = subprocess.Popen(["flux", "broker", "-v", "-Shostname=fake1",
                              f"--config-path={conf}", "-Sbroker.rc1_path=",
                              "-Sbroker.rc3_path=", "true"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=clean_env())
    try:
        assert child.stderr is not None
        line = ""
        with gevent.Timeout(60, False):
            for line in child.stderr:
                if "overlay.hello" in line:
                    assert FLUX_CORE_CHILD_REFUSED in line, line
                    break
        assert FLUX_CORE_CHILD_REFUSED in line
        assert root.info()["children"] == []
    finally:
        child.kill()
        child.wait(10)
        root.stop()


def test_flux_run_with_the_instances_config_is_that_rank(
        rank0: ConfigBootedRank0, tmp_path: Path, free_udp_port: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    from cliprocess import Cli

    (tmp_path / "fluxmode_services.py").write_text(
        "def register(flux):\n"
        "    flux.register('fm.echo', lambda request: {'rank': flux.rank, "
        "'got': request.json()})\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path.cwd()}")
    cli = Cli(free_udp_port)
    try:
        process = cli.start("flux", "run", "--json", "--flux-config", str(rank0.config),
                            "--flux-hostname", "fake1", "--handlers", "fluxmode_services")
        assert process.expect_event(event="online")["rank"] == 1
        assert re.search(r"1 fake1: full", overlay_status(rank0))
        call = subprocess.run(
            ["flux", "python", "-c", "import flux, json; print(json.dumps(flux.Flux().rpc("
             "'fm.echo', {'x': 1}, nodeid=1).get()))"],
            capture_output=True, text=True, env=rank0.env(), timeout=60)
        assert json.loads(call.stdout) == {"rank": 1, "got": {"x": 1}}, call.stderr
        assert process.stop(signal.SIGTERM) == 0, process.describe()
        assert re.search(r"1 fake1: offline", overlay_status(rank0))
        refused = cli.call("flux", "run", "--flux-config", str(rank0.config),
                           "--flux-hostname", "elsewhere", timeout=60)
        assert refused.returncode == 2 and "elsewhere is not among the hosts" in \
            refused.stderr, refused.stderr
    finally:
        cli.close()


def test_requests_past_max_serving_get_eagain(rank0: ConfigBootedRank0) -> None:
    member = FluxModeMember.from_config(str(rank0.config), "fake1", max_serving=0).start()
    try:
        assert member.wait_online(30)
        member.register("pm.hello", lambda request: {"rank": 1})
        client = FluxClient([rank0.uri]).connect(20)
        try:
            with pytest.raises(FluxError) as busy:
                client.rpc("pm.hello", None, 1).get(10)
            assert busy.value.errnum == 11 and "max_serving" in busy.value.message
            assert client.ping(1, 10) > 0          # the built-ins are answered still
        finally:
            client.close()
    finally:
        member.stop()
