"""peermesh against a real flux-core instance (``flux start --test-size=N``).

Skipped where no ``flux`` of flux-core 0.88 or later is on PATH. The client
reaches rank 0 through its local connector, as flux-core's own tools do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from peermesh.flux import FluxClient, FluxError
from peermesh.flux.bodies import ping_body
from peermesh.wire.flux import NODEID_ANY, NODEID_UPSTREAM, Errno

from .fluxcore import SKIP, FluxCoreInstance, clean_env, flux_core_version

pytestmark = pytest.mark.skipif(flux_core_version() is None, reason=SKIP)

#: one answer line of `flux ping` (and of `peermesh flux ping`)
PING_LINE = r"(\d+)!broker\.ping pad=(\d+) seq=(\d+) time=[\d.]+ ms \(([0-9a-zA-Z!^@-]+)\)"


@pytest.fixture(scope="module")
def instance() -> Iterator[FluxCoreInstance]:
    flux = FluxCoreInstance(3)
    try:
        yield flux
    finally:
        flux.stop()


@pytest.fixture
def client(instance: FluxCoreInstance) -> Iterator[FluxClient]:
    flux = FluxClient([instance.uri]).connect(20)
    try:
        yield flux
    finally:
        flux.close()


def test_connects_through_the_local_connector(client: FluxClient,
                                              instance: FluxCoreInstance) -> None:
    assert client.connected and (client.rank, client.size) == (0, instance.size)
    assert client.attr_get("size", 10) == str(instance.size)
    assert client.attr_get("tbon.topo", 10).startswith("kary:")
    with pytest.raises(FluxError) as missing:
        client.attr_get("no.such.attribute", 10)
    assert missing.value.errnum == Errno.ENOENT


def test_ping_with_flux_body_any_rank_and_upstream(client: FluxClient,
                                                   instance: FluxCoreInstance) -> None:
    for nodeid, rank in ((0, 0), (2, 2), (NODEID_ANY, 0)):
        answer = client.rpc("broker.ping", ping_body(7, "pp"), nodeid).get_json(10)
        assert (answer["seq"], answer["pad"], answer["rank"]) == (7, "pp", rank)
        assert isinstance(answer["route"], str) and answer["route"]
        assert isinstance(answer["userid"], int) and answer["rolemask"] & 1  # OWNER
    assert client.ping(1, 10) > 0
    with pytest.raises(FluxError) as refused:                 # rank 0 has no upstream
        client.rpc("broker.ping", ping_body(0), NODEID_UPSTREAM).get(10)
    assert refused.value.errnum in (Errno.EHOSTUNREACH, Errno.ENOSYS, Errno.EINVAL)
    with pytest.raises(FluxError) as empty:                    # flux-core's answer to b""
        client.rpc("broker.ping", b"", 0).get(10)
    assert empty.value.errnum == Errno.EPROTO


def test_errors_carry_flux_cores_messages(client: FluxClient) -> None:
    with pytest.raises(FluxError) as caught:
        client.rpc("no.such", {}, NODEID_ANY).get(10)
    assert caught.value.errnum == Errno.ENOSYS
    assert caught.value.message == "No service matching no.such is registered"


def test_publish_and_subscribe_with_flux_bodies(client: FluxClient,
                                                instance: FluxCoreInstance) -> None:
    subscription = client.subscribe("pmtest.", 10)
    seq = client.publish("pmtest.one", {"n": 1}).get_json(10)["seq"]
    assert isinstance(seq, int) and seq > 0
    event = subscription.get(10)
    assert event is not None and (event.topic, event.seq) == ("pmtest.one", seq)
    assert json.loads(event.payload.rstrip(b"\0")) == {"n": 1}
    published = instance.flux("event", "pub", "-s", "pmtest.two")   # flux-core's own tool
    assert published.returncode == 0, published.stderr
    # flux-core publishes events of its own (heartbeat.pulse) on the same sequence
    match = re.fullmatch(r"seq=(\d+)", published.stdout.strip())
    assert match and int(match.group(1)) > seq, published.stdout
    other = subscription.get(10)
    assert other is not None and (other.topic, other.seq) == ("pmtest.two", int(match.group(1)))
    subscription.close()


def test_streaming_rpc_and_cancel(client: FluxClient) -> None:
    future = client.rpc("log.dmesg", {"follow": True, "nobacklog": False}, 0, streaming=True)
    first = future.response(10)
    assert first.errnum == 0 and first.payload
    future.cancel()                                  # log.cancel {"matchtag"}: ends ENODATA
    rest = list(future.stream(10))                   # the backlog, then the end
    assert all(isinstance(line, bytes) for line in rest) and future.done


def test_cli_ping_prints_what_flux_ping_prints(instance: FluxCoreInstance) -> None:
    import subprocess

    from cliprocess import PEERMESH

    ours = subprocess.run([*PEERMESH, "flux", "ping", "-c", "2", "-i", "0.01", "-p", "4", "1",
                           "--uri", instance.uri], capture_output=True, text=True, timeout=60,
                          env=clean_env(), stdin=subprocess.DEVNULL)
    theirs = instance.flux("ping", "-c", "2", "-i", "0.01", "-p", "4", "1")
    for result in (ours, theirs):
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "flux-ping 1!broker" and len(lines) == 3, result.stdout
        for seq, line in enumerate(lines[1:]):
            match = re.fullmatch(PING_LINE, line)
            assert match and match.group(1, 2, 3) == ("1", "4", str(seq)), line
    # FLUX_URI as flux's tools read it; flux's -u
    inside = subprocess.run([*PEERMESH, "flux", "ping", "-c", "1", "-u", "any"],
                            capture_output=True, text=True, timeout=60, env=instance.env(),
                            stdin=subprocess.DEVNULL)
    assert inside.returncode == 0, inside.stderr
    assert re.fullmatch(r"0!broker\.ping pad=0 userid=\d+ rolemask=0x[0-9a-f]+ seq=0 "
                        r"time=[\d.]+ ms \(.*\)", inside.stdout.splitlines()[1]), inside.stdout
    rpc = subprocess.run([*PEERMESH, "flux", "rpc", "attr.get", '{"name": "size"}', "--uri",
                          instance.uri], capture_output=True, text=True, timeout=60,
                         env=clean_env(), stdin=subprocess.DEVNULL)
    assert rpc.returncode == 0 and json.loads(rpc.stdout)["value"] == "3", rpc.stderr
