"""Mesh members that run inside simulated LAN hosts, driven over stdin/stdout.

This file is two things:

* **a script**, run inside a host's namespace (``python lanpeers.py KIND
  CONFIG_JSON``), that starts one mesh node and speaks line-based JSON:
  commands in on stdin (``{"op": "shout", "group": "chat", "msg": "hi",
  "id": 3}``), events out on stdout, one JSON object per line. ``KIND`` is

  - ``green``: a ``peermesh.Node`` on the gevent hub of the main thread;
  - ``threaded``: a ``peermesh.ThreadedNode`` used from plain threads;
  - ``pyre``: a ``pyre.Pyre`` node (zeromq-pyre), a real third-party peer;
  - ``raw``: no node at all, a hand-made ZRE endpoint used to look at the
    wire (see ``_run_raw``).

  The first line is ``{"event": "READY", ...}`` with the node's uuid, name
  and endpoint (peermesh kinds add the chosen interface). Every command is
  answered by ``{"event": "OK", "id": ..., "result": ...}`` or ``{"event":
  "ERROR", "id": ..., "error": ...}``. Node events use ``Event.to_dict()``
  (peermesh) or the same shape built from ``PyreEvent`` (pyre). ``stop``
  stops the node gracefully and ends the process; so does end of input.

* **a library** for the tests (``Fleet``, ``Driver``, ``JsonLines``,
  ``match``): it starts the script in a host with ``Host.popen``, reads
  stdout in a thread into a ``queue.Queue`` and offers waits that always
  have a deadline. ``JsonLines`` also reads ``peermesh run --json``.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from typing import Any, Callable, Iterable, Optional

SCRIPT = os.path.abspath(__file__)

#: seconds allowed for anything that should happen at once on the LAN
WAIT = 5.0
#: seconds allowed for a driver process to start (imports, bind, first beacon)
START_WAIT = 15.0


# ==========================================================================
# The script side (runs inside a namespace)


class _Out:
    """Thread-safe JSON-lines writer on stdout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stream = sys.stdout

    def __call__(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, ensure_ascii=False)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def _frames(cmd: dict[str, Any]) -> list[bytes]:
    if "frames" in cmd:
        return [f.encode("utf-8") for f in cmd["frames"]]
    return [cmd["msg"].encode("utf-8")]


def _node_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("groups", "contest", "headers", "interface", "port", "interval", "evasive",
            "silent", "expired", "send_timeout")
    return {k: cfg[k] for k in keys if cfg.get(k) is not None}


def _peermesh_command(node: Any, cmd: dict[str, Any]) -> Any:
    op = cmd["op"]
    if op == "join":
        return node.join(cmd["group"])
    if op == "leave":
        return node.leave(cmd["group"])
    if op == "shout":
        return node.shout(cmd["group"], *_frames(cmd))
    if op == "whisper":
        return node.whisper(cmd["peer"], *_frames(cmd))
    if op == "peers":
        return [node.peer_info(p).to_dict() for p in node.peers()]
    if op == "groups":
        return node.groups()
    if op == "flush":
        return node.flush(cmd.get("seconds", 1.0))
    if op == "contest":
        return node.contest(cmd["group"])
    if op == "leader":
        leader = node.leader(cmd["group"])
        return leader.hex if leader is not None else None
    raise ValueError(f"unknown op {op!r}")


def _ready_line(node: Any) -> dict[str, Any]:
    itf = node.interface
    line = {"event": "READY", "uuid": node.uuid.hex, "name": node.name,
            "endpoint": node.endpoint, "pid": os.getpid()}
    if itf is not None:
        line.update(interface=itf.name, address=itf.address, broadcast=itf.broadcast)
    return line


def _answer(out: _Out, cmd: dict[str, Any], call: Callable[[], Any]) -> None:
    try:
        result = call()
    except Exception as exc:  # reported to the test, which decides
        out({"event": "ERROR", "id": cmd.get("id"), "op": cmd.get("op"),
             "error": f"{type(exc).__name__}: {exc}"})
    else:
        out({"event": "OK", "id": cmd.get("id"), "op": cmd.get("op"), "result": result})


