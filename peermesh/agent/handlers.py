"""Event handlers: run a command when the node reports an event, as Serf does.

``peermesh agent --handler [EVENTS=]COMMAND`` (repeatable) runs ``COMMAND``
with ``/bin/sh -c`` for each event that ``EVENTS`` selects (default: every
event but STOP). ``EVENTS`` is a comma-separated list of event names
(``ENTER``, ``EXIT``, ``JOIN``, ``LEAVE``, ``WHISPER``, ``SHOUT``, ``EVASIVE``,
``SILENT``, ``LEADER``, ``*`` for all); a name of an event that has a group
may carry one: ``SHOUT:alerts``, ``JOIN:web``.

What the command gets
---------------------
Environment (besides the agent's own): ``PEERMESH_EVENT`` (the name),
``PEERMESH_PEER_UUID`` (hex), ``PEERMESH_PEER_NAME``, ``PEERMESH_PEER_ADDRESS``,
``PEERMESH_GROUP``, ``PEERMESH_REASON``, ``PEERMESH_PEER_HEADERS`` (JSON
object), ``PEERMESH_FRAMES`` (count), ``PEERMESH_NODE_NAME``,
``PEERMESH_NODE_UUID``, and ``PEERMESH_AGENT`` (the agent's socket, so a
``peermesh`` command run by the handler reaches this agent); a field the event
does not have is an empty string.
The payload (a SHOUT's or WHISPER's frames, joined) comes on stdin. Values
come from remote peers: NUL characters are removed, and a variable longer than
``MAX_VARIABLE`` characters is cut there (``PEERMESH_PEER_HEADERS`` is left
empty rather than cut). A command must quote them as any untrusted input.

Bounds
------
Each handler has a queue of ``queue`` events (default ``QUEUE``, 1,000): an
event that finds it full is dropped and counted (``dropped``), so a burst
never grows memory and never waits. ``concurrency`` commands of one handler
run at once (default 1: in the order of the events; more run side by side and
may finish out of order). A command that runs longer than ``timeout``
seconds (default ``TIMEOUT``) gets SIGTERM, then SIGKILL ``KILL_GRACE``
seconds later, with every process of its session. Its output (stdout and
stderr together) is logged line by line at info, the first ``OUTPUT_LIMIT``
octets of each run (the rest is read and counted, not kept). A non-zero exit,
a timeout or a command that cannot start counts as failed and is logged at
warning, at most one line per period for each kind. ``submit`` only appends
to queues: the node is never held up by a handler.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from ..counters import Counters
from ..events import EventType

__all__ = ["HandlerSpec", "HandlerRunner", "parse_handler", "handler_environment",
           "EVENT_NAMES", "QUEUE", "TIMEOUT", "KILL_GRACE", "OUTPUT_LIMIT", "MAX_VARIABLE"]

log = logging.getLogger(__name__)

#: events a handler may select: the node's (but STOP) and LEADER (a group's leader changed)
EVENT_NAMES: tuple[str, ...] = tuple(
    dict.fromkeys([t.value for t in EventType if t is not EventType.STOP] + ["LEADER"]))
#: events that carry a group, so may be selected by one (``SHOUT:alerts``)
GROUP_EVENTS = frozenset({"JOIN", "LEAVE", "SHOUT", "LEADER"})
#: events queued per handler; more are dropped and counted
QUEUE = 1000
#: seconds a command may run before it is ended
TIMEOUT = 30.0
#: seconds between SIGTERM and SIGKILL for a command past its time
KILL_GRACE = 2.0
#: octets of one run's output that are logged
OUTPUT_LIMIT = 8192
#: longest environment value taken from an event, in characters
MAX_VARIABLE = 16384

# "ENTER,EXIT" or "SHOUT:alerts" before the first "=": a selection, not part of the command
_SELECTION = re.compile(r"^(?:\*|[A-Za-z]+(?::[^,=\s]+)?)(?:,(?:\*|[A-Za-z]+(?::[^,=\s]+)?))*$")


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One ``--handler``: which events (None: all) and the shell command."""

    command: str
    #: (event name, group or None) pairs; None selects every event
    selects: Optional[frozenset[tuple[str, Optional[str]]]] = None

    def matches(self, kind: str, group: Optional[str]) -> bool:
        """True when an event of type ``kind`` (its name) in ``group`` runs this handler."""
        if kind == "STOP":
            return False
        if self.selects is None:
            return True
        return (kind, None) in self.selects or (group is not None
                                                and (kind, group) in self.selects)

    def describe(self) -> str:
        """``EVENTS=COMMAND`` as given (for log lines)."""
        if self.selects is None:
            return self.command
        events = ",".join(sorted(f"{k}:{g}" if g else k for k, g in self.selects))
        return f"{events}={self.command}"


