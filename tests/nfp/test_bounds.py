"""What a remote NFP sender can grow, bounded: target names, clients remembered, stored bytes.

Bounded versions of the floods (fewer inputs, the limits lowered where the
test must pass them), against a real worker on 127.0.0.1 with a real SQLite
store; clients are bare DEALER sockets.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import zmq.green as zmq

from peermesh.errors import ProtocolError
from peermesh.nfp.store import JobStore
from peermesh.nfp.worker import MAX_CLIENTS, MAX_STORED, Worker
from peermesh.overlay import Lifecycle
from peermesh.wire import nfp

from .conftest import make_tasks

WAIT_MS = 5000


def post(target: str = "all", body: bytes = b'{"task":"echo","args":[],"kwargs":{}}',
         job: str = "") -> list[bytes]:
    return nfp.request_frames(nfp.Command.POST, nfp.CLIENT, "svc", target,
                              job or str(uuid.uuid4()), (body,))


# --------------------------------------------------------------------------
# Target names


def test_targets_over_the_limit_are_refused_both_ways() -> None:
    long_target = "w" * (nfp.MAX_TARGET + 1)
    frames = post()
    frames[4] = long_target.encode()
    with pytest.raises(ProtocolError, match="MAX_TARGET"):
        nfp.decode(frames)
    with pytest.raises(ValueError, match="MAX_TARGET"):
        post(long_target)
    frames[4] = b"w" * nfp.MAX_TARGET
    assert nfp.decode(frames).target == "w" * nfp.MAX_TARGET


def test_long_target_names_are_not_cached() -> None:
    """Each distinct long target once cached its text and frame (200 x 2 MB: 867 MB)."""
    before = len(nfp._TARGETS)
    for n in range(200):
        name = f"{n:04d}" + "x" * 2000
        assert nfp.decode(post(name)).target == name
        post(name + "y")
    assert len(nfp._TARGETS) == before
    assert nfp.decode(post("w-short")).target == "w-short"
    assert "w-short" in nfp._TARGETS


# --------------------------------------------------------------------------
# A live worker


@pytest.fixture
def worker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Worker]:
    settings = getattr(request, "param", {})
    store = JobStore(tmp_path / "jobs.db")
    worker = Worker("svc", "w1", make_tasks(), store, address="127.0.0.1", **settings)
    worker.lifecycle = Lifecycle.ATTACHED
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        store.close()


def _client(identity: bytes, endpoint: str) -> Any:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.connect(endpoint)
    return sock


def _answer(sock: Any) -> dict[str, Any]:
    """The next RESPONSE (EVENTs about finished jobs are skipped)."""
    while True:
        assert sock.poll(WAIT_MS), "no answer from the worker"
        msg = nfp.decode(sock.recv_multipart())
        if isinstance(msg, nfp.Response):
            return {"status": int(msg.status), **json.loads(msg.body[0])}


@pytest.mark.parametrize("worker", [{"max_clients": 16}], indirect=True)
def test_direct_clients_remembered_are_bounded(worker: Worker,
                                               caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="peermesh.nfp.worker"):
        for n in range(40):
            sock = _client(b"client-%d" % n, worker.endpoint)
            try:
                sock.send_multipart(nfp.request_frames(
                    nfp.Command.GET, nfp.CLIENT, "svc", "any", str(uuid.uuid4()), (b"{}",)))
                assert _answer(sock)["status"] == 400
            finally:
                sock.close()
    assert worker.clients_info()["direct_clients"] == 16
    assert list(worker._door.clients)[0] == b"client-24"
    assert worker.limits.get("max_clients") == 24
    assert worker.info()["limits"] == {"max_clients": 24}     # what MMI show_workers reports
    assert len([r for r in caplog.records if "max_clients" in r.getMessage()]) == 1


@pytest.mark.parametrize("worker", [{"max_stored": 10_000}], indirect=True)
def test_stored_post_bodies_are_bounded(worker: Worker,
                                        caplog: pytest.LogCaptureFixture) -> None:
    body = json.dumps({"task": "echo", "args": ["x" * 3000], "kwargs": {}}).encode()
    sock = _client(b"filler", worker.endpoint)
    try:
        with caplog.at_level(logging.WARNING, logger="peermesh.nfp.worker"):
            answers = []
            jobs = [str(uuid.uuid4()) for _ in range(6)]
            for job in jobs:
                sock.send_multipart(post(body=body, job=job))
                answers.append(_answer(sock))
        assert [a["status"] for a in answers] == [202, 202, 202, 500, 500, 500]
        assert "max_stored" in answers[3]["error"]
        assert worker.limits.get("max_stored") == 3
        assert len([r for r in caplog.records if "max_stored" in r.getMessage()]) == 1
        assert worker.store.worker_bytes("w1") == 3 * len(body)
        sock.send_multipart(post(body=body, job=jobs[0]))   # posted again: still known
        again = _answer(sock)
        assert again["status"] == 202 and again["duplicate"]
    finally:
        sock.close()


def test_a_worker_drops_requests_with_oversized_targets_and_counts_them(
        worker: Worker, caplog: pytest.LogCaptureFixture) -> None:
    sock = _client(b"long-targets", worker.endpoint)
    try:
        with caplog.at_level(logging.WARNING, logger="peermesh.nfp.worker"):
            for _ in range(3):
                frames = post()
                frames[4] = b"w" * (nfp.MAX_TARGET + 1)
                sock.send_multipart(frames)
            sock.send_multipart(post(target="w1"))      # still served, and answered first
            assert _answer(sock)["status"] == 202
        assert worker.limits.get("max_target") == 3
        assert len([r for r in caplog.records if "max_target" in r.getMessage()]) == 1
        assert worker.stats["accepted"] == 1
    finally:
        sock.close()


def test_worker_defaults_and_checks(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    try:
        worker = Worker("svc", "w1", make_tasks(), store, address="127.0.0.1")
        assert (worker.max_clients, worker.max_stored) == (MAX_CLIENTS, MAX_STORED)
        worker._mailbox.close()
        with pytest.raises(ValueError):
            Worker("svc", "w2", make_tasks(), store, address="127.0.0.1", max_clients=0)
    finally:
        store.close()
