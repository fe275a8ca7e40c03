"""The handle API on loopback in one process: services, errors, subscriptions, misuse."""

from __future__ import annotations

import time
from collections.abc import Iterator

import gevent
import pytest

from peermesh.flux import (
    Errno, FluxError, FluxOverlay, FluxRequest, FluxSettings, FluxStateError, MsgFlag,
    TopologyError, call_all,
)

#: each test with the common hops routed in C and in Python (conftest ``both_paths``)
pytestmark = pytest.mark.usefixtures("both_paths")

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


def test_answers_from_other_greenlets_wake_the_waiting_caller(
        pair: tuple[FluxOverlay, FluxOverlay]) -> None:
    root, leaf = pair

    def later(request: FluxRequest) -> None:   # answered from a greenlet of its own
        gevent.spawn_later(0.01, request.respond, "done")

    leaf.register("job.later", later)
    assert leaf.rpc("job.later", None, leaf.rank).get(5) == b"done\0"    # on this node
    assert root.rpc("job.later", None, 1).get(5) == b"done\0"            # through the tree
    waiters = [gevent.spawn(lambda: leaf.rpc("job.later", None, leaf.rank).get(5))
               for _ in range(3)]
    assert [w.get(5) for w in waiters] == [b"done\0"] * 3


def test_an_rpc_after_the_hub_was_idle_counts_its_timeout_from_the_call() -> None:
    """A response within the timeout is got however long the hub had not run before
    the call (its clock is as old as its last round; counted from it, the timeout ran
    out at once)."""
    from peermesh.flux.handle import RpcFuture
    from peermesh.wire.flux import Response

    class Owner:
        def _abandon(self, future: RpcFuture) -> None:
            pass

    future = RpcFuture(Owner(), 5, "svc.late", False)  # type: ignore[arg-type]

    def answer_soon() -> None:
        gevent.sleep(0.01)  # (gevent.sleep brings the hub's clock up to date)
        future._put(Response("svc.late", matchtag=5))

    hub = gevent.get_hub()
    hub.wait(hub.loop.timer(0.001))  # resumed straight from a watcher (as by a message)
    time.sleep(0.3)  # then the hub does not run: its clock stays 0.3 s behind
    gevent.spawn(answer_soon)
    assert future.response(0.2).matchtag == 5