def parse_handler(text: str) -> HandlerSpec:
    """``[EVENTS=]COMMAND`` as a ``HandlerSpec``; ValueError (one line) when wrong.

    The part before the first ``=`` is a selection when it looks like one (names
    and ``name:group`` separated by commas, no spaces); a command that itself
    starts with ``NAME=`` (an environment assignment) is given after ``*=``.
    """
    head, sep, rest = text.partition("=")
    if not sep or not _SELECTION.match(head):
        if not text.strip():
            raise ValueError("a handler needs a command")
        return HandlerSpec(text)
    if not rest.strip():
        raise ValueError(f"handler {text!r} has events but no command")
    selects: set[tuple[str, Optional[str]]] = set()
    for item in head.split(","):
        if item == "*":
            return HandlerSpec(rest)
        name, colon, group = item.partition(":")
        name = name.upper()
        if name not in EVENT_NAMES:
            raise ValueError(f"unknown event {name!r} in handler {text[:60]!r} (known: "
                             f"{', '.join(EVENT_NAMES)}, *; a command starting with NAME=... "
                             "goes after '*=')")
        if colon and name not in GROUP_EVENTS:
            raise ValueError(f"{name} events have no group (only "
                             f"{', '.join(sorted(GROUP_EVENTS))} do): {item!r}")
        selects.add((name, group if colon else None))
    return HandlerSpec(rest, frozenset(selects))


def _clean(value: Optional[str]) -> str:
    """A remote string fit for the environment: no NUL, at most ``MAX_VARIABLE`` characters."""
    if not value:
        return ""
    return value.replace("\0", "")[:MAX_VARIABLE]


def handler_environment(event: Any, node_name: str = "", node_uuid: str = "") -> dict[str, str]:
    """The ``PEERMESH_*`` variables a handler gets for ``event`` (an ``Event``)."""
    headers = ""
    if event.headers:
        headers = json.dumps({_clean(k): _clean(v) for k, v in dict(event.headers).items()},
                             ensure_ascii=False).replace("\0", "")
        if len(headers) > MAX_VARIABLE:
            headers = ""
    return {
        "PEERMESH_EVENT": _kind(event),
        "PEERMESH_PEER_UUID": event.peer.hex if event.peer else "",
        "PEERMESH_PEER_NAME": _clean(event.name),
        "PEERMESH_PEER_ADDRESS": _clean(event.address),
        "PEERMESH_GROUP": _clean(event.group),
        "PEERMESH_REASON": _clean(event.reason),
        "PEERMESH_PEER_HEADERS": headers,
        "PEERMESH_FRAMES": str(len(event.frames or ())),
        "PEERMESH_NODE_NAME": _clean(node_name),
        "PEERMESH_NODE_UUID": node_uuid,
    }


def _kind(event: Any) -> str:
    """The event's type name (``EventType`` or any enum or string of a newer node)."""
    kind = event.type
    return str(getattr(kind, "value", kind))


class _Handler:
    """One spec's queue and the greenlets that run it."""

    __slots__ = ("spec", "queue", "workers", "running")

    def __init__(self, spec: HandlerSpec) -> None:
        self.spec = spec
        self.queue: deque[tuple[dict[str, str], bytes]] = deque()
        self.workers: list[Any] = []
        self.running = 0


