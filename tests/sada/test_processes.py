"""Channels in this process, servers in child processes (``sadachild.py``) on loopback.

The ``work``/``run`` action of a child appends one line per execution to
``runs-<name>.log``, so a test can tell how often each request ran, also on
a server that was SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import gevent
import gevent.event

from peermesh.sada import ServerLost

from .conftest import PING, WAIT, Child, Loopback, wait_until


def runs(log_dir: Path) -> dict[int, list[str]]:
    """Request key -> the servers that ran it, from every child's log."""
    result: dict[int, list[str]] = {}
    for path in log_dir.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            name, key = line.split()
            result.setdefault(int(key), []).append(name)
    return result


class Load:
    """``window`` requests to work/run in flight until ``n`` were sent, from this process."""

    def __init__(self, channel: Any, n: int, window: int, retries: int, ms: int = 2) -> None:
        self.channel, self.n, self.retries, self.ms = channel, n, retries, ms
        self.outcomes: dict[int, Any] = {}
        self.answers = 0
        self.duplicates = 0
        self.sent = 0
        self.done = gevent.event.Event()
        for _ in range(min(window, n)):
            self._send()

    def _send(self) -> None:
        key = self.sent
        self.sent += 1
        result = self.channel.request_async("work", "run", {"key": key, "ms": self.ms},
                                            retries=self.retries, timeout=5.0)
        result.rawlink(lambda r: self._answered(key, r))

    def _answered(self, key: int, result: Any) -> None:
        if key in self.outcomes:
            self.duplicates += 1
        self.outcomes[key] = result.value if result.successful() else result.exception
        self.answers += 1
        if self.answers >= self.n:
            self.done.set()
        elif self.sent < self.n:
            self._send()


def servers(children: Callable[..., Child], channel: Any, names: list[str], log_dir: Path,
            **cfg: Any) -> list[Child]:
    started = [children("server", name=name, channels=[channel.endpoint],
                        log_dir=str(log_dir), **cfg) for name in names]
    assert channel.wait_for("work", count=len(names), timeout=WAIT)
    return started


def kill_holding(victim: Child, victim_id: str, channel: Any, load: Load) -> None:
    """SIGKILL ``victim`` while it surely holds requests of ``load``.

    It is stopped first, so it cannot answer what the channel sends it from
    then on; the kill waits until the other servers answered 20 more (by then
    any answer it sent before the stop has been read) and it still holds some,
    or until the channel already dropped it as silent.
    """
    os.kill(victim.proc.pid, signal.SIGSTOP)
    mark = load.answers
    wait_until(lambda: load.answers >= mark + 20 and (
        any(s.id == victim_id and s.in_flight for s in channel.servers())
        or channel.stats["servers_dropped"]), WAIT, "the stopped victim holding requests")
    victim.kill9()


def test_request_reply_across_processes(loop: Loopback, children: Callable[..., Child],
                                        tmp_path: Path) -> None:
    channel = loop.channel()
    a, b = servers(children, channel, ["pa", "pb"], tmp_path)
    pids = {channel.request("echo", "info", server=s.id)["pid"] for s in channel.servers()}
    assert pids == {a.ready["pid"], b.ready["pid"]}
    assert channel.request("echo", "echo", {"big": b"x" * 300_000})["big"] == b"x" * 300_000
    load = Load(channel, 400, 32, retries=0, ms=1)
    assert load.done.wait(WAIT)
    assert all(load.outcomes[k] == {"server": load.outcomes[k]["server"], "key": k}
               for k in range(400))
    assert {v["server"] for v in load.outcomes.values()} == {"pa", "pb"}
    assert sum(len(v) for v in runs(tmp_path).values()) == 400


