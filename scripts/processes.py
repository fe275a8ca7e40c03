"""Ending a process with everything it started, and waiting for processes to end.

A process whose helpers outlive it (Spark's JVM under a benchmark's role, Chromium's
renderers) keeps writing to directories its parent is about to remove. ``end_group``
ends a child started in a process group of its own (``process_group=0``) with every
process of that group; ``end_descendants`` ends what this process started, and theirs.
Each escalates from SIGTERM to SIGKILL and waits on pidfds (``os.pidfd_open``), which
become readable when a process ends, whether or not it is this one's child: no polling.
Linux only (``/proc``, pidfds).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["end_descendants", "end_group", "wait_gone"]


def _running() -> Iterator[tuple[int, int, int]]:
    """``(pid, parent pid, process group)`` of every process that runs (not a zombie)."""
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                state, ppid, pgrp = f.read().rsplit(b")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state not in (b"Z", b"X"):
            yield int(entry), int(ppid), int(pgrp)


def group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that still run."""
    return [pid for pid, _, pgrp in _running() if pgrp == pgid]


def descendants(root: int) -> list[int]:
    """The processes that ``root`` started, and theirs, that still run."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _ in _running():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def wait_gone(pids: Iterable[int], timeout: float) -> bool:
    """Whether every process of ``pids`` has ended within ``timeout`` seconds."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for fd in select.select(fds, [], [], left)[0]:
                fds.remove(fd)
                os.close(fd)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _all_end_within(members: Callable[[], list[int]], timeout: float) -> bool:
    """Whether ``members()`` is empty within ``timeout`` seconds (asked again after each
    wait: a member may have started another meanwhile)."""
    deadline = time.monotonic() + timeout
    while pids := members():
        if not wait_gone(pids, deadline - time.monotonic()):
            return False
    return True


def _escalate(members: Callable[[], list[int]], signal_all: Callable[[int], None],
              grace: float, term_wait: float, kill_wait: float) -> None:
    for sig, wait in ((None, grace), (signal.SIGTERM, term_wait), (signal.SIGKILL, kill_wait)):
        if sig is not None:
            signal_all(sig)
        if _all_end_within(members, wait):
            return


def end_group(proc: subprocess.Popen[Any], grace: float = 0.0, term_wait: float = 3.0,
              kill_wait: float = 5.0) -> None:
    """End ``proc`` (started with ``process_group=0``) and every process of its group: let
    them end by themselves for ``grace`` seconds, then SIGTERM and ``term_wait`` seconds,
    then SIGKILL and ``kill_wait``; ``proc`` is reaped."""
    def signal_all(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    _escalate(lambda: group(proc.pid), signal_all, grace, term_wait, kill_wait)
    try:
        proc.wait(kill_wait)
    except subprocess.TimeoutExpired:
        pass


def end_descendants(term_wait: float = 3.0, kill_wait: float = 5.0) -> None:
    """End every process this one started and theirs (the JVM of a Spark session made in
    this process, its Python workers): SIGTERM, ``term_wait`` seconds, then SIGKILL."""
    def signal_all(sig: int) -> None:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    _escalate(lambda: descendants(os.getpid()), signal_all, 0.0, term_wait, kill_wait)