class HandlerRunner:
    """Runs the handlers for a node's events on the gevent hub (see the module docstring).

    ``start()`` spawns the workers, ``submit(event)`` queues the event for every
    handler that selects it (never blocks), ``stats()`` gives the counters,
    ``close()`` ends the workers and any command still running.
    """

    def __init__(self, specs: list[HandlerSpec], *, concurrency: int = 1,
                 timeout: float = TIMEOUT, queue: int = QUEUE, node_name: str = "",
                 node_uuid: str = "", shell: str = "/bin/sh",
                 env: Optional[dict[str, str]] = None) -> None:
        if concurrency < 1 or queue < 1 or not timeout > 0:
            raise ValueError("handler concurrency and queue must be 1 or more, timeout > 0")
        self.concurrency = concurrency
        self.timeout = timeout
        self.limit = queue
        self.node_name = node_name
        self.node_uuid = node_uuid
        self.shell = shell
        #: variables every run gets (besides the agent's environment and the event's)
        self.env = dict(env or {})
        self._handlers = [_Handler(spec) for spec in specs]
        self._wakes: list[Any] = []
        self._closed = False
        #: started, succeeded, failed (non-zero exit), timed_out, not_started, dropped
        self.counters = Counters(log, "event handlers", ("started", "succeeded", "failed",
                                                         "timed_out", "not_started",
                                                         "dropped"))

    def start(self) -> "HandlerRunner":
        """Spawn ``concurrency`` workers per handler on the current hub."""
        import gevent
        import gevent.event

        for handler in self._handlers:
            wake = gevent.event.Event()
            self._wakes.append(wake)
            handler.workers = [gevent.spawn(self._work, handler, wake)
                               for _ in range(self.concurrency)]
        return self

    def submit(self, event: Any) -> int:
        """Queue ``event`` for each handler that selects it; how many took it."""
        if self._closed or not self._handlers:
            return 0
        kind = _kind(event)
        taken = 0
        env: Optional[dict[str, str]] = None
        for handler, wake in zip(self._handlers, self._wakes or [None] * len(self._handlers)):
            if not handler.spec.matches(kind, event.group):
                continue
            if len(handler.queue) >= self.limit:
                self.counters.over("dropped", f"handler {handler.spec.describe()[:80]!r} has "
                                   f"{self.limit} events waiting; a {kind} event was dropped")
                continue
            if env is None:
                env = handler_environment(event, self.node_name, self.node_uuid)
            handler.queue.append((env, b"".join(event.frames or ())))
            taken += 1
            if wake is not None:
                wake.set()
        return taken

    def stats(self) -> dict[str, Any]:
        """Counters, plus events queued and commands running now."""
        return {**self.counters.snapshot(),
                "queued": sum(len(h.queue) for h in self._handlers),
                "running": sum(h.running for h in self._handlers)}

    def close(self) -> None:
        """Stop the workers; commands still running are ended (SIGTERM, then SIGKILL)."""
        import gevent

        self._closed = True
        workers = [w for h in self._handlers for w in h.workers]
        gevent.killall(workers, timeout=KILL_GRACE + 1.0)
        for handler in self._handlers:
            handler.queue.clear()

    # --- running --------------------------------------------------------

    def _work(self, handler: _Handler, wake: Any) -> None:
        while not self._closed:
            if not handler.queue:
                wake.clear()
                wake.wait()
                continue
            env, payload = handler.queue.popleft()
            handler.running += 1
            try:
                self._run(handler.spec, env, payload)
            finally:
                handler.running -= 1

    def _run(self, spec: HandlerSpec, env: dict[str, str], payload: bytes) -> None:
        """Run the command once: feed stdin, log its output, end it past ``timeout``."""
        import subprocess

        import gevent

        what = f"handler {spec.describe()[:80]!r} ({env['PEERMESH_EVENT']})"
        try:
            # the standard library's Popen (vfork and exec) starts a command in a fraction
            # of the time gevent's fork of the whole process takes; the waits below are
            # cooperative all the same
            proc = subprocess.Popen([self.shell, "-c", spec.command], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    env={**os.environ, **self.env, **env},
                                    start_new_session=True)
        except (OSError, ValueError) as exc:
            self.counters.over("not_started", f"{what} could not start: {exc}")
            return
        self.counters.add("started")
        assert proc.stdin is not None and proc.stdout is not None
        feeder = gevent.spawn(_feed, proc.stdin.fileno(), payload, proc.stdin)
        output = bytearray()
        extra = 0
        timer = gevent.Timeout(self.timeout)
        timer.start()
        try:
            for chunk in _chunks(proc.stdout.fileno()):
                keep = max(0, OUTPUT_LIMIT - len(output))
                output += chunk[:keep]
                extra += len(chunk) - min(keep, len(chunk))
            status: Optional[int] = _wait(proc)
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            status = None
        except BaseException:   # killed by close(): end the command too
            _end(proc)
            raise
        finally:
            timer.close()
            feeder.kill()
            proc.stdout.close()
        _log_output(what, output, extra)
        if status is None:
            _end(proc)
            self.counters.over("timed_out", f"{what} ran past {self.timeout:g} s and "
                                            "was ended")
        elif status != 0:
            self.counters.over("failed", f"{what} exited with status {status}")
        else:
            self.counters.add("succeeded")


def _chunks(fd: int) -> Any:
    """What the command writes on ``fd``, as it comes, until it closes (cooperative)."""
    import gevent.os

    gevent.os.make_nonblocking(fd)
    while True:
        chunk = gevent.os.nb_read(fd, 65536)
        if not chunk:
            return
        yield chunk


def _wait(proc: Any) -> int:
    """The command's exit status, waiting on the hub (a pidfd where the kernel has them)."""
    import gevent
    import gevent.socket

    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):   # no pidfd: poll
        while proc.poll() is None:
            gevent.sleep(0.005)
        return int(proc.returncode)
    try:
        if proc.poll() is None:
            gevent.socket.wait_read(pidfd)
        return int(proc.wait())
    finally:
        os.close(pidfd)


def _feed(fd: int, payload: bytes, pipe: Any) -> None:
    """Write the payload to the command's stdin and close it (a command that does not read
    it is fine)."""
    import gevent.os

    try:
        gevent.os.make_nonblocking(fd)
        view = memoryview(payload)
        while view:
            view = view[gevent.os.nb_write(fd, view):]
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _end(proc: Any) -> None:
    """SIGTERM the command's session, SIGKILL it after ``KILL_GRACE``, reap the command."""
    import gevent

    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        with gevent.Timeout(KILL_GRACE, False):
            _wait(proc)
            # the shell may be gone while its children still run: kill them too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
    log.warning("handler process %d did not end after SIGKILL", proc.pid)


def _log_output(what: str, output: bytearray, extra: int) -> None:
    if not output:
        return
    for line in output.decode("utf-8", "replace").splitlines():
        log.info("%s: %s", what, line)
    if extra:
        log.info("%s: ... %d more octets of output not logged", what, extra)
