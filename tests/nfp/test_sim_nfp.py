"""A brokered NFP mesh on ``peermesh.sim`` in virtual time: the broker core under the one
driver, real ``Worker`` overlays (real SQLite job stores) on simulated nodes, and a client
speaking NFP/Client on a simulated link. Jobs are submitted, run and their results come
back; a worker lost (its host cut off) has its job run again by another worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import gevent
import pytest

from peermesh.config import NodeConfig
from peermesh.io.driver import Driver
from peermesh.nfp.brokercore import BrokerCore
from peermesh.nfp.client import Client
from peermesh.nfp.store import JobStore
from peermesh.nfp.worker import Tasks, Worker
from peermesh.overlay import Lifecycle
from peermesh.sim import SimNetwork
from peermesh.wire import nfp
from peermesh.wire.nfp import MAX_MESSAGE, Status
from peermesh.zre.node import Node

KEEPALIVE = 1.0
MULTIPLIER = 3


class Mesh:
    """One simulated LAN: a broker host, worker nodes and a client link."""

    def __init__(self, tmp: Path) -> None:
        self.network = SimNetwork(latency=0.002, seed=7)
        self.clock = self.network.clock
        self.tmp = tmp
        self.closers: list[Callable[[], Any]] = []
        host = self.network.transport()
        self.broker_host = host.address
        mailbox = host.bind_mailbox(host.address, MAX_MESSAGE)
        self.endpoint = mailbox.endpoint
        self.core = BrokerCore(name="broker", node="b" * 32, keepalive=KEEPALIVE,
                               multiplier=MULTIPLIER, request_timeout=5.0, queue_timeout=30.0)
        self.driver = Driver(self.core, host, name="sim broker")
        self.closers.append(self.driver.close)
        self.driver.listen(mailbox)
        self.driver.apply(self.core.activate(host.now()))
        self.runs: list[tuple[str, Any]] = []     # (worker, argument) of every run
        self.workers: dict[str, Worker] = {}
        client = self.network.transport()
        self.client_host = client.address
        self.client = client.connect(b"client-1", self.endpoint, 1000)
        self.closers.append(self.client.close)
        self.inbox: list[nfp.Message] = []
        reader = gevent.spawn(self.client.serve, self._on_reply)
        self.closers.append(lambda: reader.kill(block=False))

    def _on_reply(self, first: bytes, rest: list[bytes]) -> None:
        self.inbox.append(nfp.decode([first, *rest]))

    def worker(self, name: str, internal: bool = True) -> Worker:
        tasks = Tasks()
        clock = self.clock

        @tasks.task()
        def work(job: Any, seconds: float, value: Any) -> Any:
            self.runs.append((job.worker, value))
            clock.sleep(seconds)             # virtual seconds: the transport's clock
            return {"value": value, "by": job.worker}

        transport = self.network.transport()
        node = Node(name, config=NodeConfig(interface="sim0", rtt_probe=0),
                    transport=transport)
        store = JobStore(self.tmp / f"{name}.db")
        worker = Worker("svc", name, tasks, store, internal=internal, transport=transport,
                        keepalive=KEEPALIVE, multiplier=MULTIPLIER, node_name=name)
        worker.attach(node)
        node.start()
        worker.start()
        worker.connect_broker(self.endpoint)
        self.closers += [store.close, node.stop, worker.stop]
        self.workers[name] = worker
        return worker

    def post(self, uuid: str, seconds: float, value: Any) -> None:
        body = nfp.encode_body({"task": "work", "args": [seconds, value], "notify": True,
                                "rid": "r" + uuid[-4:]})
        assert self.client.try_send(nfp.request_frames(
            nfp.Command.POST, nfp.CLIENT, "svc", nfp.ANY, uuid, (body,)))

    def until(self, what: str, done: Callable[[], bool], seconds: float) -> None:
        """Advance virtual time in small steps until ``done()``; fail after ``seconds``."""
        end = self.clock.now() + seconds
        while not done():
            if self.clock.now() >= end:
                pytest.fail(f"{what}: not within {seconds} virtual seconds; got {self.inbox}")
            self.clock.advance(0.05)

    def final(self, uuid: str) -> list[dict[str, Any]]:
        """Bodies of the job's messages that carry a final state (a 202 or an EVENT)."""
        out = []
        for msg in self.inbox:
            if getattr(msg, "uuid", None) == uuid or getattr(msg, "topic", None) == uuid:
                body = nfp.decode_body(msg.body[0])
                finished = body.get("finished")
                if isinstance(finished, dict):
                    out += finished.values()
                elif body.get("state") == "completed":
                    out.append(body)
        return out

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path)
    try:
        yield m
    finally:
        m.close()


def test_jobs_run_and_their_results_come_back_in_virtual_time(mesh: Mesh) -> None:
    for name in ("w1", "w2"):
        mesh.worker(name)
    mesh.until("both workers ready",
               lambda: len(mesh.core.dispatcher.services.get("svc", {})) == 2, 5.0)  # type: ignore
    uuids = [f"job-{i:04d}" for i in range(6)]
    for i, uuid in enumerate(uuids):
        mesh.post(uuid, 0.5, i)
    mesh.until("every result", lambda: all(mesh.final(u) for u in uuids), 20.0)
    for i, uuid in enumerate(uuids):
        (result,) = mesh.final(uuid)
        assert result["state"] == "completed", result
        assert result["result"] == {"value": i, "by": result["worker"]}
        assert result["duration"] == 0.5     # virtual seconds, to the last digit
    assert {by for by, _ in mesh.runs} == {"w1", "w2"}     # both took jobs
    assert sorted(v for _, v in mesh.runs) == list(range(6))  # each ran once
    # the store of whoever ran a job holds its result, committed
    for uuid in uuids:
        held = [w.store.worker_job(w.name, uuid) for w in mesh.workers.values()]
        assert [r.state for r in held if r is not None] == ["completed"]
    assert mesh.clock.now() < 20.0
    assert [w.stats["broker_connects"] for w in mesh.workers.values()] == [1, 1]


