"""The durability rule: a worker acknowledges nothing that is not committed.

A 202 leaves only once the accepted job is in the store's file, a result
(final EVENT, 200) only once it is; a job that finishes before the hub is
idle is accepted and finished in one commit, and its 202 carries the result.
Checked from a second SQLite connection (what a restarted worker would read)
at the moment each message is handed to the socket.
"""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import gevent
import gevent.event
import pytest

from peermesh import Node
from peermesh.nfp.store import JobStore
from peermesh.nfp.session import BROKER_LINK
from peermesh.nfp.worker import FINAL_IN_ACCEPT, Tasks, Worker
from peermesh.wire import nfp


class Recorder:
    """Stands in for the worker's link to its broker; notes what the file held at each send."""

    closed = False

    def __init__(self, path: Path) -> None:
        self.other = sqlite3.connect(str(path))
        self.sent: list[tuple[Any, list[tuple[str, str]]]] = []
        self.one_more = gevent.event.Event()

    def try_send(self, frames: list[bytes]) -> bool:
        rows = self.other.execute("SELECT uuid, state FROM worker_jobs ORDER BY uuid").fetchall()
        self.sent.append((nfp.decode(frames), rows))
        self.one_more.set()
        return True

    def readable(self) -> bool:
        return False    # nothing waits to be read: the worker may commit at once

    def wait_writable(self, timeout: Optional[float] = None) -> bool:
        return True

    def wait_for(self, count: int, timeout: float = 5.0) -> None:
        """Until ``count`` messages were sent (the worker runs on this hub meanwhile)."""
        with gevent.Timeout(timeout, AssertionError(f"{count} message(s) not sent in time")):
            while len(self.sent) < count:
                self.one_more.clear()
                self.one_more.wait()

    def close(self, linger: float = 0.0) -> None:
        self.closed = True
        self.other.close()


@contextmanager
def recorded_worker(tmp_path: Path, tasks: Tasks,
                    port: int) -> Iterator[tuple[Worker, JobStore, Recorder]]:
    """A started worker (on a node alone on loopback) whose broker link is a ``Recorder``."""
    path = tmp_path / "w.sqlite3"
    store = JobStore(path)
    node = Node("w1", interface="lo", port=port)
    worker = Worker("svc", "w1", tasks, store, internal=True)
    worker.attach(node)
    node.start()
    worker.start()
    recorder = Recorder(path)
    assert worker._driver is not None
    worker._driver.links[BROKER_LINK] = recorder   # type: ignore[assignment]
    worker._session.linked, worker._session.state = True, "ready"
    try:
        yield worker, store, recorder
    finally:
        worker.stop()
        node.stop(0)
        recorder.close()
        store.close()


def post(worker: Worker, uuid: str, task: str, notify: bool) -> None:
    body = nfp.encode_body({"task": task, "args": [], "kwargs": {}, "notify": notify,
                            "rid": uuid})
    frames = nfp.encode(nfp.Post(nfp.BROKER, "svc", "w1", uuid, (body,)))
    assert worker._driver is not None
    worker._driver.apply(worker._session.receive(BROKER_LINK, frames, worker._clock()))


def test_acknowledgements_follow_the_commit(tmp_path: Path, free_udp_port: int) -> None:
    tasks = Tasks()
    tasks.add("quick", lambda job: "done")
    tasks.add("slow", lambda job: gevent.sleep(0.05) or "slept")
    with recorded_worker(tmp_path, tasks, free_udp_port) as (worker, store, recorder):
        # a quick job with notify: nothing leaves before the one commit, then the 202
        # carrying the result (no final EVENT)
        post(worker, "a" * 32, "quick", notify=True)
        assert recorder.sent == [] and store.pending
        recorder.wait_for(1)
        (accepted, rows), = recorder.sent
        assert isinstance(accepted, nfp.Response) and accepted.status is nfp.Status.ACCEPTED
        assert nfp.decode_body(accepted.body[0]) == {
            "worker": "w1", "load": 0, "state": "completed", "rid": "a" * 32, "result": "done",
            "failed": False, "errors": [], "duration": pytest.approx(0, abs=1)}
        assert rows == [("a" * 32, "completed")] and store.commits == 1
        # a slow job without notify: its 202 leaves (committed) before the task ends
        recorder.sent.clear()
        post(worker, "b" * 32, "slow", notify=False)
        recorder.wait_for(1)
        accepted, rows = recorder.sent[0]
        assert isinstance(accepted, nfp.Response) and accepted.status is nfp.Status.ACCEPTED
        assert ("b" * 32, "pending") in rows
        recorder.wait_for(2)
        final, rows = recorder.sent[1]
        assert isinstance(final, nfp.EventCommand) and ("b" * 32, "completed") in rows


def test_a_result_too_big_for_the_202_follows_in_the_final_event(tmp_path: Path,
                                                                  free_udp_port: int) -> None:
    tasks = Tasks()
    tasks.add("big", lambda job: "x" * (FINAL_IN_ACCEPT + 1))
    with recorded_worker(tmp_path, tasks, free_udp_port) as (worker, store, recorder):
        post(worker, "c" * 32, "big", notify=True)
        recorder.wait_for(2)
        (accepted, _), (final, rows) = recorder.sent
        assert isinstance(accepted, nfp.Response) and accepted.status is nfp.Status.ACCEPTED
        assert nfp.decode_body(accepted.body[0])["state"] == "pending"
        assert isinstance(final, nfp.EventCommand)
        body = nfp.decode_body(final.body[0])
        assert body["state"] == "completed" and len(body["result"]) == FINAL_IN_ACCEPT + 1
        assert rows == [("c" * 32, "completed")] and store.commits == 1