def _run_green(cfg: dict[str, Any]) -> None:
    import gevent
    from gevent.fileobject import FileObjectPosix

    from peermesh import Node

    out = _Out()
    node = Node(cfg.get("name"), **_node_settings(cfg)).start()
    out(_ready_line(node))

    def pump() -> None:
        for event in node.events():
            out(event.to_dict())

    pumper = gevent.spawn(pump)
    stdin = FileObjectPosix(sys.stdin.fileno(), "rb", close=False)
    for raw in stdin:
        cmd = json.loads(raw)
        if cmd["op"] == "stop":
            break
        _answer(out, cmd, lambda: _peermesh_command(node, cmd))
    node.stop()
    pumper.join(WAIT)
    out({"event": "EXITING"})


def _run_threaded(cfg: dict[str, Any]) -> None:
    from peermesh import ThreadedNode

    out = _Out()
    node = ThreadedNode(cfg.get("name"), **_node_settings(cfg)).start()
    out(_ready_line(node))

    def pump() -> None:
        for event in node.events():
            out(event.to_dict())

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()
    for raw in sys.stdin:
        cmd = json.loads(raw)
        if cmd["op"] == "stop":
            break
        _answer(out, cmd, lambda: _peermesh_command(node, cmd))
    node.stop()
    pumper.join(WAIT)
    out({"event": "EXITING"})


def _pyre_event(event: Any) -> dict[str, Any]:
    frames = []
    for frame in event.msg or ():
        try:
            frames.append({"text": frame.decode("utf-8")})
        except UnicodeDecodeError:
            frames.append({"hex": frame.hex()})
    message = None
    if frames and all("text" in f for f in frames):
        message = "".join(f["text"] for f in frames)
    return {"event": event.type, "peer": event.peer_uuid.hex, "name": event.peer_name,
            "group": event.group, "headers": event.headers, "address": event.peer_addr,
            "frames": frames, "message": message}


def _run_pyre(cfg: dict[str, Any]) -> None:
    import uuid

    import zmq
    from pyre import Pyre
    from pyre.pyre_event import PyreEvent

    out = _Out()
    if cfg.get("mailbox_port"):  # at a given port, as Zyre (the first free from 49152)
        port = int(cfg["mailbox_port"])

        def bind_at(sock: Any, address: str, *args: Any, **kwargs: Any) -> int:
            sock.bind(f"{address}:{port}")
            return port

        zmq.Socket.bind_to_random_port = bind_at  # type: ignore[method-assign]
    node = Pyre(cfg.get("name"))
    for key, value in (cfg.get("headers") or {}).items():
        node.set_header(key, value)
    for group in cfg.get("groups") or ():
        node.join(group)
    node.start()
    out({"event": "READY", "uuid": node.uuid().hex, "name": node.name(),
         "endpoint": node.endpoint(), "pid": os.getpid()})

    def command(cmd: dict[str, Any]) -> Any:
        op = cmd["op"]
        if op == "join":
            return node.join(cmd["group"])
        if op == "leave":
            return node.leave(cmd["group"])
        if op == "shout":
            return node.shout(cmd["group"], _frames(cmd))
        if op == "whisper":
            return node.whisper(uuid.UUID(cmd["peer"]), _frames(cmd))
        if op == "peers":
            return [{"peer": p.hex, "address": node.peer_address(p),
                     "headers": node.peer_headers(p)} for p in node.peers()]
        if op == "known":  # every peer in its table, ready or not (found by beacon)
            return sorted(p.hex for p in node.peers())
        if op == "groups":
            return sorted(node.own_groups())
        raise ValueError(f"unknown op {op!r}")

    inbox = node.socket()
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    pending = b""
    running = True
    try:
        while running:
            ready = dict(poller.poll(500))
            while inbox.get(zmq.EVENTS) & zmq.POLLIN:
                out(_pyre_event(PyreEvent(node)))
            if sys.stdin.fileno() not in ready:
                continue
            data = os.read(sys.stdin.fileno(), 65536)
            if not data:
                break
            pending += data
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                cmd = json.loads(raw)
                if cmd["op"] == "stop":
                    running = False
                    break
                _answer(out, cmd, lambda: command(cmd))
    finally:
        node.stop()  # pyre hangs the process without it
        out({"event": "EXITING"})
        sys.stdout.flush()
        os._exit(0)  # pyre's context and threads may otherwise keep the process alive


