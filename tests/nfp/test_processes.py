"""NFP across processes on loopback: jobs, SIGKILL of a worker and of the broker.

Children are ``nfpchild.py`` processes (killed in the fixture's finaliser);
the client runs in this process. Tasks append one line per execution to
``runs-<worker>.log`` in the shared data directory, so a test can tell how
often a job ran, across restarts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import gevent
import gevent.event

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


def test_a_job_that_ends_its_worker_process_runs_twice_at_most(
        mesh: Mesh, children: Callable[..., Child], tmp_path: Path) -> None:
    c = client_of(mesh).client
    trigger = tmp_path / "die-now"

    def run_until_it_dies(worker: Child, uuid: str, starts: int) -> None:
        wait_until(lambda: [w for u, w in runs(tmp_path, "dw1") if u == uuid].count("die-start")
                   == starts, 10, f"run {starts} of the job")
        trigger.touch()
        wait_until(lambda: worker.proc.poll() is not None, 10, "the worker's process ended")
        assert worker.proc.returncode == 7
        trigger.unlink()

    worker = children("dw1", workers=[["svc", "dw1"]])
    wait_until(lambda: c.direct_workers().get("svc"), 5)
    posted = c.post("svc", "die", kwargs={"path": str(trigger)}, target="dw1")
    assert posted.status is Status.ACCEPTED
    uuid = posted.body["uuid"]
    run_until_it_dies(worker, uuid, 1)
    run_until_it_dies(children("dw1", workers=[["svc", "dw1"]]), uuid, 2)  # run again once
    third = children("dw1", workers=[["svc", "dw1"]])                        # ... not twice
    wait_until(lambda: c._direct.workers.get("dw1") is not None
               and c._direct.workers["dw1"].info["endpoint"] == third.ready["workers"]["dw1"],
               5, "the third worker process")
    reply = c.get(uuid, wait=5)
    entry = reply.body["workers"]["dw1"]
    assert entry["state"] == "failed" and "ended twice while this job ran" in entry["errors"][0]
    assert c.run("svc", "echo", ["alive"], target="dw1", timeout=5).status is Status.OK
    assert third.proc.poll() is None
    assert [w for u, w in runs(tmp_path, "dw1") if u == uuid].count("die-start") == 2


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
    killed = gevent.event.Event()
    after_kill: list[Any] = []

    def traffic() -> None:      # jobs keep flowing while the broker dies, and 10 after
        for i in range(1000):
            results.append(c.run("svc", "echo", [i], target="any", timeout=8))
            if killed.is_set():
                after_kill.append(results[-1])
                if len(after_kill) == 10:
                    return

    runner = gevent.spawn(traffic)
    wait_until(lambda: len(results) >= 3, 5)
    first.kill9()
    killed.set()
    runner.join(30)
    wait_until(lambda: client.current_broker is not None and client.current_broker.name == "b2",
               10, "b2 elected")
    assert len(after_kill) == 10 and all(r.status is Status.OK for r in results), \
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


def broker_mmi(c: Any, task: str) -> Any:
    """The result of ``task`` (``show_broker``, ...) at the current broker (None: no answer)."""
    reply = c.run("mmi.service.broker", task, target="any", timeout=2)
    return next(iter(reply.body.get("workers", {}).values()), {}).get("result")


def broker_state(c: Any) -> dict[str, Any]:
    """``show_broker`` of the current broker (empty if it did not answer)."""
    return broker_mmi(c, "show_broker") or {}


def inflight_at_broker(c: Any, worker: str) -> int:
    """Jobs the current broker knows ``worker`` is running (-1: not registered there)."""
    found = [w for w in broker_mmi(c, "show_workers") or [] if w["name"] == worker]
    return found[0]["inflight"] if found else -1


def started(tmp_path: Path, worker: str, uuid: Optional[str] = None) -> list[str]:
    """Job UUIDs whose ``hold`` task started on ``worker``."""
    return [u for u, what in runs(tmp_path, worker)
            if what == "hold-start" and (uuid is None or u == uuid)]


def test_named_and_all_jobs_report_a_dead_worker_until_it_returns(
        mesh: Mesh, children: Callable[..., Child], tmp_path: Path) -> None:
    children("ob", broker="always")
    w1 = children("ow1", workers=[["svc", "ow1"]])
    children("ow2", workers=[["svc", "ow2"]])
    client = client_of(mesh)
    c = client.client
    wait_until(lambda: broker_state(c).get("services") == ["fss.service.broker",
                                                           "mmi.service.broker",
                                                           "sid.service.broker", "svc"]
               and broker_state(c).get("workers") == 5, 5, "both workers registered")
    gate = tmp_path / "gate"
    result: dict[str, Any] = {}
    runner = gevent.spawn(lambda: result.setdefault("reply", c.run(
        "svc", "hold", [str(gate)], target="all", timeout=15)))
    wait_until(lambda: started(tmp_path, "ow1") and started(tmp_path, "ow2"), 5, "job running")
    w1.kill9()                                          # mid-job: ow1 cannot be replaced
    wait_until(lambda: broker_state(c).get("workers") == 4, 5, "ow1 declared dead")
    gate.touch()
    runner.join(15)
    reply = result["reply"]
    uuid = reply.body["uuid"]
    assert reply.status is Status.OK                    # ow2 finished
    dead, alive = reply.body["workers"]["ow1"], reply.body["workers"]["ow2"]
    assert alive["status"] == 200 and alive["result"] == "ow2 held"
    assert dead["status"] == 408 and dead["state"] == "orphaned"
    assert "went away before finishing" in dead["errors"][0]
    assert started(tmp_path, "ow2", uuid) and not started(tmp_path, "ow2", uuid)[1:]
    away = c.get(uuid, target="ow1")                    # still away: the same reason
    assert away.status is Status.REQUEST_TIMEOUT
    assert "went away before finishing" in away.body["workers"]["ow1"]["error"]
    children("ow1", workers=[["svc", "ow1"]])           # the same worker comes back
    back = wait_until(lambda: (lambda r: r if r.status is not Status.REQUEST_TIMEOUT else None)(
        c.get(uuid, target="ow1", wait=5)), 10, "ow1 back")
    assert back.status is Status.OK and back.body["workers"]["ow1"]["result"] == "ow1 held"
    assert len(started(tmp_path, "ow1", uuid)) == 2     # it died mid-job: run again once


def test_a_job_in_flight_when_the_broker_dies_still_completes(
        mesh: Mesh, children: Callable[..., Child], tmp_path: Path) -> None:
    """Broker kill -9, re-election, then the job's worker dies too: the new broker,
    which learnt the job from the client's re-POST, re-dispatches it."""
    first = children("fb1", broker="auto", priority=10)
    children("fb2", broker="auto", priority=5)
    workers = {name: children(name, workers=[["svc", name]]) for name in ("fw1", "fw2")}
    client = client_of(mesh)
    c = client.client
    wait_until(lambda: client.current_broker is not None and client.current_broker.name == "fb1"
               and broker_state(c).get("workers") == 5, 5, "fb1 serving both workers")
    gate = tmp_path / "gate"
    result: dict[str, Any] = {}
    runner = gevent.spawn(lambda: result.setdefault("reply", c.run(
        "svc", "hold", [str(gate)], target="any", timeout=20)))
    holder = wait_until(lambda: next((n for n in workers if started(tmp_path, n)), None), 5,
                        "job running")
    first.kill9()
    wait_until(lambda: client.current_broker is not None
               and client.current_broker.name == "fb2"
               and inflight_at_broker(c, holder) == 1, 10, "fb2 knows the job in flight")
    workers[holder].kill9()                             # the job's worker dies as well
    survivor = next(n for n in workers if n != holder)
    wait_until(lambda: started(tmp_path, survivor), 5, "job re-dispatched")
    gate.touch()
    runner.join(15)
    reply = result["reply"]
    assert reply.status is Status.OK, reply.body
    assert list(reply.body["workers"]) == [survivor]
    assert reply.body["workers"][survivor]["result"] == f"{survivor} held"
    assert len(started(tmp_path, survivor)) == 1
