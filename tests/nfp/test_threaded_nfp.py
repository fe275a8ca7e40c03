"""NFP from a plain threaded program: ``ThreadedNfp`` (an NfpNode riding on a ThreadedNode).

Every node lives in a thread of its own with a private gevent hub; this test
thread never touches gevent. Brokerless and brokered jobs, several caller
threads at once, the broker-change listener, and a clean stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from peermesh.nfp import BrokerChanged, NfpNode, Tasks, ThreadedNfp
from peermesh.wire.nfp import Status

import waiting

from .conftest import NFP_TIMING, TIMING


def poll(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    """Plain-thread polling (no gevent in this thread)."""
    return waiting.poll_until(predicate, timeout, what)


def threaded_tasks() -> Tasks:
    tasks = Tasks()

    @tasks.task()
    def echo(job: Any, *args: Any) -> dict[str, Any]:
        return {"args": list(args), "worker": job.worker,
                "thread": threading.current_thread().name}

    @tasks.task()
    def blocking(job: Any, seconds: float) -> str:
        # plain blocking code goes to the hub's thread pool, so the node keeps answering
        job.run_blocking(time.sleep, seconds)
        return "slept"

    return tasks


@pytest.fixture
def start(free_udp_port: int, tmp_path: Path) -> Iterator[Callable[..., ThreadedNfp]]:
    started: list[ThreadedNfp] = []

    def make(name: str, **nfp: Any) -> ThreadedNfp:
        workers = nfp.pop("workers", ())
        setup = nfp.pop("setup", None)
        settings: dict[str, Any] = dict(TIMING)
        node = ThreadedNfp(name, interface="lo", port=free_udp_port, **settings,
                           nfp={"data_dir": tmp_path, **NFP_TIMING, **nfp},
                           workers=workers, setup=setup)
        started.append(node)
        return node.start()

    try:
        yield make
    finally:
        for node in reversed(started):
            node.stop()


@pytest.mark.parametrize("brokered", [False, True])
def test_jobs_from_threads(start: Callable[..., ThreadedNfp], brokered: bool) -> None:
    setups: list[str] = []
    w1 = start("tw1", workers=[("svc", "tw1", threaded_tasks())],
               setup=lambda nfp: setups.append(f"{nfp.node.name} {len(nfp.workers)}"))
    assert setups == ["tw1 1"]                     # the hook ran before the node started
    broker = start("tb", broker="always") if brokered else None
    client = start("tc")
    changes: list[BrokerChanged] = []
    client.add_listener(changes.append)
    assert client.wait_settled(5)
    if brokered:
        poll(lambda: client.current_broker is not None
             and client.current_broker.name == "tb", what="broker elected")
        assert broker is not None and broker.is_broker
        poll(lambda: changes, what="BrokerChanged")
        assert changes[-1].new is not None and changes[-1].new.name == "tb"
    else:
        poll(lambda: client.call(lambda nfp: nfp.client.direct_workers().get("svc")),
             what="worker advertised")
        assert client.current_broker is None and not changes

    reply = client.run("svc", "echo", [1, 2], target="any", timeout=5)
    assert reply.status is Status.OK
    result = reply.body["workers"]["tw1"]["result"]
    assert result["args"] == [1, 2] and result["thread"].startswith("peermesh-tw1")

    # several caller threads at once, one of them waiting on a blocking task
    replies: dict[int, Any] = {}

    def caller(i: int) -> None:
        if i == 0:
            replies[i] = client.run("svc", "blocking", [0.3], target="tw1", timeout=5)
        else:
            replies[i] = w1.run("svc", "echo", [i], target="any", timeout=5)
    threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(replies[i].status is Status.OK for i in range(4)), replies
    assert replies[0].body["workers"]["tw1"]["result"] == "slept"

    posted = client.post("svc", "echo", ["later"], target="tw1")
    assert posted.status is Status.ACCEPTED
    uuid = posted.body["uuid"]
    done = client.get(uuid, wait=3)
    assert done.status is Status.OK
    assert done.body["workers"]["tw1"]["result"]["args"] == ["later"]
    assert client.find_job(uuid[:10]).uuid == uuid
    assert uuid in {j.uuid for j in client.jobs()}
    assert client.info()["node"] == "tc"
    if brokered:
        assert broker is not None
        assert broker.call(lambda nfp: nfp.broker.stats["requests"]) >= 5  # type: ignore


def test_stop_and_setup_errors(start: Callable[..., ThreadedNfp], tmp_path: Path,
                               free_udp_port: int) -> None:
    node = start("solo")
    assert node.running
    nfp_seen: list[NfpNode] = []
    node.call(nfp_seen.append)
    node.stop()
    assert not node.running and not nfp_seen[0].running
    node.stop()                                     # twice is fine

    def bad(nfp: NfpNode) -> None:
        raise ValueError("setup refused")
    broken = ThreadedNfp("broken", interface="lo", port=free_udp_port, nfp={"data_dir": tmp_path},
                         setup=bad)
    with pytest.raises(ValueError, match="setup refused"):
        broken.start()
    assert not broken.running
