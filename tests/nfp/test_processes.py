"""NFP across processes on loopback: jobs, SIGKILL of a worker and of the broker.

Children are ``nfpchild.py`` processes (killed in the fixture's finaliser);
the client runs in this process. Tasks append one line per execution to
``runs-<worker>.log`` in the shared data directory, so a test can tell how
often a job ran, across restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gevent

from peermesh.nfp import NfpNode
from peermesh.wire.nfp import Status

from .conftest import Child, Mesh, runs, wait_until


def client_of(mesh: Mesh, **kw: Any) -> NfpNode:
    client = mesh.add("client", **kw)
    wait_until(lambda: client.settled.is_set(), 5)
    return client


def test_brokerless_jobs_across_processes(mesh: Mesh, children: Callable[..., Child],
                                          tmp_path: Path) -> None:
    children("pw1", workers=[["svc", "pw1"]])
    children("pw2", workers=[["svc", "pw2"]])
    client = client_of(mesh)
    wait_until(lambda: len(client.client.direct_workers().get("svc", [])) == 2, 5)
    reply = client.client.run("svc", "echo", [1, 2], target="all", timeout=5)
    assert reply.status is Status.OK
    pids = {w["result"]["pid"] for w in reply.body["workers"].values()}
    assert len(pids) == 2
    reply = client.client.run("svc", "echo", target="pw2", timeout=5)
    assert list(reply.body["workers"]) == ["pw2"]
    assert [what for _, what in runs(tmp_path, "pw1")] == ["echo"]


def test_worker_sigkill_and_restart_keeps_jobs(mesh: Mesh, children: Callable[..., Child],
                                               tmp_path: Path) -> None:
    worker = children("kw1", workers=[["svc", "kw1"]])
    client = client_of(mesh)
    c = client.client
    wait_until(lambda: c.direct_workers().get("svc"), 5)
    finished = c.run("svc", "echo", ["before"], target="kw1", timeout=5)
    assert finished.status is Status.OK
    done_uuid = finished.body["uuid"]
    running = c.post("svc", "sleep", kwargs={"seconds": 0.5}, target="kw1")
    queued = c.post("svc", "echo", ["queued"], target="kw1")
    assert running.status is Status.ACCEPTED and queued.status is Status.ACCEPTED
    wait_until(lambda: ("sleep-start" in [w for _, w in runs(tmp_path, "kw1")]), 5, "job running")
    worker.kill9()                                     # mid-job, with a job queued behind it
    old_endpoint = worker.ready["workers"]["kw1"]
    children("kw1", workers=[["svc", "kw1"]])          # same name, same data dir
    wait_until(lambda: c._direct.workers.get("kw1") is not None
               and c._direct.workers["kw1"].info["endpoint"] != old_endpoint, 5,
               "the restarted worker")
    again = c.get(done_uuid)                           # finished before the crash
    assert again.status is Status.OK
    assert again.body["workers"]["kw1"]["result"]["args"] == ["before"]
    result = c.get(running.body["uuid"], wait=5)       # accepted, interrupted, run again
    assert result.status is Status.OK
    assert result.body["workers"]["kw1"]["result"] == "kw1 slept 0.5"
    result = c.get(queued.body["uuid"], wait=5)        # accepted, never started: run now
    assert result.status is Status.OK
    log = runs(tmp_path, "kw1")
    count = {uuid: sum(1 for u, _ in log if u == uuid) for uuid, _ in log}
    assert count[done_uuid] == 1                       # finished jobs never run again
    assert count[queued.body["uuid"]] == 1
    assert [w for u, w in log if u == running.body["uuid"]].count("sleep-start") == 2


def test_broker_sigkill_reelection_loses_no_accepted_job(
        mesh: Mesh, children: Callable[..., Child], tmp_path: Path) -> None:
    first = children("b1", broker="auto", priority=10)
    children("b2", broker="auto", priority=5)
    children("bw1", workers=[["svc", "bw1"]])
    client = client_of(mesh)
    c = client.client
    wait_until(lambda: client.current_broker is not None and client.current_broker.name == "b1",
               5, "b1 elected")
    wait_until(lambda: c.run("svc", "echo", ["warm"], target="any", timeout=2).status
               is Status.OK, 5, "b1 serving")
    accepted = [c.post("svc", "sleep", kwargs={"seconds": 0.3}, target="any") for _ in range(2)]
    assert all(p.status is Status.ACCEPTED for p in accepted)
    results: list[Any] = []

    def traffic() -> None:      # jobs keep flowing while the broker dies
        for i in range(15):
            results.append(c.run("svc", "echo", [i], target="any", timeout=8))

    runner = gevent.spawn(traffic)
    wait_until(lambda: len(results) >= 3, 5)
    first.kill9()
    runner.join(20)
    assert client.current_broker is not None and client.current_broker.name == "b2"
    assert len(results) == 15 and all(r.status is Status.OK for r in results), \
        [(r.status, r.body) for r in results if r.status is not Status.OK]
    for posted in accepted:
        done = c.get(posted.body["uuid"], wait=3)
        assert done.status is Status.OK, done.body
    log = runs(tmp_path, "bw1")
    per_job: dict[str, int] = {}
    for uuid, what in log:
        if what in ("echo", "sleep-start"):
            per_job[uuid] = per_job.get(uuid, 0) + 1
    assert per_job and max(per_job.values()) == 1     # the worker never died: nothing twice
    assert all(r.body["uuid"] in per_job for r in results)


def test_broker_redispatches_when_a_worker_dies_mid_job(
        mesh: Mesh, children: Callable[..., Child], tmp_path: Path) -> None:
    children("rb", broker="always")
    w1 = children("rw1", workers=[["svc", "rw1"]])
    w2 = children("rw2", workers=[["svc", "rw2"]])
    client = client_of(mesh)
    c = client.client
    wait_until(lambda: client.current_broker is not None, 5)
    wait_until(lambda: c.run("mmi.service.broker", "show_services", target="any", timeout=2)
               .body.get("workers", {}).get("rb.mmi", {}).get("result", {}).get("svc", {})
               .get("workers") == ["rw1", "rw2"], 5, "both workers registered")
    result: dict[str, Any] = {}
    runner = gevent.spawn(lambda: result.setdefault("reply", c.run(
        "svc", "sleep", kwargs={"seconds": 0.4}, target="any", timeout=10)))
    victim = wait_until(lambda: next((w for w, name in ((w1, "rw1"), (w2, "rw2"))
                                      if runs(tmp_path, name)), None), 5, "job started")
    victim.kill9()
    runner.join(12)
    reply = result["reply"]
    assert reply.status is Status.OK, reply.body
    (survivor,) = reply.body["workers"]
    assert survivor != victim.name and reply.body["workers"][survivor]["state"] == "completed"