def _run_raw(cfg: dict[str, Any]) -> None:
    """A bare ZRE endpoint for looking at what a peermesh node puts on the wire.

    Listens for beacons on UDP ``cfg["port"]`` (``{"event": "BEACON",
    "source": ip, "uuid": hex, "port": n}`` per valid beacon) and binds a
    ROUTER on ``cfg["bind"]``; then broadcasts one beacon for a made-up UUID
    pointing at that ROUTER to ``cfg["broadcast"]``, at once and then every
    0.2 s. Every mailbox message
    is printed decoded (``{"event": "RAW", "identity": hex, "command":
    "HELLO", "endpoint": ..., ...}``).
    """
    import socket
    import uuid

    import zmq

    from peermesh.errors import ProtocolError
    from peermesh.wire import zre

    out = _Out()
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port(f"tcp://{cfg['bind']}", 0xC000, 0xFFFF)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    udp.bind(("", cfg["port"]))
    me = uuid.uuid4()
    out({"event": "READY", "uuid": me.hex, "name": "raw",
         "endpoint": f"tcp://{cfg['bind']}:{port}", "pid": os.getpid()})
    beacon = zre.encode_beacon(zre.Beacon(me.bytes, port))
    beacon_at = time.monotonic()
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(udp, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        if time.monotonic() >= beacon_at:
            udp.sendto(beacon, (cfg["broadcast"], cfg["port"]))
            beacon_at = time.monotonic() + 0.2
        ready = dict(poller.poll(max(0, int((beacon_at - time.monotonic()) * 1000))))
        if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 65536):
            break
        if udp.fileno() in ready:
            data, (source, _) = udp.recvfrom(256)
            try:
                heard = zre.decode_beacon(data)
            except ProtocolError:
                pass
            else:
                if heard.uuid != me.bytes:
                    out({"event": "BEACON", "source": source, "uuid": heard.uuid.hex(),
                         "port": heard.port})
        while router.get(zmq.EVENTS) & zmq.POLLIN:
            identity, *frames = router.recv_multipart()
            line: dict[str, Any] = {"event": "RAW", "identity": identity.hex()}
            try:
                message = zre.decode(frames)
            except ProtocolError as exc:
                line["error"] = exc.reason
            else:
                line["command"] = type(message).__name__.upper()
                line["sequence"] = message.sequence
                if isinstance(message, zre.Hello):
                    line.update(endpoint=message.endpoint, name=message.name,
                                groups=list(message.groups), headers=dict(message.headers))
            out(line)
    out({"event": "EXITING"})
    sys.stdout.flush()
    os._exit(0)


def main(argv: list[str]) -> None:
    kind, cfg = argv[1], json.loads(argv[2])
    {"green": _run_green, "threaded": _run_threaded, "pyre": _run_pyre,
     "raw": _run_raw}[kind](cfg)


# ==========================================================================
# The test side


def match(event: Optional[str] = None, **fields: Any) -> Callable[[dict[str, Any]], bool]:
    """A predicate: the event has type ``event`` and these field values."""

    def pred(e: dict[str, Any]) -> bool:
        if event is not None and e.get("event") != event:
            return False
        return all(e.get(k) == v for k, v in fields.items())

    pred.__doc__ = f"{event or '*'} {fields}"
    return pred


class DriverError(AssertionError):
    """A child did not report what a test waited for in time, or a command failed."""