def test_a_lost_worker_has_its_job_run_again_by_another(mesh: Mesh) -> None:
    mesh.worker("w1")
    mesh.until("w1 ready", lambda: "w1" in mesh.core.dispatcher.workers, 5.0)  # type: ignore
    mesh.post("job-lost", 60.0, "x")
    mesh.until("w1 runs the job", lambda: mesh.runs == [("w1", "x")], 5.0)
    accepted = [m for m in mesh.inbox if isinstance(m, nfp.Response)]
    assert [m.status for m in accepted] == [Status.ACCEPTED]
    w2 = mesh.worker("w2")
    mesh.until("w2 ready", lambda: "w2" in mesh.core.dispatcher.workers, 5.0)  # type: ignore
    # w1's host is cut off from the broker (a crash, as the broker sees it): no keepalive
    w1_host = mesh.workers["w1"].transport.address   # type: ignore[attr-defined]
    others = [mesh.broker_host, mesh.client_host, w2.transport.address]  # type: ignore
    mesh.network.partition([[w1_host], others])
    mesh.until("the job runs again on w2", lambda: ("w2", "x") in mesh.runs,
               KEEPALIVE * MULTIPLIER + 5.0)
    events = [nfp.decode_body(m.body[0]) for m in mesh.inbox if isinstance(m, nfp.EventCommand)]
    moved = [e for e in events if e.get("state") == "redispatched"]
    assert moved and moved[0]["from"] == "w1" and moved[0]["to"] == "w2"
    assert "w1" not in mesh.core.dispatcher.workers  # type: ignore[union-attr]
    # w1 heard nothing from the broker for keepalive * multiplier: it began again, and again
    mesh.until("w1 trying again", lambda: mesh.workers["w1"].stats["broker_connects"] >= 2,
               KEEPALIVE * MULTIPLIER + 2.0)
    mesh.until("its result", lambda: bool(mesh.final("job-lost")), 70.0)
    (result,) = mesh.final("job-lost")
    assert result["result"] == {"value": "x", "by": "w2"}


def test_a_worker_answers_direct_clients_on_a_mailbox_of_its_transport(mesh: Mesh) -> None:
    # no ZeroMQ on the simulator: the worker's ROUTER can only come from its transport
    worker = mesh.worker("w1", internal=False)
    assert worker.endpoint.startswith("tcp://")
    link = mesh.network.transport().connect(b"direct-1", worker.endpoint, 1000)
    got: list[nfp.Message] = []
    reader = gevent.spawn(link.serve, lambda first, rest: got.append(nfp.decode([first, *rest])))
    mesh.closers += [link.close, lambda: reader.kill(block=False)]
    assert link.try_send(nfp.encode(nfp.Open(nfp.CLIENT)))
    mesh.until("the worker's OPEN", lambda: any(isinstance(m, nfp.Open) for m in got), 5.0)
    body = nfp.encode_body({"task": "work", "args": [0.5, 7], "notify": True, "rid": "d1"})
    assert link.try_send(nfp.request_frames(nfp.Command.POST, nfp.CLIENT, "svc", nfp.ANY,
                                            "job-direct", (body,)))
    mesh.inbox = got
    mesh.until("the result", lambda: bool(mesh.final("job-direct")), 10.0)
    (result,) = mesh.final("job-direct")
    assert result["result"] == {"value": 7, "by": "w1"}
    assert mesh.runs == [("w1", 7)]


def test_a_request_the_broker_never_answers_expires_on_the_transport_clock(
        tmp_path: Path) -> None:
    # the client's deadlines are the driver's timer on the transport's clock: in virtual
    # time here, and to the deadline, not to a polling period after it
    network = SimNetwork(latency=0.002, seed=7)
    clock = network.clock
    host = network.transport()
    mailbox = host.bind_mailbox(host.address, MAX_MESSAGE)
    mailbox.replies = True                    # it answers down the links it is sent on
    heard: list[nfp.Message] = []

    def on_message(identity: bytes, frames: list[bytes]) -> None:   # OPEN, then silence
        msg = nfp.decode(frames)
        heard.append(msg)
        if isinstance(msg, nfp.Open):
            assert mailbox.try_send([identity, *nfp.encode(nfp.Open(
                nfp.BROKER, nfp.encode_body({"active": True})))])

    server = gevent.spawn(mailbox.serve, on_message)
    store = JobStore(tmp_path / "client.db")
    client = Client(store, name="c", node="c" * 32, transport=network.transport())
    client.lifecycle = Lifecycle.ATTACHED     # (no node: the client alone)
    client.start()
    try:
        client.set_broker(mailbox.endpoint)
        start = clock.now()
        asked = gevent.spawn(client.get, "a" * 32, service="svc", target="any", timeout=3.02)
        while not asked.ready() and clock.now() - start < 10.0:
            clock.advance(0.01)
        reply = asked.get(timeout=5)
        assert reply.status is Status.REQUEST_TIMEOUT, reply
        assert reply.text == "no answer from the broker in time"
        assert 3.02 <= clock.now() - start < 3.02 + 0.025    # the driver's SLACK, a step
        assert [type(m) for m in heard] == [nfp.Open, nfp.Get]
    finally:
        client.stop()
        server.kill(block=False)
        mailbox.close()
        store.close()
