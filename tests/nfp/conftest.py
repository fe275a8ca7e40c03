"""Fixtures for the NFP tests: in-process meshes on loopback, child processes.

Every node uses interface ``lo`` and a free, non-default UDP beacon port;
timings are short (beacons every 50 ms, peers expire after 0.6 s, NFP
keepalive 0.1 s) so elections and failovers happen within a second. Waits
are bounded polls of a condition, never fixed sleeps.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import gevent
# gevent's Popen: once any test of the run used gevent.subprocess, gevent's SIGCHLD watcher
# reaps every child first, and a standard Popen then reads a dead child's exit code as 0
from gevent import subprocess

import childprocs
import waiting
import pytest

from peermesh import Node
from peermesh.nfp import NfpNode, Tasks

HERE = Path(__file__).resolve().parent
TIMING = dict(interval=0.05, evasive=0.3, silent=0.4, expired=0.6)
NFP_TIMING = dict(keepalive=0.1, multiplier=3, request_timeout=2.0, queue_timeout=3.0)


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "") -> Any:
    """Poll ``predicate`` (cooperatively) until it is truthy; fail after ``timeout``."""
    return waiting.poll_until(predicate, timeout, what, sleep=gevent.sleep, step=0.01)


def make_tasks() -> Tasks:
    """Tasks used by in-process workers."""
    tasks = Tasks()

    @tasks.task()
    def echo(job: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"args": list(args), "kwargs": kwargs, "worker": job.worker}

    @tasks.task()
    def sleep(job: Any, seconds: float = 1.0) -> str:
        job.event("sleeping", seconds=seconds)
        gevent.sleep(float(seconds))
        return f"{job.worker} slept"

    @tasks.task()
    def fail(job: Any) -> None:
        raise RuntimeError("boom")

    @tasks.task()
    def unencodable(job: Any) -> object:
        return object()

    @tasks.task()
    def quits(job: Any, how: str) -> None:
        if how == "exit":
            sys.exit(3)
        if how == "interrupt":
            raise KeyboardInterrupt
        with gevent.Timeout(0.01):     # a timeout of its own, not caught
            gevent.sleep(1)

    @tasks.task()
    def big(job: Any, size: int) -> str:
        return "x" * size

    @tasks.task()
    def shout(job: Any, size: int) -> str:
        job.event("x" * size)
        return "shouted"

    return tasks


class Mesh:
    """In-process nodes (one gevent hub) that share a beacon port; all stopped at the end."""

    def __init__(self, port: int, data_dir: Path) -> None:
        self.port = port
        self.data_dir = data_dir
        self.members: list[tuple[Node, NfpNode]] = []

    def add(self, name: str, *, workers: tuple[tuple[str, str], ...] = (),
            tasks: Optional[Tasks] = None, start: bool = True,
            timing: Optional[dict[str, float]] = None, **nfp_kw: Any) -> NfpNode:
        node = Node(name, interface="lo", port=self.port, **(timing or TIMING))
        kw = {**NFP_TIMING, **nfp_kw}
        nfp = NfpNode(node, data_dir=self.data_dir, **kw)
        for service, worker_name in workers:
            nfp.add_worker(service, worker_name, tasks or make_tasks())
        self.members.append((node, nfp))
        if start:
            node.start()
            nfp.start()
        return nfp

    def stop(self, nfp: NfpNode) -> None:
        """Stop one member (clean leave: peers see EXIT at once)."""
        for pair in list(self.members):
            if pair[1] is nfp:
                self.members.remove(pair)
                pair[1].stop()
                pair[0].stop()

    def close(self) -> None:
        for node, nfp in reversed(self.members):
            try:
                nfp.stop()
            finally:
                node.stop()
        self.members.clear()


@pytest.fixture
def mesh(free_udp_port: int, tmp_path: Path) -> Iterator[Mesh]:
    """A fresh in-process mesh on loopback; every member stopped afterwards."""
    m = Mesh(free_udp_port, tmp_path)
    try:
        yield m
    finally:
        m.close()


class Child(childprocs.JsonChild):
    """One ``nfpchild.py`` process."""


@pytest.fixture
def children(free_udp_port: int, tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """``children(name, workers=[(service, name)], broker=..., ...)`` starts an nfpchild."""
    def make(name: str, **cfg: Any) -> Child:
        config = {"name": name, "port": free_udp_port, "data_dir": str(tmp_path), **TIMING,
                  "keepalive": 0.1, **cfg}
        return Child(subprocess.Popen([sys.executable, str(HERE / "nfpchild.py"),
                                       json.dumps(config)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, cwd=str(HERE)), name)

    yield from childprocs.ready_children(make)


def runs(data_dir: Path, worker: str) -> list[tuple[str, str]]:
    """(job UUID, what) for every task execution ``worker`` recorded."""
    path = data_dir / f"runs-{worker}.log"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [tuple(line.split()[:2]) for line in lines if line]  # type: ignore[misc]