class JsonLines:
    """A child process that prints one JSON object per line on stdout.

    ``events`` holds every line read so far (as dicts), in order; a line
    that is not JSON becomes ``{"event": "GARBAGE", "line": ...}``. A reader
    thread puts lines on a ``queue.Queue``; waits take them with
    ``Queue.get(timeout)`` and so always end by their deadline, failing with
    the recent history and the child's stderr.
    """

    def __init__(self, proc: Any, label: str) -> None:
        self.proc = proc
        self.label = label
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._queue: "queue.Queue[Optional[dict[str, Any]]]" = queue.Queue()
        self._eof = False
        threading.Thread(target=self._read_stdout, daemon=True).start()
        if proc.stderr is not None:
            threading.Thread(target=self._read_stderr, daemon=True).start()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                item = json.loads(raw)
                if not isinstance(item, dict):
                    raise ValueError
            except ValueError:
                item = {"event": "GARBAGE", "line": raw.decode("utf-8", "replace").rstrip()}
            self._queue.put(item)
        self._queue.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.stderr.append(raw.decode("utf-8", "replace").rstrip())

    def _pull(self, timeout: float) -> bool:
        """Move one line from the queue to ``events``; False if none came in time."""
        if self._eof:
            return False
        try:
            item = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return False
        if item is None:
            self._eof = True
            return False
        self.events.append(item)
        return True

    def mark(self) -> int:
        """Take in every line already printed; returns ``len(events)`` (for ``since``)."""
        while self._pull(0):
            pass
        return len(self.events)

    def find(self, pred: Callable[[dict[str, Any]], bool], since: int = 0) -> list[dict[str, Any]]:
        """Events from index ``since`` on that match ``pred`` (without waiting)."""
        self.mark()
        return [e for e in self.events[since:] if pred(e)]

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float = WAIT,
             since: int = 0, what: str = "") -> dict[str, Any]:
        """The first event from index ``since`` on matching ``pred``, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        index = since
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if pred(event):
                    return event
            left = deadline - time.monotonic()
            if left <= 0 or (not self._pull(left) and self._eof):
                self.fail(f"no {what or pred.__doc__ or 'matching event'} within {timeout} s"
                          + (" (the child closed its output)" if self._eof else ""))

    def wait_count(self, pred: Callable[[dict[str, Any]], bool], count: int,
                   timeout: float = WAIT, since: int = 0) -> list[dict[str, Any]]:
        """The first ``count`` events from ``since`` on matching ``pred``, within ``timeout``."""
        deadline = time.monotonic() + timeout
        found: list[dict[str, Any]] = []
        index = since
        while len(found) < count:
            left = max(0.0, deadline - time.monotonic())
            event = self.wait(pred, left, index, what=f"{pred.__doc__} (#{len(found) + 1} "
                              f"of {count})")
            found.append(event)
            index = self.events.index(event, index) + 1
        return found

    def wait_all(self, preds: Iterable[Callable[[dict[str, Any]], bool]],
                 timeout: float = WAIT, since: int = 0) -> list[dict[str, Any]]:
        """One event for each predicate (any order), all within one deadline."""
        deadline = time.monotonic() + timeout
        return [self.wait(p, max(0.0, deadline - time.monotonic()), since) for p in preds]

    def fail(self, why: str) -> None:
        state = "running" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        history = "\n  ".join(json.dumps(e, ensure_ascii=False) for e in self.events[-40:])
        err = "\n  ".join(self.stderr[-30:])
        raise DriverError(f"{self.label} ({state}): {why}\n events:\n  {history}\n"
                          f" stderr:\n  {err}")

    def end(self, timeout: float = WAIT) -> int:
        """Wait for the child to exit (bounded) and for its output to be read; its return code."""
        import subprocess

        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.fail(f"still running after {timeout} s")
        deadline = time.monotonic() + timeout
        while not self._eof and time.monotonic() < deadline:
            self._pull(deadline - time.monotonic())
        return int(code)

    def kill(self) -> None:
        """Kill the child if it still runs (bounded wait)."""
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(3.0)
            except Exception:
                pass


class Commanded(JsonLines):
    """A child that takes JSON commands on stdin (``{"op", "id", ...}``) and answers each
    with an ``OK`` or ``ERROR`` line of the same id."""

    def __init__(self, proc: Any, label: str) -> None:
        super().__init__(proc, label)
        self._ids = 0

    def send(self, op: str, **args: Any) -> int:
        """Send one command without waiting for its answer; returns its id."""
        self._ids += 1
        line = json.dumps({"op": op, "id": self._ids, **args}, ensure_ascii=False) + "\n"
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode("utf-8"))
        self.proc.stdin.flush()
        return self._ids

    def call(self, op: str, timeout: float = WAIT, **args: Any) -> Any:
        """Send one command and return its result; DriverError on ERROR or no answer."""
        since = self.mark()
        ident = self.send(op, **args)
        reply = self.wait(lambda e: e.get("event") in ("OK", "ERROR") and e.get("id") == ident,
                          timeout, since, what=f"answer to {op}")
        if reply["event"] == "ERROR":
            raise DriverError(f"{self.label}: {op} {args} failed: {reply['error']}")
        return reply["result"]


class Driver(Commanded):
    """One mesh node in one host: this file run as a script there (see the top)."""

    def __init__(self, host: Any, kind: str, config: Optional[dict[str, Any]] = None,
                 *, env: Optional[dict[str, Optional[str]]] = None) -> None:
        import subprocess

        self.host = host
        self.kind = kind
        self.config = dict(config or {})
        proc = host.popen([sys.executable, SCRIPT, kind, json.dumps(self.config)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env)
        super().__init__(proc, f"{kind}:{self.config.get('name') or '?'}@{host.address}")
        self._closed = False
        try:
            self.ready = self.wait(match("READY"), START_WAIT)
        except BaseException:
            self.kill()
            raise
        self.uuid: str = self.ready["uuid"]
        self.name: str = self.ready["name"]
        self.endpoint: str = self.ready["endpoint"]

    def begin_stop(self) -> int:
        """Ask the node to stop gracefully, without waiting; returns a mark for ``stop``."""
        since = self.mark()
        if self.proc.poll() is None:
            try:
                self.send("stop")
            except OSError:
                pass
        return since

    def stop(self, timeout: float = WAIT, since: Optional[int] = None) -> None:
        """Stop the node gracefully (unless ``begin_stop`` did) and wait, bounded, for the end."""
        if since is None:
            since = self.begin_stop()
        self.wait(match("EXITING"), timeout, since, what="EXITING after stop")
        self.end(timeout)
        self._closed = True

    def close(self) -> None:
        """Finaliser: end of input makes the driver stop its node; kill if that takes long."""
        if self._closed:
            return
        self._closed = True
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(3.0)
            except Exception:
                self.kill()


class Fleet:
    """Starts drivers and closes them all (gracefully, bounded) at the end of a test."""

    def __init__(self) -> None:
        self.drivers: list[Driver] = []

    def start(self, host: Any, kind: str = "green", *,
              env: Optional[dict[str, Optional[str]]] = None, **config: Any) -> Driver:
        """A ``Driver`` of ``kind`` in ``host``; ``config`` holds node settings.

        ``PEERMESH_*`` variables of the test run are removed from the child's
        environment (so the default interface really is the default) unless
        ``env`` sets them.
        """
        base: dict[str, Optional[str]] = {k: None for k in os.environ if k.startswith("PEERMESH_")}
        base.update(env or {})
        driver = Driver(host, kind, config, env=base)
        self.drivers.append(driver)
        return driver

    def close(self) -> None:
        for driver in reversed(self.drivers):
            driver.close()


def udp_port_bound(pid: int, port: int) -> bool:
    """True when some socket in the network namespace of ``pid`` is bound to UDP ``port``."""
    try:
        with open(f"/proc/{pid}/net/udp") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return False
    wanted = f":{port:04X}"
    return any(line.split()[1].endswith(wanted) for line in lines if len(line.split()) > 1)


if __name__ == "__main__":
    main(sys.argv)
