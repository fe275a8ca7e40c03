"""Running the ``peermesh`` command as real processes on loopback, for the CLI and agent tests.

Output is read line by line with deadlines; every process is killed by its
owner's finaliser, also when a test fails.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time

import pytest
from typing import Any, Callable, Optional

PEERMESH = [sys.executable, "-m", "peermesh"]
WAIT = 10.0  # upper bound for anything that normally takes milliseconds
STARTED = re.compile(r"^peermesh: (.*) \(([0-9a-f]{32})\) at (tcp://\S+), groups: ")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}
    env["PYTHONIOENCODING"] = "utf-8"
    return env


class CliProcess:
    """A long-running ``peermesh`` process whose output lines are read by threads."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.popen = subprocess.Popen([*PEERMESH, *args], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=_env())
        self.out: list[str] = []
        self.err: list[str] = []
        self._queues: dict[str, queue.Queue[Optional[str]]] = {"out": queue.Queue(),
                                                                "err": queue.Queue()}
        self._pending: dict[str, list[str]] = {"out": [], "err": []}
        self._readers = [threading.Thread(target=self._read, args=(pipe, key), daemon=True)
                         for pipe, key in ((self.popen.stdout, "out"), (self.popen.stderr, "err"))]
        for reader in self._readers:
            reader.start()

    def _read(self, pipe: Any, key: str) -> None:
        seen = self.out if key == "out" else self.err
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            seen.append(line)
            self._queues[key].put(line)
        self._queues[key].put(None)

    def describe(self) -> str:
        out, err = "\n".join(self.out), "\n".join(self.err)
        return (f"peermesh {' '.join(self.args)} (exit {self.popen.poll()})\n"
                f"--- stdout\n{out}\n--- stderr\n{err}")

    def expect_line(self, pred: Callable[[str], bool], what: str, stream: str = "out",
                    timeout: float = WAIT) -> str:
        """The first line of ``stream`` not yet taken for which ``pred`` holds.

        Lines that do not match stay available to later calls, so the order
        of unrelated events does not matter.
        """
        deadline = time.monotonic() + timeout
        pending = self._pending[stream]
        for i, line in enumerate(pending):
            if pred(line):
                del pending[i]
                return line
        lines = self._queues[stream]
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = lines.get(timeout=max(remaining, 0.001))
            except queue.Empty:
                pytest.fail(f"no {what} within {timeout} s from {self.describe()}")
            if line is None:
                lines.put(None)  # keep reporting end of output
                pytest.fail(f"output ended before {what} from {self.describe()}")
            if pred(line):
                return line
            pending.append(line)

    def expect_event(self, timeout: float = WAIT, **fields: Any) -> dict[str, Any]:
        """The next JSON event line whose fields include ``fields``."""
        def matches(line: str) -> bool:
            event = json.loads(line)
            return all(event.get(k) == v for k, v in fields.items())
        return json.loads(self.expect_line(matches, f"event {fields}", timeout=timeout))

    def started(self) -> tuple[str, str]:
        """Wait for the start-up line on stderr: (name, uuid hex)."""
        line = self.expect_line(lambda s: STARTED.match(s) is not None, "start-up line", "err")
        match = STARTED.match(line)
        assert match is not None
        return match.group(1), match.group(2)

    def stop(self, signum: int, timeout: float = WAIT) -> int:
        """Send ``signum``; the exit code (fails if the process outlives ``timeout``)."""
        self.popen.send_signal(signum)
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {timeout} s after signal {signum}: {self.describe()}")
        for reader in self._readers:
            reader.join(WAIT)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(WAIT)
        for reader in self._readers:
            reader.join(WAIT)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()


class Cli:
    """Starts ``peermesh`` processes that share one loopback beacon port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.net = ["--interface", "lo", "--port", str(port), "--interval", "0.1"]
        self.processes: list[CliProcess] = []

    def start(self, *args: str) -> CliProcess:
        """A long-running command (``run``), killed at the end of the test."""
        process = CliProcess([*args, *self.net])
        self.processes.append(process)
        return process

    def call(self, *args: str, net: bool = True,
             timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """A short-lived command, run to completion (killed after ``timeout``)."""
        result = subprocess.run([*PEERMESH, *args, *(self.net if net else [])],
                                stdin=subprocess.DEVNULL, capture_output=True, env=_env(),
                                timeout=timeout, encoding="utf-8", errors="replace")
        assert "Traceback" not in result.stderr, result.stderr
        return result

    def close(self) -> None:
        for process in self.processes:
            process.kill()


def _report(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
