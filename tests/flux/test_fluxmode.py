"""A peermesh rank inside a real flux-core tree (flux mode): a config-booted flux-core
rank 0 on loopback, and rank 1 a ``FluxModeMember``. Skipped without flux-core >= 0.88."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import gevent
import pytest
import waiting
from gevent import subprocess

from peermesh.flux import FluxClient, FluxError
from peermesh.flux.errors import FluxStateError
from peermesh.flux.fluxmode import FluxModeMember

from .fluxcore import SKIP, ConfigBootedRank0, FluxCoreBroker, flux_core_version, write_config

pytestmark = pytest.mark.skipif(flux_core_version() is None, reason=SKIP)


@pytest.fixture
def rank0(tmp_path: Path, free_tcp_port: int) -> Iterator[ConfigBootedRank0]:
    broker = ConfigBootedRank0(tmp_path, 3, free_tcp_port)
    try:
        yield broker
    finally:
        broker.stop()


def overlay_status(rank0: "ConfigBootedRank0 | FluxCoreBroker") -> str:
    return subprocess.run(["flux", "overlay", "status"], capture_output=True, text=True,
                          env=rank0.env(), timeout=60).stdout


def wait_full(broker: "ConfigBootedRank0 | FluxCoreBroker", ranks: int) -> str:
    """``flux overlay status`` once it shows ``ranks`` ranks, all full (bounded)."""
    status = ""
    with gevent.Timeout(60, False):
        while True:
            status = overlay_status(broker)
            if len(re.findall(r"\d+ fake\d+: full", status)) == ranks:
                return status
            gevent.sleep(0.2)
    pytest.fail(f"not full in 60 s: {status}")


def heartbeats(rank: FluxModeMember, counter: str, count: int = 3) -> None:
    """Wait (bounded) until ``rank`` has sent or heard ``count`` more heartbeats."""
    start = rank.core.stats[counter]
    waiting.poll_until(lambda: rank.core.stats[counter] >= start + count, 60,
               f"{count} {counter.replace('_', ' ')}", sleep=gevent.sleep)


def sub_one(broker: FluxCoreBroker, prefix: str) -> "subprocess.Popen[str]":
    """``flux event sub --count=1`` on ``broker``: its output once an event came."""
    return subprocess.Popen(["flux", "event", "sub", "--count=1", prefix],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=broker.env())


def until_received(sub: "subprocess.Popen[str]", publish: Callable[[], Any]) -> str:
    """Publish until the subscriber (which may subscribe after the first) got one."""
    with gevent.Timeout(60, False):
        while sub.poll() is None:
            publish()
            gevent.sleep(0.2)
    if sub.poll() is None:
        sub.kill()
        sub.wait(10)
        pytest.fail("no event reached the subscriber in 60 s")
    assert sub.stdout is not None
    return sub.stdout.read()


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


def test_a_flux_core_broker_under_a_peermesh_instance_is_refused_with_a_reason(
        tmp_path: Path) -> None:
    """A member of a peermesh instance (not flux mode) takes no flux-core broker; not a
    hang: the flux-core child logs the refusal and shuts down."""
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_peermesh_rank_with_flux_core_children(tmp_path: Path, free_tcp_port: int) -> None:
    """flux-core rank 0 -> peermesh rank 1 -> flux-core rank 2 (kary:1)."""
    rank0 = ConfigBootedRank0(tmp_path, 3, free_tcp_port, {1: free_port()}, "kary:1")
    member = child = None
    try:
        member = FluxModeMember.from_config(str(rank0.config), "fake1").start()
        assert member.wait_online(30) and list(member.core.children) == [2]
        child = FluxCoreBroker(tmp_path, rank0.config, 2)
        status = wait_full(rank0, 3)                 # flux-core's view: the whole tree full
        assert re.search(r"0 fake0: full\n.*1 fake1: full\n.*2 fake2: full", status), status
        # pings cross the peermesh rank both ways
        down = subprocess.run(["flux", "ping", "-c", "1", "2"], capture_output=True,
                              text=True, env=rank0.env(), timeout=60)
        assert down.returncode == 0 and "2!broker.ping pad=0 seq=0" in down.stdout, down.stderr
        up = child.flux("ping", "-c", "1", "0")
        assert up.returncode == 0 and "0!broker.ping pad=0 seq=0" in up.stdout, up.stderr
        assert json.loads(member.rpc("broker.ping", {"seq": 1}, 2, 10).rstrip(b"\0"))[
            "rank"] == 2
        # the instance's events go down through it; the child's through it to rank 0
        got = until_received(sub_one(child, "fm."), lambda: subprocess.run(
            ["flux", "event", "pub", "fm.down"], env=rank0.env(), timeout=60,
            capture_output=True))
        assert got.startswith("fm.down"), got
        published = child.flux("event", "pub", "-s", "fm.up")
        assert published.returncode == 0 and published.stdout.startswith("seq="), \
            published.stderr
        heartbeats(member, "heartbeats_sent")       # heartbeats keep it full, not torpid
        assert len(re.findall(r"fake\d: full", overlay_status(rank0))) == 3
        # leaving: the child shuts down first (its goodbye), then the rank says goodbye
        member.stop(30)
        assert child.proc.wait(30) == 0, child.text()
        status = overlay_status(rank0)
        assert re.search(r"1 fake1: offline", status), status
    finally:
        if member is not None:
            member.stop(5)
        if child is not None:
            child.stop()
        rank0.stop()


def test_flux_core_brokers_under_a_peermesh_rank_0(tmp_path: Path) -> None:
    """peermesh rank 0 -> flux-core 1, 2; flux-core 1 -> flux-core 3 (kary:2)."""
    config, _ = write_config(tmp_path, 4, {0: free_port(), 1: free_port()}, "kary:2")
    root = FluxModeMember.from_config(str(config), "fake0").start()
    brokers: list[FluxCoreBroker] = []
    try:
        assert root.wait_online(10) and list(root.core.children) == [1, 2]
        events = root.subscribe("fm.")
        brokers = [FluxCoreBroker(tmp_path, config, rank) for rank in (1, 2, 3)]
        status = wait_full(brokers[2], 4)            # as the deepest flux-core broker sees it
        assert re.search(r"0 fake0: full\n.*1 fake1: full\n.*3 fake3: full\n.*2 fake2: full",
                         status, re.S), status
        # flux-core's tools on a child reach rank 0, and through it the other subtree
        for target, rank in (("0", 0), ("2", 2)):
            ping = brokers[2].flux("ping", "-c", "1", target)
            assert ping.returncode == 0 and f"{rank}!broker.ping pad=0" in ping.stdout, \
                ping.stderr
        assert brokers[0].flux("getattr", "size").stdout.strip() == "4"
        assert json.loads(root.rpc("broker.ping", {"seq": 1}, 3, 10).rstrip(b"\0"))[
            "rank"] == 3
        # events: rank 0 numbers them, published by it or by a child, and sends them down
        published = brokers[2].flux("event", "pub", "-s", "fm.up", '{"n": 1}')
        assert published.returncode == 0 and published.stdout.strip() == "seq=1", \
            published.stderr
        event = events(10)
        assert event is not None and (event.topic, event.seq) == ("fm.up", 1)
        got = until_received(sub_one(brokers[2], "fm.down"),
                             lambda: root.publish("fm.down", {"n": 2}))
        assert got.startswith("fm.down"), got
        # what rank 0 does not serve is refused at once, naming it
        kvs = brokers[0].flux("kvs", "get", "a", timeout=30)
        assert kvs.returncode != 0 and "Function not implemented" in kvs.stderr, kvs.stderr
        execs = brokers[0].flux("exec", "-r", "0", "true", timeout=30)
        assert execs.returncode != 0 and "a peermesh rank 0 has no rexec service" in \
            execs.stderr, execs.stderr
        heartbeats(root, "heartbeats_heard")        # they stay full
        assert len(re.findall(r"fake\d: full", overlay_status(brokers[2]))) == 4
        # rank 0 leaving shuts the flux-core brokers down, each saying goodbye
        root.stop(30)
        for broker in brokers:
            assert broker.proc.wait(30) == 0, broker.text()
        assert not any(child.online for child in root.core.children.values())
    finally:
        root.stop(5)
        for broker in brokers:
            broker.stop()


def test_flux_run_as_rank_0_of_flux_core_brokers(tmp_path: Path, free_udp_port: int) -> None:
    """``peermesh flux run --flux-config`` as the first host: rank 0; SIGTERM shuts the
    flux-core broker below down first."""
    import signal

    from cliprocess import Cli

    config, _ = write_config(tmp_path, 2, {0: free_port()})
    cli = Cli(free_udp_port)
    broker = None
    try:
        process = cli.start("flux", "run", "--json", "--flux-config", str(config),
                            "--flux-hostname", "fake0")
        assert process.expect_event(event="online")["rank"] == 0
        broker = FluxCoreBroker(tmp_path, config, 1)
        status = wait_full(broker, 2)
        assert re.search(r"0 fake0: full\n.*1 fake1: full", status, re.S), status
        assert process.stop(signal.SIGTERM) == 0, process.describe()
        assert broker.proc.wait(30) == 0, broker.text()
    finally:
        cli.close()
        if broker is not None:
            broker.stop()


def test_a_flux_core_broker_needing_more_of_rank_0_stops_at_once(tmp_path: Path) -> None:
    """With flux-core's own rc1 a broker loads modules that need theirs on rank 0
    (job-ingest, kvs, ...): a peermesh rank 0 answers them ENOSYS at once, so the
    broker's rc1 fails and it stops, saying goodbye; no hang."""
    config, _ = write_config(tmp_path, 2, {0: free_port()})
    root = FluxModeMember.from_config(str(config), "fake0").start()
    broker = FluxCoreBroker(tmp_path, config, 1, rc=True)
    try:
        assert broker.proc.wait(60) != 0
        log = broker.text()
        assert "Function not implemented" in log and "rc1-fail" in log, log
        assert root.core.children[1].error == "administrative shutdown"   # its goodbye
    finally:
        broker.stop()
        root.stop(5)


def test_the_instance_shutting_down_takes_the_peermesh_rank_and_its_child_along(
        tmp_path: Path, free_tcp_port: int) -> None:
    """flux-core rank 0 shuts down: the peermesh rank hears it (state-machine.monitor),
    shuts its flux-core child down, says goodbye, and rank 0 ends cleanly."""
    rank0 = ConfigBootedRank0(tmp_path, 3, free_tcp_port, {1: free_port()}, "kary:1")
    member = FluxModeMember.from_config(str(rank0.config), "fake1").start()
    child = None
    try:
        assert member.wait_online(30)
        child = FluxCoreBroker(tmp_path, rank0.config, 2)
        wait_full(rank0, 3)
        assert rank0.proc.stdin is not None
        rank0.proc.stdin.close()                    # its initial program ends: shutdown
        waiting.poll_until(lambda: rank0.proc.poll() is not None, 60, "rank 0 to end",
                           sleep=gevent.sleep)         # (a blocking wait would stop the hub)
        assert rank0.proc.returncode == 0
        assert member.ended.wait(10) and member.core.state == "stopped"
        assert child.proc.wait(30) == 0, child.text()
    finally:
        member.stop(5)
        if child is not None:
            child.stop()
        rank0.stop()
