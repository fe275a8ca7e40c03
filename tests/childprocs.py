"""Child processes of the tests: how one is stopped, and a child that prints JSON lines.

``stop`` is the one way a child ends: its stdin closed (the children end on
EOF), a bounded wait, then SIGKILL; ``terminate`` does the same with SIGTERM
first, ``kill9`` kills at once, ``alive`` tells whether a process is still
there, ``in_session`` and ``in_group`` which processes of a session or a
process group are. ``JsonChild``
reads what a child prints, one JSON object a line, on the gevent hub
(``waiting.read_json_lines``) and waits for its ``ready`` line with a
bounded poll; ``ready_children`` is the body of a fixture that
starts such children and closes them all. The ``peermesh`` command itself
runs under ``cliprocess``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, Optional, TypeVar

import gevent
import pytest

import waiting


def stop(proc: Any, timeout: float = 3.0) -> None:
    """End ``proc`` (a ``subprocess`` or ``gevent.subprocess`` Popen): close its stdin,
    wait up to ``timeout`` seconds, then SIGKILL it."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def terminate(proc: Any, timeout: float = 10.0) -> None:
    """SIGTERM ``proc``, wait up to ``timeout`` seconds, then SIGKILL it."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def in_session(session: int) -> list[int]:
    """The processes of ``session`` (a child started with ``start_new_session``: its pid)
    that are not zombies, whatever process group they are in."""
    return _running_with(3, session)


def in_group(group: int) -> list[int]:
    """The processes of process group ``group`` that are not zombies."""
    return _running_with(2, group)


def _running_with(field: int, value: int) -> list[int]:
    """Processes whose ``stat`` field ``field`` (counted after the command: 2 the process
    group, 3 the session) is ``value``, zombies left out."""
    members = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue
        if int(fields[field]) == value and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def kill9(proc: Any) -> None:
    """SIGKILL ``proc`` (no clean-up of any kind) and reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)


class JsonChild:
    """A child process that prints JSON lines (``lines``, in order) and one ``ready`` line
    once it is up."""

    #: how long ``wait_ready`` waits by default (seconds)
    ready_timeout = 15.0

    def __init__(self, proc: Any, name: str) -> None:
        self.proc = proc
        self.name = name
        self.lines: list[dict[str, Any]] = []
        self.ready: dict[str, Any] = {}
        self._reader = gevent.spawn(self._read)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        waiting.read_json_lines(self.proc.stdout, self.lines)

    def wait_ready(self, timeout: Optional[float] = None) -> dict[str, Any]:
        """The child's ``{"event": "ready", ...}`` line; fails the test if it exits first or
        prints none within ``timeout`` seconds (None: ``ready_timeout``)."""
        def ready() -> Optional[dict[str, Any]]:
            if self.proc.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.proc.returncode}: {self.lines[-5:]}")
            return next((line for line in self.lines if line.get("event") == "ready"), None)
        self.ready = waiting.poll_until(ready, timeout or self.ready_timeout, f"{self.name} ready",
                                        sleep=gevent.sleep, step=0.01)
        return self.ready

    def kill9(self) -> None:
        kill9(self.proc)

    def close(self) -> None:
        stop(self.proc)
        self._reader.kill(block=False)


C = TypeVar("C", bound=JsonChild)


def ready_children(make: Callable[..., C]) -> Iterator[Callable[..., C]]:
    """A fixture's body (``yield from``): the fixture's value starts a child with ``make``
    and waits until it is ready; every child started is closed when the test ends."""
    started: list[C] = []

    def start(*args: Any, **kwargs: Any) -> C:
        child = make(*args, **kwargs)
        started.append(child)
        child.wait_ready()
        return child

    try:
        yield start
    finally:
        for child in started:
            child.close()