def test_sigkill_mid_load_fails_over_every_request(loop: Loopback,
                                                   children: Callable[..., Child],
                                                   tmp_path: Path) -> None:
    channel = loop.channel()
    victim, *others = servers(children, channel, ["k1", "k2", "k3"], tmp_path)
    (victim_id,) = [s.id for s in channel.servers()
                    if channel.request("echo", "info", server=s.id)["pid"] == victim.ready["pid"]]
    load = Load(channel, 600, 24, retries=1, ms=10)
    wait_until(lambda: load.answers >= 150, WAIT, "150 answers before the kill")
    kill_holding(victim, victim_id, channel, load)
    killed = time.monotonic()
    assert load.done.wait(10), f"{load.answers} of 600 answered"
    # every request answered exactly once, and correctly
    assert load.duplicates == 0 and len(load.outcomes) == 600
    failed = {k: v for k, v in load.outcomes.items() if isinstance(v, BaseException)}
    assert not failed, failed
    assert all(v["key"] == k for k, v in load.outcomes.items())
    assert any(v["server"] == "k1" for v in load.outcomes.values())
    # only what the victim held can have run twice, and the others took over
    ran = runs(tmp_path)
    assert set(ran) == set(range(600))
    twice = [k for k, names in ran.items() if len(names) > 1]
    assert len(twice) <= 24 and all(ran[k][0] == "k1" for k in twice)
    assert channel.stats["failovers"] >= 1 and channel.stats["servers_dropped"] == 1
    assert len(channel.servers()) == 2
    assert time.monotonic() - killed < 5


def test_sigkill_without_retries_fails_clearly(loop: Loopback, children: Callable[..., Child],
                                               tmp_path: Path) -> None:
    channel = loop.channel()
    victim, _ = servers(children, channel, ["n1", "n2"], tmp_path)
    (victim_id,) = [s.id for s in channel.servers()
                    if channel.request("echo", "info", server=s.id)["pid"] == victim.ready["pid"]]
    load = Load(channel, 300, 16, retries=0, ms=10)
    wait_until(lambda: load.answers >= 60, WAIT, "60 answers before the kill")
    kill_holding(victim, victim_id, channel, load)
    assert load.done.wait(10), f"{load.answers} of 300 answered"
    assert load.duplicates == 0 and len(load.outcomes) == 300
    lost = [v for v in load.outcomes.values() if isinstance(v, BaseException)]
    assert 1 <= len(lost) <= 16
    assert all(isinstance(e, ServerLost) and "no retries allowed" in str(e) for e in lost)
    assert all(v["key"] == k for k, v in load.outcomes.items() if isinstance(v, dict))


def test_channel_restart_across_processes(loop: Loopback, children: Callable[..., Child],
                                          tmp_path: Path, free_tcp_port: int) -> None:
    endpoint = f"tcp://127.0.0.1:{free_tcp_port}"
    first = loop.channel(endpoint=endpoint)
    children("server", name="r1", channels=[endpoint], log_dir=str(tmp_path))
    assert first.wait_for("echo", timeout=WAIT)
    assert first.request("echo", "echo", 1) == 1
    first.stop()
    second = loop.channel(endpoint=endpoint)
    started = time.monotonic()
    assert second.wait_for("echo", timeout=WAIT)        # the server INTRs again on reconnect
    assert time.monotonic() - started < 2
    assert second.request("echo", "echo", 2) == 2
    assert second.stats["dropped"] == 0


def test_child_channel_on_the_mesh(children: Callable[..., Child], tmp_path: Path,
                                   free_udp_port: int) -> None:
    """Both ends in children, discovering each other through HELLO headers on lo."""
    mesh = dict(interface="lo", port=free_udp_port, interval=0.05)
    channel = children("channel", name="c", ping_interval=PING, **mesh)
    children("server", name="m1", log_dir=str(tmp_path), **mesh)
    children("server", name="m2", log_dir=str(tmp_path), **mesh)
    assert channel.call("wait", service="work", count=2, timeout=WAIT) is True
    assert channel.call("call", service="echo", action="echo", payload=[1, "two"]) == [1, "two"]
    since = channel.mark()
    channel.send("load", n=100, window=8)
    report = channel.wait(lambda e: e.get("event") == "LOAD", 10, since)
    assert report["ok"] == 100 and report["duplicates"] == 0 and not report["errors"]
    assert set(report["servers"]) == {"m1", "m2"}
