"""NFP over real sockets, several nodes in this process on loopback: brokerless and brokered.

Covers targeting (any/all/named), GET 200/300/400, DELETE, EVENT relay, the
client store, queueing for a service whose first worker arrives later,
step-down when a better broker candidate appears (the heal case), the
broker services (MMI, SID, FSS) and hostile frames next to normal traffic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import zmq

from peermesh import Node
from peermesh.errors import NodeStateError
from peermesh.nfp import NFP_BROKER_HEADER, BrokerChanged, JobEvent, NfpNode
from peermesh.nfp.mesh import WORKER_HEADER
from peermesh.overlay import Lifecycle, roles_of
from peermesh.overlay.election import BROKER_HEADER
from peermesh.wire import nfp
from peermesh.wire.nfp import Status

from .conftest import TIMING, Mesh, wait_until


def ready_direct(client_nfp: NfpNode, service: str, count: int) -> None:
    wait_until(lambda: len(client_nfp.client.direct_workers().get(service, [])) >= count,
               5, f"{count} workers of {service}")


def ready_brokered(client_nfp: NfpNode, broker: NfpNode, service: str, count: int) -> None:
    wait_until(lambda: client_nfp.current_broker is not None
               and client_nfp.current_broker.uuid == broker.node.uuid, 5, "broker elected")
    wait_until(lambda: broker.broker is not None and broker.broker.dispatcher is not None
               and len(broker.broker.dispatcher.services.get(service, {})) >= count, 5,
               f"{count} workers of {service} registered with the broker")


@pytest.fixture(params=["brokerless", "brokered"])
def setup(request: pytest.FixtureRequest, mesh: Mesh) -> tuple[NfpNode, dict[str, NfpNode]]:
    """Two workers of 'svc' (w1, w2), one of 'other' (x1), a client; plus a broker if brokered."""
    nodes = {"w1": mesh.add("w1", workers=(("svc", "w1"),)),
             "w2": mesh.add("w2", workers=(("svc", "w2"),)),
             "x1": mesh.add("x1", workers=(("other", "x1"),))}
    if request.param == "brokered":
        nodes["broker"] = mesh.add("broker", broker="always")
    client = mesh.add("client")
    if request.param == "brokered":
        ready_brokered(client, nodes["broker"], "svc", 2)
    else:
        wait_until(lambda: client.settled.is_set(), 5, "settled")
        ready_direct(client, "svc", 2)
        assert client.current_broker is None
    return client, nodes


def test_targets_all_any_named(setup: tuple[NfpNode, dict[str, NfpNode]]) -> None:
    client, _ = setup
    c = client.client
    reply = c.run("svc", "echo", [1], target="all", timeout=5)
    assert reply.status is Status.OK and sorted(reply.body["workers"]) == ["w1", "w2"]
    assert all(w["result"]["args"] == [1] for w in reply.body["workers"].values())
    seen = set()
    for i in range(4):
        reply = c.run("svc", "echo", [i], target="any", timeout=5)
        (name,) = reply.body["workers"]
        seen.add(name)
    assert seen == {"w1", "w2"}                         # any spreads by load / recency
    reply = c.run("svc", "echo", kwargs={"k": "v"}, target="w2", timeout=5)
    assert list(reply.body["workers"]) == ["w2"]
    assert reply.body["workers"]["w2"]["result"]["kwargs"] == {"k": "v"}
    # finished jobs are not kept for re-posting after a broker change (a quick job's
    # result rides on its 202, before the POST returns)
    assert not c._open
    # ... and listeners see it as the final EVENT it stands for, once per worker
    events: list[JobEvent] = []
    c.add_listener(events.append)
    reply = c.run("svc", "echo", [7], target="all", timeout=5)
    uuid = reply.body["uuid"]
    finals = sorted((e.worker, e.state, e.body["result"]["args"]) for e in events
                    if e.uuid == uuid)
    assert finals == [("w1", "completed", [7]), ("w2", "completed", [7])]
    assert "finished" not in reply.body
    posted = c.post("svc", "echo", target=["w1", "ghost"])
    assert posted.status is Status.ACCEPTED and posted.body["workers"] == ["w1"]
    assert posted.body["errors"] == {"ghost": "no such worker"}
    posted = c.post("svc", "echo", target="x1", timeout=0.5)  # x1 serves other, not svc
    assert posted.status is not Status.ACCEPTED


def test_get_pending_result_unknown_and_events(setup: tuple[NfpNode, dict[str, NfpNode]]
                                               ) -> None:
    client, _ = setup
    c = client.client
    events: list[JobEvent] = []
    c.add_listener(events.append)
    posted = c.post("svc", "sleep", kwargs={"seconds": 0.3}, target="w1")
    assert posted.status is Status.ACCEPTED
    uuid = posted.body["uuid"]
    assert c.get(uuid).status is Status.PENDING              # 300 while running
    done = c.get(uuid, wait=3)
    assert done.status is Status.OK
    assert done.body["workers"]["w1"]["result"] == "w1 slept"
    assert done.body["workers"]["w1"]["state"] == "completed"
    wait_until(lambda: any(e.uuid == uuid and e.state == "completed" for e in events), 3)
    assert any(e.uuid == uuid and e.state == "running" and e.body.get("message") == "sleeping"
               for e in events)                               # progress relayed to the poster
    unknown = c.get("0" * 32, service="svc", target="all")
    assert unknown.status is Status.UNKNOWN
    stored = c.store.client_job(uuid)
    assert stored is not None and stored.state == "completed" and stored.workers == ["w1"]


def test_failures_are_reported(setup: tuple[NfpNode, dict[str, NfpNode]]) -> None:
    c = setup[0].client
    reply = c.run("svc", "fail", target="any", timeout=5)
    (entry,) = reply.body["workers"].values()
    assert entry["state"] == "failed" and entry["errors"] == ["RuntimeError: boom"]
    reply = c.run("svc", "unencodable", target="any", timeout=5)
    (entry,) = reply.body["workers"].values()
    assert entry["state"] == "failed" and "JSON" in entry["errors"][0]
    reply = c.post("svc", "no-such-task", target="all")
    assert reply.status is Status.ERROR
    assert "no task" in reply.body["errors"]["w1"]
    assert c.store.client_job(reply.body["uuid"]).state == "failed"  # type: ignore[union-attr]


def test_api_misuse_is_refused_before_anything_is_sent_or_recorded(mesh: Mesh) -> None:
    c = mesh.add("client").client
    for call, error, message in (
            (lambda: c.post("svc", "echo", "abc"), TypeError, "args must be a list or tuple"),
            (lambda: c.post("svc", "echo", [], [1]), TypeError, "kwargs must be a mapping"),
            (lambda: c.post("svc", 5), ValueError, "task must be a non-empty string"),
            (lambda: c.post("", "echo"), ValueError, "service must be a non-empty"),
            (lambda: c.post("svc", "echo", [{1}]), TypeError, "arguments cannot be sent"),
            (lambda: c.post("svc", "echo", timeout=-1), ValueError, "timeout must be"),
            (lambda: c.post("svc", "echo", job_timeout=0), ValueError, "job_timeout must be"),
            (lambda: c.run("svc", "echo", timeout=float("nan")), ValueError, "timeout must be"),
            (lambda: c.get("ab" * 16, service="svc", timeout=0), ValueError, "timeout must be"),
            (lambda: c.delete("ab" * 16, service="s\n"), ValueError, "service must be")):
        with pytest.raises(error, match=message):
            call()
    assert c.jobs() == [] and c._direct.queued() == {}


def test_a_task_that_exits_or_interrupts_fails_and_the_worker_goes_on(mesh: Mesh) -> None:
    mesh.add("w1", workers=(("svc", "w1"),))
    client = mesh.add("client")
    ready_direct(client, "svc", 1)
    c = client.client
    for how, error in (("exit", "SystemExit: 3"), ("interrupt", "KeyboardInterrupt"),
                       ("timeout", "Timeout")):
        reply = c.run("svc", "quits", [how], target="any", timeout=5)
        entry = reply.body["workers"]["w1"]
        assert entry["state"] == "failed" and entry["errors"][0].startswith(error), entry
        assert c.run("svc", "echo", [how], target="any", timeout=5).status is Status.OK


def test_a_clean_stop_during_a_job_run_again_does_not_count_as_a_crash(mesh: Mesh) -> None:
    client = mesh.add("client")

    def start_worker() -> NfpNode:
        worker = mesh.add("w1", workers=(("svc", "w1"),))
        ready_direct(client, "svc", 1)
        return worker

    def running(worker: NfpNode, uuid: str) -> None:
        wait_until(lambda: getattr(worker.workers[0]._running, "uuid", None) == uuid, 5,
                   "the job running")

    worker = start_worker()
    uuid = client.client.post("svc", "sleep", kwargs={"seconds": 30}, target="w1").body["uuid"]
    for recovered in (0, 1, 1, 1):    # stopped cleanly while it ran: first run, then run again
        running(worker, uuid)
        assert worker.workers[0].stats["recovered"] == recovered
        mesh.stop(worker)
        worker = start_worker()
    assert worker.workers[0].stats.get("failed", 0) == 0   # never taken for a crash
    assert worker.store.worker_job("w1", uuid).state in ("pending", "running")  # type: ignore


def test_oversized_arguments_results_and_events_are_refused_clearly(
        setup: tuple[NfpNode, dict[str, NfpNode]]) -> None:
    c = setup[0].client
    over = nfp.MAX_CONTENT + 1
    with pytest.raises(ValueError, match="the job's arguments cannot be sent: it is"):
        c.post("svc", "echo", ["x" * over], target="any")
    for task, error in (("big", "the result cannot be sent: it is"),
                        ("shout", "the event cannot be sent: it is")):
        reply = c.run("svc", task, [over], target="any", timeout=10)
        (entry,) = reply.body["workers"].values()
        assert entry["state"] == "failed" and error in entry["errors"][0], entry
    assert c.run("svc", "echo", [1], target="all", timeout=5).status is Status.OK


def test_a_broker_answer_too_large_for_one_message_says_to_ask_each_worker(mesh: Mesh) -> None:
    # tens of MB through one hub take a while: timeouts that outlast it
    slow: dict[str, Any] = dict(keepalive=1.0, request_timeout=20.0,
                                timing=dict(interval=0.05, evasive=5.0, silent=6.0, expired=10.0))
    broker = mesh.add("broker", broker="always", **slow)
    for name in ("w1", "w2"):
        mesh.add(name, workers=(("svc", name),), **slow)
    client = mesh.add("client", **slow)
    ready_brokered(client, broker, "svc", 2)
    size = nfp.MAX_CONTENT * 3 // 5            # one result fits a message; two do not
    posted = client.client.post("svc", "big", [size], target="all")
    assert posted.status is Status.ACCEPTED
    uuid = posted.body["uuid"]
    for name in ("w1", "w2"):
        one = client.client.get(uuid, target=name, wait=20, timeout=30)
        assert one.status is Status.OK and len(one.body["workers"][name]["result"]) == size
    both = client.client.get(uuid, timeout=30)
    assert both.status is Status.ERROR and "ask its workers one at a time" in both.text


def test_delete_pending_running_finished(setup: tuple[NfpNode, dict[str, NfpNode]]) -> None:
    c = setup[0].client
    running = c.post("svc", "sleep", kwargs={"seconds": 5}, target="w1").body["uuid"]
    queued = c.post("svc", "sleep", kwargs={"seconds": 5}, target="w1").body["uuid"]
    wait_until(lambda: c.get(running).body["workers"]["w1"].get("state") == "running", 3)
    reply = c.delete(queued)
    assert reply.status is Status.OK
    assert reply.body["workers"]["w1"] == {"worker": "w1", "outcome": "cancelled",
                                           "was": "pending", "status": 200}
    reply = c.delete(running)
    assert reply.body["workers"]["w1"]["was"] == "running"
    result = c.get(running, wait=2)
    assert result.body["workers"]["w1"]["state"] == "cancelled"
    assert c.store.client_job(running).state == "cancelled"  # type: ignore[union-attr]
    reply = c.delete(running)                                  # finished: record removed
    assert reply.body["workers"]["w1"]["outcome"] == "deleted"
    assert c.get(running).status is Status.UNKNOWN
    assert c.delete(running).status is Status.UNKNOWN


def test_job_timeout(setup: tuple[NfpNode, dict[str, NfpNode]]) -> None:
    c = setup[0].client
    reply = c.run("svc", "sleep", kwargs={"seconds": 5}, target="w2", job_timeout=0.1,
                  timeout=5)
    entry = reply.body["workers"]["w2"]
    assert entry["state"] == "failed" and "timed out" in entry["errors"][0]


@pytest.mark.parametrize("brokered", [False, True])
def test_queued_until_the_first_worker_arrives(mesh: Mesh, brokered: bool) -> None:
    if brokered:
        broker = mesh.add("broker", broker="always")
    client = mesh.add("client")
    wait_until(lambda: client.settled.is_set(), 5)
    if brokered:
        wait_until(lambda: client.current_broker is not None, 5)
    result: dict[str, Any] = {}
    import gevent
    runner = gevent.spawn(lambda: result.setdefault(
        "reply", client.client.run("late", "echo", ["hi"], target="any", timeout=8)))
    if brokered:
        wait_until(lambda: broker.broker.dispatcher.queued() == {"late": 1}, 3,  # type: ignore
                   "POST queued at the broker")
    else:
        wait_until(lambda: client.client._direct.queued() == {"late": 1}, 3, "POST queued")
    mesh.add("latecomer", workers=(("late", "l1"),))
    runner.join(10)
    reply = result["reply"]
    assert reply.status is Status.OK and reply.body["workers"]["l1"]["result"]["args"] == ["hi"]


def test_queued_post_expires_with_408(mesh: Mesh) -> None:
    client = mesh.add("client", queue_timeout=0.3)
    wait_until(lambda: client.settled.is_set(), 5)
    reply = client.client.post("nobody", "echo", target="any")
    assert reply.status is Status.REQUEST_TIMEOUT and "nobody" in reply.body["error"]
    assert client.client.store.client_job(reply.body["uuid"]).state == "expired"  # type: ignore


def test_a_post_that_times_out_while_queued_is_not_sent_later(mesh: Mesh) -> None:
    client = mesh.add("client", queue_timeout=30)
    wait_until(lambda: client.settled.is_set(), 5)
    reply = client.client.post("late", "echo", ["lost?"], target="any", timeout=0.2)
    assert reply.status is Status.REQUEST_TIMEOUT and "not sent" in reply.text
    assert client.client._direct.queued() == {}
    worker = mesh.add("latecomer", workers=(("late", "l1"),))
    ready_direct(client, "late", 1)
    assert client.client.run("late", "echo", [1], target="any", timeout=5).status is Status.OK
    assert worker.store.worker_job("l1", reply.body["uuid"]) is None
    assert [j.state for j in worker.store.worker_jobs("l1")] == ["completed"]


def test_better_candidate_takes_over_and_everyone_moves(mesh: Mesh) -> None:
    """The partition-heal path: a serving broker meets a better one and steps down."""
    first = mesh.add("first", broker="auto", priority=1)
    worker = mesh.add("w1", workers=(("svc", "w1"),))
    client = mesh.add("client")
    changes: dict[str, list[BrokerChanged]] = {"first": [], "client": []}
    first.add_listener(changes["first"].append)
    client.add_listener(changes["client"].append)
    ready_brokered(client, first, "svc", 1)
    assert client.client.run("svc", "echo", [1], target="any", timeout=5).status is Status.OK
    posted = client.client.post("svc", "sleep", kwargs={"seconds": 0.4}, target="w1")
    better = mesh.add("better", broker="auto", priority=5)
    ready_brokered(client, better, "svc", 1)
    wait_until(lambda: not first.is_broker and better.is_broker, 5)
    assert any(c.stepped_down for c in changes["first"])
    assert changes["client"][-1].new is not None
    assert changes["client"][-1].new.uuid == better.node.uuid
    assert worker.workers[0].broker_endpoint == better.broker.endpoint  # type: ignore
    done = client.client.get(posted.body["uuid"], wait=3)       # accepted before: not lost
    assert done.status is Status.OK and done.body["workers"]["w1"]["result"] == "w1 slept"
    assert client.client.run("svc", "echo", [2], target="any", timeout=5).status is Status.OK
    assert better.broker.stats["requests"] >= 2                 # type: ignore[union-attr]
    mesh.stop(better)                 # leaves cleanly: the first broker serves again
    ready_brokered(client, first, "mmi.service.broker", 1)
    shown = client.client.run("mmi.service.broker", "show_broker", target="any", timeout=5)
    assert shown.body["workers"]["first.mmi"]["result"]["active"] is True


def test_hello_headers_and_an_older_candidate_without_the_neutral_header(mesh: Mesh) -> None:
    """NFP advertises its roles, the neutral candidacy and its broker's endpoint; a candidate
    of an older version (only X-PM-NFP-BROKER) is still elected and used."""
    old = mesh.add("old", broker="auto", priority=5, start=False)
    old.node._headers.pop(BROKER_HEADER)     # type: ignore[attr-defined]  # what it sent
    old.node.start()
    old.start()
    new = mesh.add("new", broker="auto", priority=1)
    mesh.add("w1", workers=(("svc", "w1"),))
    client = mesh.add("client")
    ready_brokered(client, old, "svc", 1)
    wait_until(lambda: new.current_broker is not None, 5, "the new candidate settled")
    assert new.current_broker is not None and new.current_broker.uuid == old.node.uuid
    assert old.is_broker and not new.is_broker
    assert client.current_broker.endpoint == old.broker.endpoint   # type: ignore
    assert client.client.run("svc", "echo", [1], target="any", timeout=5).status is Status.OK
    seen = client.node.peer_headers(new.node.uuid)
    assert roles_of(seen) == ["nfp-broker", "nfp-client"]
    assert json.loads(seen[BROKER_HEADER]) == {"mode": "auto", "priority": 1}
    assert json.loads(seen[NFP_BROKER_HEADER]) == {
        "mode": "auto", "priority": 1, "endpoint": new.broker.endpoint}   # type: ignore
    worker_headers = client.node.peer_headers(mesh.members[2][0].uuid)
    assert roles_of(worker_headers) == ["nfp-client", "nfp-worker"]
    assert BROKER_HEADER not in worker_headers and NFP_BROKER_HEADER not in worker_headers


def test_nfp_node_life_cycle_is_the_overlay_contract(mesh: Mesh) -> None:
    nfp_node = mesh.add("lc", workers=(("svc", "lc"),), start=False)
    assert nfp_node.lifecycle is Lifecycle.ATTACHED
    with pytest.raises(NodeStateError, match=r"start the node first"):
        nfp_node.start()
    nfp_node.node.start()
    with pytest.raises(NodeStateError, match="add workers after attaching NfpNode and before "
                                             r"node.start\(\)"):
        nfp_node.add_worker("late")
    nfp_node.start()
    assert nfp_node.running and all(w.running for w in nfp_node.workers)
    assert nfp_node.client.running
    with pytest.raises(NodeStateError, match="NfpNode is running: it starts once"):
        nfp_node.start()
    nfp_node.stop()
    assert nfp_node.lifecycle is Lifecycle.STOPPED
    assert not nfp_node.client.running and not any(w.running for w in nfp_node.workers)
    nfp_node.stop()                              # idempotent
    unattached = NfpNode(data_dir=mesh.data_dir)
    with pytest.raises(NodeStateError, match="add workers after attaching"):
        unattached.add_worker("svc")


def test_broker_services(mesh: Mesh, tmp_path: Path) -> None:
    files = tmp_path / "files"
    files.mkdir()
    (files / "r1.txt").write_text("hostname r1\n")
    (tmp_path / "secret").write_text("no")
    inventory = tmp_path / "inv"
    inventory.mkdir()
    (inventory / "w1.json").write_text(json.dumps({"hosts": ["r1"]}))
    broker = mesh.add("broker", broker="always", files_root=files, inventory_dir=inventory,
                      admin_token="t0k")
    mesh.add("w1", workers=(("svc", "w1"),), admin_token="wt")
    client = mesh.add("client")
    ready_brokered(client, broker, "svc", 1)
    c = client.client

    def call(service: str, task: str, **kwargs: Any) -> dict[str, Any]:
        reply = c.run(service, task, kwargs=kwargs, target="any", timeout=5)
        assert reply.status is Status.OK, reply
        (entry,) = reply.body["workers"].values()
        return entry
    workers = call("mmi.service.broker", "show_workers")["result"]
    assert {"w1", "broker.mmi", "broker.sid", "broker.fss"} <= {w["name"] for w in workers}
    assert "svc" in call("mmi.service.broker", "show_services")["result"]
    assert call("mmi.service.broker", "show_broker")["result"]["active"] is True
    assert any(cl["name"] == "client" for cl in call("mmi.service.broker", "show_clients")
               ["result"])
    refused = call("mmi.service.broker", "shutdown", token="wrong")
    assert refused["failed"] and "refused" in refused["errors"][0]
    assert broker.is_broker
    assert call("sid.service.broker", "get_inventory", name="w1")["result"] == {"hosts": ["r1"]}
    details = call("fss.service.broker", "file_details", url="nf://r1.txt")["result"]
    assert details["size"] == 12
    outside = call("fss.service.broker", "fetch_file", url="nf://../../etc/passwd")
    assert outside["failed"] and "outside the files root" in outside["errors"][0]
    from peermesh.nfp.commands import fetch_file
    dest = tmp_path / "out.txt"
    fetch_file(c, "nf://r1.txt", dest)
    assert dest.read_text() == "hostname r1\n"
    with pytest.raises(RuntimeError, match="outside"):
        fetch_file(c, "nf://../secret", tmp_path / "x")
    wm = c.run("mmi.service.worker", "show_workers", target="w1", timeout=5)
    assert wm.body["workers"]["w1"]["result"][0]["service"] == "svc"
    ok = c.run("mmi.service.worker", "disconnect", kwargs={"token": "wt"}, target="w1",
               timeout=5)
    assert ok.body["workers"]["w1"]["failed"] is False
    restart = call("mmi.service.broker", "restart", token="t0k")
    assert restart["failed"] is False
    wait_until(lambda: broker.broker.stats["elections_won"] == 2, 5,   # type: ignore
               "the broker restarted")
    ready_brokered(client, broker, "svc", 1)                   # workers registered again
    ready_brokered(client, broker, "mmi.service.broker", 1)    # so are the broker's services
    assert call("mmi.service.broker", "show_broker")["result"]["active"] is True
    assert c.run("svc", "echo", target="any", timeout=5).status is Status.OK


@pytest.mark.parametrize("brokered", [False, True])
def test_hostile_frames_are_dropped_without_harm(mesh: Mesh, brokered: bool) -> None:
    broker = mesh.add("broker", broker="always") if brokered else None
    worker = mesh.add("w1", workers=(("svc", "w1"),))
    client = mesh.add("client")
    if broker is not None:
        ready_brokered(client, broker, "svc", 1)
        target = broker.broker.endpoint                       # type: ignore[union-attr]
    else:
        wait_until(lambda: client.settled.is_set(), 5)
        ready_direct(client, "svc", 1)
        target = worker.workers[0].endpoint
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(target)
    job = nfp.encode_body({"task": "echo", "args": [], "kwargs": {}})
    garbage = [
        [b"hello"], [b"", b"NFPX01", b"\x04"], [b"", b"NFPC01", b"\x04", b"svc"],
        [b"", b"NFPC01", b"\xff", b"svc", b"all", b"u", b""],
        [b"", b"NFPC01", b"\x04", b"svc", b"all", b"", job],            # empty UUID
        [b"", b"NFPC01", b"\x04", b"\xff\xfe", b"all", b"u", job],       # service not UTF-8
        [b"", b"NFPC01", b"\x04", b"svc", b"all", b"u", b"{not json"],  # bad body: answered 500
        [b"", b"NFPW01", b"\x05", b"svc", b"u", b"200", b"{}"],           # RESPONSE nobody asked
        [b"", b"NFPW01", b"\x01", b"svc"],                                # READY before OPEN
        [b"", b"NFPB01", b"\x02", b"svc"],                                # broker talk to a broker
        [b"", b"NFPC01", b"\x04", b"svc", b"all", b"u" * 5000, job, b"x" * 100_000],
    ]
    import gevent
    results = []

    def traffic() -> None:
        for i in range(20):
            results.append(client.client.run("svc", "echo", [i], target="any", timeout=5))

    runner = gevent.spawn(traffic)
    for _ in range(5):
        for frames in garbage:
            raw.send_multipart(frames)
        gevent.sleep(0.005)
    runner.join(20)
    raw.close()
    assert len(results) == 20 and all(r.status is Status.OK for r in results)
    if broker is not None:
        assert broker.broker.stats["dropped"] >= 5             # type: ignore[union-attr]
    assert client.client.run("svc", "echo", ["after"], target="any",
                             timeout=5).status is Status.OK


def test_endpoints_peers_advertise_outside_the_nodes_network_are_never_dialled(
        mesh: Mesh) -> None:
    """A peer advertising a worker and a broker off the node's network (lo: 127.0.0.0/8)
    is not connected to and each refusal is counted; workers on loopback still serve."""
    liar = Node("liar", interface="lo", port=mesh.port, headers={
        WORKER_HEADER: json.dumps([{"service": "svc", "name": "evil",
                                    "endpoint": "tcp://10.1.2.3:5"}]),
        NFP_BROKER_HEADER: json.dumps({"mode": "never", "priority": 0,
                                       "endpoint": "tcp://10.1.2.3:6"})}, **TIMING)
    liar.start()
    try:
        mesh.add("w1", workers=(("svc", "w1"),))
        client = mesh.add("client")
        ready_direct(client, "svc", 1)
        wait_until(lambda: client.limits.get("peer_networks") == 2, 5,
                   "both endpoints of the liar refused")
        assert client.client.direct_workers() == {"svc": ["w1"]}
        assert "evil" not in client.client._workers.links   # no DEALER was made for it
        assert client.client.run("svc", "echo", [1], target="any", timeout=5).status \
            is Status.OK
    finally:
        liar.stop()


def test_peer_networks_are_checked_and_can_narrow(mesh: Mesh) -> None:
    with pytest.raises(ValueError, match="not a network"):
        NfpNode(peer_networks=["10.0.0.0/33"])
    mesh.add("w1", workers=(("svc", "w1"),))
    client = mesh.add("client", peer_networks=["10.0.0.0/8"])
    wait_until(lambda: client.limits.get("peer_networks") == 1, 5, "the worker refused")
    assert client.client.direct_workers() == {}
