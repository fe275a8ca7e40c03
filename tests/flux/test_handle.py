"""The handle API on loopback in one process: services, errors, subscriptions, misuse."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from peermesh.flux import (
    Errno, FluxError, FluxOverlay, FluxRequest, FluxSettings, FluxStateError, MsgFlag,
    TopologyError, call_all,
)

FAST = FluxSettings(heartbeat=0.1, torpid=0.3, lost=0.6, hello_timeout=0.5)


@pytest.fixture
def pair() -> Iterator[tuple[FluxOverlay, FluxOverlay]]:
    root = FluxOverlay(root=True, settings=FAST, address="127.0.0.1").start()
    leaf = FluxOverlay(parents=[root.endpoint], settings=FAST, address="127.0.0.1").start()
    try:
        assert leaf.wait_online(10)
        yield root, leaf
    finally:
        leaf.stop()
        root.stop()


def test_services_errors_and_handles(pair: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, leaf = pair

    def fail(request: FluxRequest) -> None:
        raise FluxError(Errno.EEXIST, "already there")

    def crash(request: FluxRequest) -> None:
        raise RuntimeError("boom")

    root.register("kv.fail", fail)
    root.register("kv.crash", crash)
    root.register("kv.text", lambda request: "hello")
    with pytest.raises(FluxError) as error:
        leaf.rpc("kv.fail").get(5)
    assert (error.value.errnum, error.value.message) == (Errno.EEXIST, "already there")
    with pytest.raises(FluxError) as error:
        leaf.rpc("kv.crash").get(5)
    assert error.value.errnum == Errno.EIO and "boom" in error.value.message
    assert leaf.rpc("kv.text").get(5) == b"hello\0"
    with pytest.raises(FluxError) as error:
        leaf.rpc("kv.none").get(5)               # the service is here, the method is not
    assert error.value.errnum == Errno.ENOSYS
    root.default.unregister("kv.text")
    with pytest.raises(FluxError):
        leaf.rpc("kv.text").get(5)
    results = call_all(leaf, "broker.ping", [0, 1, 7], b"", 5)
    assert results[0] == results[1] == b"" and isinstance(results[7], FluxError)

    other = leaf.handle()                        # a second client: its own matchtags
    root.register("kv.hold", lambda request: None)
    held = other.rpc("kv.hold", None, 0)
    other.close()                                # pending RPCs fail at once
    with pytest.raises(FluxError) as error:
        held.get(1)
    assert error.value.errnum == Errno.EHOSTUNREACH
    with pytest.raises(FluxError) as error:
        leaf.rpc("kv.hold", None, 0).get(0.2)
    assert error.value.errnum == Errno.ETIMEDOUT


def test_subscriptions_open_and_close(pair: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, leaf = pair
    everything = leaf.subscribe("")
    jobs = leaf.subscribe("job.")
    assert root.publish("job.a", {"n": 1}).get_json(5) == {"seq": 1}
    assert jobs.get(5).topic == "job.a"  # type: ignore[union-attr]
    jobs.close()
    leaf.publish("kvs.b").get(5)
    root.publish("job.c").get(5)
    assert [e.topic for e in (everything.get(5), everything.get(5), everything.get(5))
            if e] == ["job.a", "kvs.b", "job.c"]
    assert jobs.get(0.1) is None


def test_misuse_is_a_clear_error(pair: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, leaf = pair
    for call, match in [
        (lambda: leaf.rpc(""), "non-empty string"),
        (lambda: leaf.rpc("a.b", 5), "payload is bytes"),  # type: ignore[arg-type]
        (lambda: leaf.rpc("a.b", None, -1), "not a rank"),
        (lambda: leaf.rpc("a.b", None, 0, MsgFlag.NORESPONSE, streaming=True), "both"),
        (lambda: leaf.register("nodot", lambda r: None), "service.method"),
        (lambda: leaf.register("broker.x", lambda r: None), "built in"),
        (lambda: FluxOverlay(root=True, parents=["tcp://127.0.0.1:1"]), "no parents"),
        (lambda: FluxOverlay().start(), "root=True or parents"),
        (lambda: FluxOverlay(rank=-2), "whole number"),
    ]:
        with pytest.raises(FluxStateError, match=match):
            call()
    with pytest.raises(TopologyError, match="kary:K"):
        FluxOverlay(topology="tree")
